"""Drives the router's OpenAI-compatible HTTP API as clients do: the official `openai` client,
curl, and raw sockets for malformed HTTP. Run by tests/openai_http_test.cc against a local
cluster; exits non-zero naming every check that failed."""

import argparse
import http.client
import json
import socket
import subprocess
import sys
import time

FAILURES = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


def expect_error(fn, status, param=None, what=""):
    """Calls fn, which must raise an openai.APIStatusError with `status` (and error.param)."""
    import openai

    try:
        fn()
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        ok = e.status_code == status and (param is None or body.get("param") == param)
        check(ok, f"{what}: HTTP {e.status_code} param={body.get('param')!r} "
                  f"(want {status} {param!r}): {body.get('message')}")
        return e
    except Exception as e:  # noqa: BLE001: anything else is a failure to report
        check(False, f"{what}: raised {type(e).__name__}: {e} (want HTTP {status})")
        return None
    check(False, f"{what}: succeeded (want HTTP {status})")
    return None


def raw_http(port, request_bytes, timeout=10.0):
    """Sends raw bytes, returns (status, headers, body) of the response, or None on no answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(request_bytes)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the whole body was sent: read the answer anyway
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                length = None
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v.strip())
                if length is not None and len(body) >= length:
                    break
    head, _, body = data.partition(b"\r\n\r\n")
    if not head:
        return None
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers[k.strip().lower().decode()] = v.strip().decode()
    return status, headers, body


def post(port, path, body_bytes, extra_headers=""):
    return raw_http(
        port,
        (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         f"Content-Length: {len(body_bytes)}\r\nConnection: close\r\n{extra_headers}\r\n").encode()
        + body_bytes)


def param_of(body):
    try:
        return json.loads(body)["error"]["param"]
    except (ValueError, KeyError, TypeError):
        return "<no JSON error body>"


def main_checks(client, base_url, model, port):
    import openai

    models = client.models.list()
    check([m.id for m in models.data] == [model], f"/v1/models lists {model}")

    msgs = [{"role": "user", "content": "Hello there! Tell me a story about a cat and a dog."}]
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True})
    choice = r.choices[0]
    check(r.object == "chat.completion" and r.id.startswith("chatcmpl-"), "chat object and id")
    check(choice.message.role == "assistant" and isinstance(choice.message.content, str),
          "chat message is the assistant's text")
    check(choice.finish_reason == "length", f"chat finish_reason length: {choice.finish_reason}")
    check(r.usage.completion_tokens == 8 and r.usage.prompt_tokens > 0
          and r.usage.total_tokens == r.usage.prompt_tokens + 8, f"chat usage {r.usage}")
    text = choice.message.content

    # The same request streamed gives the same greedy text, then a usage chunk.
    pieces, finish, usage, roles = [], None, None, []
    for chunk in client.chat.completions.create(
            model=model, messages=msgs, max_tokens=8, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
        check(chunk.object == "chat.completion.chunk", "stream chunk object") if not pieces else None
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    check(roles == ["assistant"], f"stream announces the assistant role once: {roles}")
    check("".join(pieces) == text, f"streamed text equals the non-streamed one: "
                                   f"{''.join(pieces)!r} vs {text!r}")
    check(finish == "length", f"stream finish_reason: {finish}")
    check(usage is not None and usage.completion_tokens == 8, f"stream usage: {usage}")

    # A second turn reuses the first one's KV: cached_tokens > 0.
    turn2 = msgs + [{"role": "assistant", "content": text},
                    {"role": "user", "content": "And then what happened?"}]
    r2 = client.chat.completions.create(model=model, messages=turn2, max_tokens=4, temperature=0)
    cached = r2.usage.prompt_tokens_details.cached_tokens if r2.usage.prompt_tokens_details else 0
    check(cached > 0, f"second turn reports cached prompt tokens: {cached} of "
                      f"{r2.usage.prompt_tokens}")

    # Logprobs.
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=3, temperature=0,
                                       logprobs=True, top_logprobs=2,
                                       extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs.content if r.choices[0].logprobs else []
    check(len(lp) == 3 and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in lp),
          f"chat logprobs: {len(lp)} tokens")

    # Completions, streamed and not.
    c = client.completions.create(model=model, prompt="Once upon a time", max_tokens=6,
                                  temperature=0, extra_body={"ignore_eos": True})
    check(c.object == "text_completion" and c.choices[0].finish_reason == "length"
          and c.usage.completion_tokens == 6, f"completion: {c.choices[0]} {c.usage}")
    streamed = "".join(
        ch.choices[0].text for ch in client.completions.create(
            model=model, prompt="Once upon a time", max_tokens=6, temperature=0, stream=True,
            extra_body={"ignore_eos": True}) if ch.choices)
    check(streamed == c.choices[0].text, f"streamed completion equals: {streamed!r} vs "
                                         f"{c.choices[0].text!r}")
    # Many streams at once on a few io threads: each gets the same greedy text.
    from concurrent.futures import ThreadPoolExecutor

    def one_stream(_):
        return "".join(
            ch.choices[0].text for ch in client.completions.create(
                model=model, prompt="Once upon a time", max_tokens=6, temperature=0, stream=True,
                extra_body={"ignore_eos": True}) if ch.choices)

    with ThreadPoolExecutor(max_workers=24) as pool:
        texts = list(pool.map(one_stream, range(24)))
    check(texts == [c.choices[0].text] * 24,
          f"24 concurrent streams all equal the reference: {sorted(set(texts))}")
    c = client.completions.create(model=model, prompt="Once", max_tokens=2, temperature=0,
                                  logprobs=1, extra_body={"ignore_eos": True})
    check(c.choices[0].logprobs is not None and len(c.choices[0].logprobs.tokens) == 2,
          "completion logprobs")

    # Errors a client can provoke, each naming the field.
    chat = client.chat.completions.create
    expect_error(lambda: chat(model=model, messages=msgs, temperature=-1), 400, "temperature",
                 "temperature -1")
    expect_error(lambda: chat(model=model, messages=msgs, top_p=1.5), 400, "top_p", "top_p 1.5")
    expect_error(lambda: chat(model=model, messages=msgs, n=2), 400, "n", "n=2")
    expect_error(lambda: chat(model=model, messages=msgs, max_tokens=5000), 400, "max_tokens",
                 "max_tokens beyond the context")
    expect_error(lambda: chat(model=model, messages=msgs, stop=["x" * 300]), 400, "stop",
                 "a 300-byte stop string")
    expect_error(lambda: chat(model=model, messages=[{"role": "robot", "content": "hi"}]), 400,
                 "messages[0].role", "an unknown role")
    expect_error(lambda: chat(model=model, messages=[{"role": "user", "content": "x" * 70000}]),
                 400, "messages[0].content[0].text", "chat text over --max_chat_text_bytes")
    expect_error(lambda: chat(model=model, messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}]}]),
                 400, "messages[0].content[1].image_url", "an image by http URL")
    expect_error(lambda: chat(model=model, messages=msgs, tools=[{"type": "function", "function": {
        "name": "f", "parameters": {}}}]), 400, "tools", "tools")
    expect_error(lambda: chat(model="no-such-model", messages=msgs), 404, "model", "unknown model")
    expect_error(lambda: client.completions.create(model=model, prompt="hi", echo=True), 400,
                 "echo", "completion echo")
    # A prompt that fits the context but not the KV cache: 429 with Retry-After.
    e = expect_error(lambda: client.completions.create(model=model, prompt=[5] * 700,
                                                       max_tokens=4), 429, None,
                     "a prompt larger than the KV cache")
    if e is not None:
        check(e.response.headers.get("retry-after") == "1", "429 carries Retry-After: 1")

    # curl against the SSE stream.
    body = json.dumps({"model": model, "messages": msgs, "max_tokens": 4, "stream": True,
                       "temperature": 0, "ignore_eos": True})
    out = subprocess.run(["curl", "-sS", "-N", "-H", "Content-Type: application/json", "-d", body,
                          f"{base_url}/chat/completions"], capture_output=True, text=True,
                         timeout=60)
    events = [e for e in out.stdout.split("\n\n") if e]
    check(out.returncode == 0 and all(e.startswith("data: ") for e in events)
          and events[-1] == "data: [DONE]" and len(events) >= 3,
          f"curl sees SSE events ending in [DONE]: {out.stdout[-200:]!r} {out.stderr}")
    deltas = "".join(json.loads(e[6:])["choices"][0]["delta"].get("content", "")
                     for e in events[:-1] if json.loads(e[6:])["choices"])
    check(len(deltas) > 0, f"curl stream text: {deltas!r}")

    # Bad HTTP: a clear 4xx each time, and the server keeps serving.
    r = post(port, "/v1/chat/completions", b'{"messages": [')
    check(r is not None and r[0] == 400 and param_of(r[2]) == "body",
          f"malformed JSON -> 400 body: {r}")
    r = post(port, "/v1/chat/completions", b'{"messages": {"role": "user"}}')
    check(r is not None and r[0] == 400 and param_of(r[2]) == "messages",
          f"messages of the wrong type -> 400 messages: {r}")
    r = post(port, "/v1/chat/completions",
             b'{"messages": [{"role": "user", "content": "caf\xc3"}]}')
    check(r is not None and r[0] == 400 and param_of(r[2]) == "messages[0].content",
          f"invalid UTF-8 -> 400 naming messages[0].content: {r}")
    r = post(port, "/v1/chat/completions", b"{" + b" " * (2 << 20) + b"}")
    check(r is not None and r[0] == 413, f"a 2 MiB body -> 413: {r and r[:2]}")
    r = raw_http(port, b"BLAH\r\n\r\n")
    check(r is not None and r[0] == 400, f"not HTTP -> 400: {r}")
    r = raw_http(port, b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    check(r is not None and r[0] == 405, f"GET on a POST endpoint -> 405: {r and r[:2]}")
    r = raw_http(port, b"GET /v2/nothing HTTP/1.1\r\nHost: x\r\n\r\n")
    check(r is not None and r[0] == 404, f"unknown path -> 404: {r and r[:2]}")
    start = time.time()
    r = raw_http(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{",
                 timeout=10)
    check(r is not None and r[0] == 408 and time.time() - start < 8,
          f"a body that never arrives -> 408 after --http_read_timeout: {r and r[:2]}")
    r = raw_http(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    check(r is not None and r[0] == 200, f"/healthz: {r}")
    r = raw_http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    check(r is not None and r[0] == 200 and b"deepinfer_" in r[2], "/metrics on the HTTP port")
    check([m.id for m in client.models.list().data] == [model], "still serving after bad HTTP")

    # A client that leaves mid-stream: its call is cancelled (the router counts it), and the
    # request is aborted everywhere (the C++ side then checks that no node holds a KV block).
    def cancelled_count():
        r = raw_http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        for line in (r[2].decode() if r else "").splitlines():
            if line.startswith('deepinfer_requests_total{outcome="cancelled"}'):
                return float(line.split()[-1])
        return 0.0

    before = cancelled_count()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({
        "model": model, "messages": msgs, "max_tokens": 360, "stream": True,
        "ignore_eos": True}), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    first = resp.fp.readline()
    check(resp.status == 200 and len(first) > 0, f"long stream started: {resp.status}")
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    deadline = time.time() + 10
    while cancelled_count() <= before and time.time() < deadline:
        time.sleep(0.05)
    check(cancelled_count() == before + 1, "the disconnect cancelled the call")
    check([m.id for m in client.models.list().data] == [model], "serving after a disconnect")


def image_checks(client, model, image_path):
    import base64

    models = client.models.list()
    check(models.data[0].model_extra.get("supports_images") is True,
          f"/v1/models says the model takes images: {models.data[0]}")
    with open(image_path, "rb") as f:
        url = "data:image/png;base64," + base64.b64encode(f.read()).decode()

    def ask(image_url, max_tokens=4):
        return client.chat.completions.create(model=model, max_tokens=max_tokens, temperature=0,
                                              extra_body={"ignore_eos": True}, messages=[
            {"role": "user", "content": [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image_url", "image_url": {"url": image_url}}]}])

    text_only = client.chat.completions.create(
        model=model, max_tokens=1, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is in this image?"}]}])
    r = ask(url)
    check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4,
          f"image chat answers: {r.choices[0]} {r.usage}")
    check(r.usage.prompt_tokens > text_only.usage.prompt_tokens,
          f"the image adds prompt tokens: {r.usage.prompt_tokens} vs "
          f"{text_only.usage.prompt_tokens} without it")
    again = ask(url)
    check(again.choices[0].message.content == r.choices[0].message.content
          and again.usage.prompt_tokens_details.cached_tokens > 0,
          f"the same image again: same answer, cached prompt tokens "
          f"{again.usage.prompt_tokens_details.cached_tokens}")
    expect_error(lambda: ask("data:image/png;base64," + base64.b64encode(b"not a png").decode()),
                 400, "messages[0].content[1].image_url", "an image that is not PNG or JPEG")


def tenant_checks(base_url, model, port):
    """Against a router with --tenants_file (keys: tests/openai_http_test.cc)."""
    import openai

    def client(key):
        return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60)

    alice, bob, other, tiny = (client(k) for k in ("key-alice", "key-bob", "key-other", "key-tiny"))
    msgs = [{"role": "user", "content": "hi"}]

    # 401: no key (raw HTTP; the client always sends one), an unknown key; 403: another model's
    # key, a priority above the tenant's.
    resp = raw_http(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    check(resp is not None and resp[0] == 401, f"/v1/models without a key: {resp and resp[0]}")
    resp = post(port, "/v1/chat/completions",
                json.dumps({"model": model, "messages": msgs}).encode())
    check(resp is not None and resp[0] == 401, f"chat without a key: {resp and resp[0]}")
    e = expect_error(lambda: client("key-nobody").models.list(), 401, None, "unknown key, models")
    if e is not None:
        check(e.body.get("type") == "authentication_error", f"401 body: {e.body}")
    expect_error(lambda: client("key-nobody").chat.completions.create(
        model=model, messages=msgs, max_tokens=2), 401, None, "unknown key, chat")
    expect_error(lambda: client("key-nobody").completions.create(
        model=model, prompt="hi", max_tokens=2), 401, None, "unknown key, completions")
    expect_error(lambda: other.models.list(), 403, None, "another model's key, models")
    expect_error(lambda: other.chat.completions.create(model=model, messages=msgs, max_tokens=2),
                 403, None, "another model's key, chat")
    expect_error(lambda: alice.chat.completions.create(
        model=model, messages=msgs, max_tokens=2, extra_body={"priority": 9}),
        403, None, "a priority above the tenant's")
    check([m.id for m in alice.models.list().data] == [model], "a good key lists the model")

    # 429 with the tenant's Retry-After: one request, then the bucket is empty for ~1000 s.
    tiny.chat.completions.create(model=model, messages=msgs, max_tokens=2)
    e = expect_error(lambda: tiny.chat.completions.create(model=model, messages=msgs, max_tokens=2),
                     429, None, "over requests_per_second")
    if e is not None:
        retry = e.response.headers.get("retry-after", "")
        check(retry.isdigit() and 990 <= int(retry) <= 1000, f"429 Retry-After {retry!r}")
        check("requests_per_second" in e.body.get("message", ""), f"429 names the limit: {e.body}")

    # Isolation: the same prompt from two tenants shares no cache blocks.
    prompt = [{"role": "user", "content": "Isolation check: the quick brown fox jumps over the "
                                          "lazy dog, again and again, until the story ends."}]

    def cached(c, salt=None):
        extra = {"cache_salt": salt} if salt else {}
        r = c.chat.completions.create(model=model, messages=prompt, max_tokens=2, temperature=0,
                                      extra_body=extra)
        d = r.usage.prompt_tokens_details
        return (d.cached_tokens if d else 0), r.usage.prompt_tokens

    first = cached(alice)
    again = cached(alice)
    check(first[0] == 0, f"alice's first request has no cached tokens: {first}")
    check(again[0] > 0, f"alice's repeat hits her cache: {again}")
    bob_first = cached(bob)
    check(bob_first[0] == 0, f"bob's identical prompt sees none of alice's cache: {bob_first}")
    # Naming alice's namespace as the cache salt does not help: the salt is the tenant's.
    bob_salted = cached(client("key-carol"), salt="tenant:alice")
    check(bob_salted[0] == 0, f"a client-chosen salt does not reach another tenant: {bob_salted}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check_client", action="store_true")
    parser.add_argument("--base_url")
    parser.add_argument("--model")
    parser.add_argument("--phase", default="main")
    parser.add_argument("--image")
    args = parser.parse_args()
    if args.check_client:
        import openai  # noqa: F401
        return 0
    import openai

    port = int(args.base_url.rsplit(":", 1)[1].split("/")[0])
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=60)
    if args.phase == "main":
        main_checks(client, args.base_url, args.model, port)
    elif args.phase == "unavailable":
        e = expect_error(lambda: client.chat.completions.create(
            model=args.model, messages=[{"role": "user", "content": "hi"}]), 503, None,
            "no worker left")
        if e is not None:
            check(e.body.get("type") == "service_unavailable", f"503 body: {e.body}")
    elif args.phase == "tenants":
        tenant_checks(args.base_url, args.model, port)
    elif args.phase == "image":
        image_checks(client, args.model, args.image)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed:\n  " + "\n  ".join(FAILURES), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
