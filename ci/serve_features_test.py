#!/usr/bin/env python3
"""The `openai` client against `lode serve --embeddings --cors ORIGIN` for the fields
beyond plain text: a tool call round trip (whole and streamed), logprobs (top-1 equals
the greedy token's), n = 3, embeddings (cosine of identical texts = 1), a CORS
preflight, structured output (a json_schema answer that parses and validates for 20
seeds at temperature 0.8, whole and streamed; json_object; a GBNF `grammar`; the
completions endpoint's `json_schema`), and every unsupported field or combination a
BadRequestError naming it.

    python3 ci/serve_features_test.py --base-url http://127.0.0.1:8080/v1 --origin http://ui.example

Exit status 0 when every check passes. Run by tests/serve_openai_py.rs.
"""
import argparse
import json
import math
import re
import sys
import urllib.request

import jsonschema
import openai

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "tags"],
    "additionalProperties": False,
}


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


def refused(fn, field, what):
    try:
        fn()
    except openai.BadRequestError as e:
        check(e.status_code == 400 and field in str(e), f"{what}: 400 naming `{field}`")
        return
    check(False, f"{what} was accepted")


def structured(client, model):
    """json_schema (20 seeds, hot; streamed too), json_object, a GBNF grammar, and the
    completions endpoint's llama-server `json_schema`."""
    ask = [{"role": "user", "content": "Invent a person. Answer in JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    seen = set()
    for seed in range(20):
        r = client.chat.completions.create(model=model, messages=ask, response_format=fmt, temperature=0.8, seed=seed, max_tokens=150)
        c = r.choices[0]
        check(c.finish_reason == "stop", f"seed {seed}: the answer ends by itself ({c.finish_reason})")
        obj = json.loads(c.message.content)
        jsonschema.validate(obj, PERSON)
        check(True, f"seed {seed}: {c.message.content} validates against the schema")
        seen.add(c.message.content)
    check(len(seen) > 5, f"temperature 0.8 gives varied answers ({len(seen)} distinct of 20)")

    s = client.chat.completions.create(model=model, messages=ask, response_format=fmt, temperature=0.8, seed=99, max_tokens=150, stream=True)
    text = "".join(ch.delta.content or "" for chunk in s for ch in chunk.choices)
    jsonschema.validate(json.loads(text), PERSON)
    check(True, f"streamed: {text} validates")

    r = client.chat.completions.create(model=model, response_format={"type": "json_object"}, temperature=0.7, seed=5, max_tokens=80,
                                       messages=[{"role": "user", "content": 'Reply with a JSON object with the keys "name" and "age" for a person.'}])
    obj = json.loads(r.choices[0].message.content)
    check(isinstance(obj, dict), f"json_object: {r.choices[0].message.content} is a JSON object")

    gbnf = 'root ::= ("yes" | "no") ", because " [a-z ]{1,40} "."'
    for seed in range(3):
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Is the sky blue?"}],
                                           temperature=0.9, seed=seed, max_tokens=60, extra_body={"grammar": gbnf})
        out = r.choices[0].message.content
        check(re.fullmatch(r"(yes|no), because [a-z ]{1,40}\.", out) is not None, f"grammar: {out!r} matches")

    r = client.completions.create(model=model, prompt="A person as JSON:", temperature=0.8, seed=1, max_tokens=150,
                                  extra_body={"json_schema": PERSON})
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)
    check(True, f"completions json_schema: {r.choices[0].text} validates")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--origin", required=True)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="none", max_retries=0, timeout=300)
    model = "any-name"
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]

    # Tool call, whole.
    r = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, tool_choice=NAMED, temperature=0, max_tokens=40)
    c = r.choices[0]
    check(c.finish_reason == "tool_calls" and c.message.tool_calls, f"a tool call comes back: {c.message}")
    call = c.message.tool_calls[0]
    check(call.type == "function" and call.function.name == "get_weather" and call.id, "the call names the function")
    check(isinstance(json.loads(call.function.arguments), dict), f"arguments are a JSON object: {call.function.arguments}")

    # Tool call, streamed: the same call through tool_calls deltas.
    s = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, tool_choice=NAMED, temperature=0, max_tokens=40, stream=True)
    calls, finish = {}, None
    for chunk in s:
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or []:
                e = calls.setdefault(d.index, {"id": None, "name": "", "args": ""})
                e["id"] = d.id or e["id"]
                e["name"] += (d.function.name or "") if d.function else ""
                e["args"] += (d.function.arguments or "") if d.function else ""
            finish = ch.finish_reason or finish
    check(finish == "tool_calls" and len(calls) == 1, f"streamed tool call: {calls}")
    check(calls[0]["name"] == "get_weather" and json.loads(calls[0]["args"]) == json.loads(call.function.arguments),
          "streamed call equals the whole one")

    # The result goes back as a tool message; the model answers in text.
    msgs2 = msgs + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 18, "sky": "sunny"})},
    ]
    r2 = client.chat.completions.create(model=model, messages=msgs2, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=20)
    check(r2.choices[0].message.content and not r2.choices[0].message.tool_calls, f"answer after the tool result: {r2.choices[0].message.content!r}")

    # Logprobs: top-1 of each step is the greedy token, with its logprob; probabilities <= 1.
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Name a color."}],
                                       temperature=0, max_tokens=8, logprobs=True, top_logprobs=4)
    lp = r.choices[0].logprobs.content
    check(len(lp) > 0, f"{len(lp)} logprob entries")
    for e in lp:
        check(e.top_logprobs[0].token == e.token and abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6, f"top-1 is the greedy token {e.token!r}")
        check(sum(math.exp(t.logprob) for t in e.top_logprobs) <= 1 + 1e-5, "top probabilities sum to at most 1")
    check("".join(e.token for e in lp) == r.choices[0].message.content, "the tokens spell the answer")

    # n = 3.
    r = client.chat.completions.create(model=model, messages=msgs, n=3, temperature=1.0, seed=11, max_tokens=8)
    check(sorted(c.index for c in r.choices) == [0, 1, 2], "n = 3 gives three choices")

    # Embeddings (the client asks for base64 by default).
    e = client.embeddings.create(model=model, input=["The cat sat on the mat.", "The cat sat on the mat.", "Interest rates rose."])
    v = [d.embedding for d in e.data]
    cos = lambda a, b: sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    check(abs(cos(v[0], v[1]) - 1) < 1e-5, "identical texts: cosine 1")
    check(cos(v[0], v[2]) < 0.999, f"different texts: cosine {cos(v[0], v[2]):.4f} < 1")
    check(abs(math.sqrt(sum(x * x for x in v[0])) - 1) < 1e-4, "embeddings are unit length")
    ef = client.embeddings.create(model=model, input="The cat sat on the mat.", encoding_format="float")
    check(abs(cos(ef.data[0].embedding, v[0]) - 1) < 1e-5, "float and base64 agree")

    # CORS preflight.
    root = args.base_url.rsplit("/v1", 1)[0]
    req = urllib.request.Request(root + "/v1/chat/completions", method="OPTIONS", headers={
        "Origin": args.origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    with urllib.request.urlopen(req) as resp:
        check(resp.status in (200, 204), f"preflight answered ({resp.status})")
        check(resp.headers.get("access-control-allow-origin") == args.origin, "preflight allows the origin")

    structured(client, model)

    # Unsupported or bad combinations: a 400 naming the field.
    chat = lambda **kw: client.chat.completions.create(model=model, messages=msgs, max_tokens=4, **kw)
    refused(lambda: chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}}),
            "response_format", "a schema llguidance rejects")
    refused(lambda: chat(response_format={"type": "xml"}), "response_format", "an unknown response_format type")
    refused(lambda: chat(extra_body={"grammar": "root ::= \"a"}), "grammar", "a GBNF syntax error")
    refused(lambda: chat(extra_body={"grammar": "root ::= item"}), "grammar", "a GBNF rule that is not defined")
    refused(lambda: chat(response_format={"type": "json_object"}, extra_body={"grammar": "root ::= \"a\""}), "grammar",
            "two constraints at once")
    refused(lambda: chat(response_format={"type": "json_object"}, tools=TOOLS), "response_format", "response_format with tools")
    refused(lambda: chat(logit_bias={"42": 5}), "logit_bias", "logit_bias")
    refused(lambda: chat(n=100), "n", "n = 100")
    refused(lambda: chat(top_logprobs=3), "top_logprobs", "top_logprobs without logprobs")
    refused(lambda: chat(tool_choice="required"), "tool_choice", "tool_choice without tools")
    refused(lambda: chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice", "unknown tool")
    refused(lambda: chat(tools=[{"type": "code_interpreter"}]), "tools[0]", "non-function tool")
    refused(lambda: client.chat.completions.create(model=model, messages=[{"role": "wizard", "content": "x"}]),
            "messages[0].role", "unknown role")
    print("all feature checks passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
