//! Shared by the `serve_*` tests: start `lode serve` on a free loopback port with
//! SmolLM2 (the fastest real model), and a tiny HTTP/1.1 client over `TcpStream` (raw,
//! so tests can send broken bodies and hang up mid-stream).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

#[path = "../common/mod.rs"]
mod common;
pub use common::{models_dir, SMOL};

/// SmolLM2's path, or `None` with a printed note (the test then skips).
pub fn smol() -> Option<PathBuf> {
    let p = models_dir().join(SMOL);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("SKIP: {} not found (set LODE_MODELS_DIR or run ci/fetch-models.sh)", p.display());
        None
    }
}

/// A running `lode serve`; killed on drop.
pub struct Server {
    child: Child,
    pub addr: String,
    pub stderr: mpsc::Receiver<String>,
}

impl Server {
    /// Starts the server with `extra` arguments after the defaults (CPU, 2 threads,
    /// port 0) and waits for its "listening on" line.
    pub fn start(model: &PathBuf, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lode"))
            .args(["serve", "--device", "cpu", "--threads", "2", "--port", "0", "-m"])
            .arg(model)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start lode serve");
        let err = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[server] {line}");
                let _ = tx.send(line);
            }
        });
        let addr = loop {
            match rx.recv_timeout(Duration::from_secs(120)) {
                Ok(line) => {
                    if let Some(a) = line.strip_prefix("lode: listening on http://") {
                        break a.trim().to_string();
                    }
                }
                Err(e) => {
                    let _ = child.kill();
                    panic!("lode serve did not start: {e}");
                }
            }
        };
        Server { child, addr, stderr: rx }
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Resp {
        request(&self.addr, "GET", path, headers, b"")
    }

    /// Any method, no body.
    pub fn request_raw(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
        request(&self.addr, method, path, headers, b"")
    }

    pub fn post(&self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        request(&self.addr, "POST", path, headers, body)
    }

    pub fn post_json(&self, path: &str, headers: &[(&str, &str)], body: &serde_json::Value) -> Resp {
        self.post(path, headers, body.to_string().as_bytes())
    }

    /// A metric's value from /metrics (first line starting with `name`).
    pub fn metric(&self, name: &str, headers: &[(&str, &str)]) -> f64 {
        let r = self.get("/metrics", headers);
        assert_eq!(r.status, 200, "{}", r.body);
        r.body
            .lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("metric {name} missing in\n{}", r.body))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The `data:` payloads of an SSE body.
    pub fn sse_data(&self) -> Vec<String> {
        self.body.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
    }

    /// Asserts an OpenAI-style error with `status` and returns its `error` object.
    pub fn error(&self, status: u16) -> serde_json::Value {
        assert_eq!(self.status, status, "body: {}", self.body);
        let v = self.json();
        let e = v["error"].clone();
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "no message: {}", self.body);
        assert!(e["type"].is_string(), "no type: {}", self.body);
        assert!(e.get("param").is_some() && e.get("code").is_some(), "no param/code: {}", self.body);
        e
    }
}

pub fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    s
}

pub fn write_request(s: &mut TcpStream, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).expect("write head");
    // The server may answer (413) and close before the whole body is sent.
    let _ = s.write_all(body);
}

/// One request on a fresh connection; reads the whole response.
pub fn request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let mut s = connect(addr);
    write_request(&mut s, method, path, headers, body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse_response(&raw)
}

pub fn parse_response(raw: &[u8]) -> Resp {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or_else(|| {
        panic!("no response head in {:?}", String::from_utf8_lossy(raw))
    });
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let body = &raw[split + 4..];
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status");
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    let body = if chunked { dechunk(body) } else { body.to_vec() };
    Resp { status, headers: head, body: String::from_utf8_lossy(&body).into_owned() }
}

fn dechunk(mut s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = s.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&s[..eol]).trim().to_string();
        let n = usize::from_str_radix(&size, 16).unwrap_or(0);
        let rest = &s[eol + 2..];
        if n == 0 || rest.len() < n {
            break;
        }
        out.extend_from_slice(&rest[..n]);
        s = rest[n..].strip_prefix(b"\r\n").unwrap_or(&rest[n..]);
    }
    out
}
