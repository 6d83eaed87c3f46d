//! OpenAI-style errors: every failure a client sees is a 4xx/5xx status with
//! `{"error": {"message", "type", "param", "code"}}`, so OpenAI clients raise their
//! usual exceptions (`BadRequestError`, `AuthenticationError`, …) with our message.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// One error as the API returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's error family: `invalid_request_error`, `authentication_error`,
    /// `not_found_error`, `server_error`.
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, …).
    pub code: Option<&'static str>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// 400 about the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// 400 about one field.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.to_string()), code: Some("invalid_value"), ..ApiError::bad_request(message) }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid API key (send `Authorization: Bearer <key>` with the key the server was started with)"
                .into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    pub fn model_not_found(asked: &str, loaded: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("the model `{asked}` does not exist; this server serves `{loaded}`"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    pub fn not_found(path: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("no route for {path}"),
            kind: "not_found_error",
            param: None,
            code: None,
        }
    }

    /// A request whose prompt (plus requested completion) cannot fit the context.
    pub fn context_exceeded(message: String, param: &str) -> ApiError {
        ApiError {
            param: Some(param.into()),
            code: Some("context_length_exceeded"),
            ..ApiError::bad_request(message)
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// Any other status (body limits, wrong methods) with its reason as the message.
    pub fn with_status(status: StatusCode, message: impl Into<String>) -> ApiError {
        let kind = if status.is_server_error() { "server_error" } else { "invalid_request_error" };
        ApiError { status, message: message.into(), kind, param: None, code: None }
    }

    /// The JSON body (also used inside an SSE stream when a failure comes mid-stream).
    pub fn body_json(&self) -> String {
        let body = Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        };
        serde_json::to_string(&body).unwrap_or_else(|_| "{\"error\":{\"message\":\"error\"}}".into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let headers = [(axum::http::header::CONTENT_TYPE, "application/json")];
        (self.status, headers, self.body_json()).into_response()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape() {
        let e = ApiError::invalid_param("temperature", "must be >= 0");
        let v: serde_json::Value = serde_json::from_str(&e.body_json()).unwrap();
        assert_eq!(v["error"]["message"], "must be >= 0");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "temperature");
        assert_eq!(v["error"]["code"], "invalid_value");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }
}
