#!/usr/bin/env python3
"""Talk to a running `lode serve` with the official `openai` Python client.

Checks chat and text completions, streamed and not: greedy answers are non-empty and
equal between the streamed and the whole response, usage adds up, a bad parameter is a
BadRequestError, a wrong key an AuthenticationError, an unknown model NotFoundError.

    python3 ci/serve_client_test.py --base-url http://127.0.0.1:8080/v1 [--api-key KEY]

Exit status 0 when every check passes. Run by tests/serve_openai_py.rs.
"""
import argparse
import sys

import openai

N = 12


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default="none")
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=300)

    models = client.models.list().data
    check(len(models) == 1 and models[0].id, f"models.list gives one model ({models[0].id})")
    model = models[0].id
    messages = [{"role": "user", "content": "Name three colors."}]

    # Chat, whole and streamed.
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=N, temperature=0)
    text = r.choices[0].message.content
    check(r.object == "chat.completion" and r.choices[0].message.role == "assistant", "chat completion object")
    check(isinstance(text, str) and text.strip(), f"chat answer is text: {text!r}")
    check(r.choices[0].finish_reason in ("stop", "length"), f"finish_reason {r.choices[0].finish_reason}")
    u = r.usage
    check(u.prompt_tokens > 0 and 0 < u.completion_tokens <= N, f"usage {u}")
    check(u.total_tokens == u.prompt_tokens + u.completion_tokens, "usage adds up")

    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=N, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    parts, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    check("".join(parts) == text, "streamed chat text equals the whole response")
    check(finish == r.choices[0].finish_reason, "streamed finish_reason")
    check(usage is not None and usage.completion_tokens == u.completion_tokens, "streamed usage")

    # Text completions, whole and streamed.
    prompt = "The three primary colors are"
    c = client.completions.create(model=model, prompt=prompt, max_tokens=N, temperature=0)
    ctext = c.choices[0].text
    check(c.object == "text_completion" and ctext.strip(), f"completion text: {ctext!r}")
    s = client.completions.create(model=model, prompt=prompt, max_tokens=N, temperature=0, stream=True)
    check("".join(ch.choices[0].text for ch in s if ch.choices) == ctext, "streamed completion equals whole")

    # Stop strings and seeds.
    c2 = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=N, temperature=0, stop=[","])
    check("," not in c2.choices[0].text and c2.choices[0].finish_reason == "stop", f"stop string: {c2.choices[0].text!r}")
    a = client.completions.create(model=model, prompt=prompt, max_tokens=N, temperature=1.0, seed=7)
    b = client.completions.create(model=model, prompt=prompt, max_tokens=N, temperature=1.0, seed=7)
    check(a.choices[0].text == b.choices[0].text, "same seed, same sample")

    # Errors become the client's exceptions.
    try:
        client.chat.completions.create(model=model, messages=messages, temperature=-1)
        check(False, "negative temperature refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "temperature" in str(e), "negative temperature: BadRequestError")
    # One model is served: any name means it (most local clients hard-code one).
    r2 = client.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=N, temperature=0)
    check(r2.choices[0].message.content == text, "any model name is the served model")
    if args.api_key != "none":
        bad = openai.OpenAI(base_url=args.base_url, api_key="wrong", max_retries=0)
        try:
            bad.models.list()
            check(False, "wrong key refused")
        except openai.AuthenticationError as e:
            check(e.status_code == 401, "wrong key: AuthenticationError")
    print("all openai client checks passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
