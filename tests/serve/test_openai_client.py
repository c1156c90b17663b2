#!/usr/bin/env python3
"""End-to-end checks of `dspark serve` with the official `openai` client.

Runs against a server that is already up:

    python3 tests/serve/test_openai_client.py --base-url http://127.0.0.1:8080 [--suite full]

Suites: "full" (every check except the disconnect one; needs --parallel >= 8
for the concurrency check to batch), "seeds" (sampled requests with explicit
seeds give the same text together as alone), "disconnect" (a client that
goes away frees its slot; meant for a --parallel 1 server) and "logprobs"
(fixed requests' log-probabilities recorded by one server and compared by
another, --logprobs-file), "auth" (a server with --api-key sk-test-one and a
key file holding sk-test-file), "ops" (metrics, the bounded queue and
deadlines; a --parallel 1 --max-queue 1 server) and "shutdown" (SIGTERM
mid-stream; --pid). The full and
disconnect suites send greedy requests (temperature 0) only, so results are
deterministic. Exit status 0 when every
check passes. tests/serve_test.cpp starts the servers and runs this script.
"""

import argparse
import http.client
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
import urllib.parse

import openai

MODEL = "smollm2"
CHECKS = {}
# Sanitized builds decode 5-20x slower: DSPARK_TEST_SLOWDOWN scales every
# wait and time limit below that depends on decoding speed (the header-only
# framing check keeps its 4.5 s: no decoding happens there).
SLOW = float(os.environ.get("DSPARK_TEST_SLOWDOWN", "1"))


def check(suite):
    def register(fn):
        CHECKS.setdefault(suite, []).append(fn)
        return fn

    return register


class Ctx:
    def __init__(self, base_url):
        self.base = base_url.rstrip("/")
        u = urllib.parse.urlparse(self.base)
        self.host, self.port = u.hostname, u.port
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key="unused", max_retries=0, timeout=180 * SLOW)

    def raw(self, method, path, body=None, timeout=180, content_type="application/json", auth=None):
        """One plain HTTP request; returns (status, headers dict, body bytes)."""
        timeout *= SLOW
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            headers = {"Content-Type": content_type} if body is not None else {}
            if auth is not None:
                headers["Authorization"] = auth
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def health(self):
        status, _, body = self.raw("GET", "/health")
        assert status in (200, 503), (status, body)
        return json.loads(body)


def extra(obj, key):
    return obj.to_dict()[key]


def chat(ctx, content, **kw):
    kw.setdefault("max_tokens", 16)
    kw.setdefault("temperature", 0)
    return ctx.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)


def complete(ctx, prompt, **kw):
    kw.setdefault("max_tokens", 16)
    kw.setdefault("temperature", 0)
    return ctx.client.completions.create(model=MODEL, prompt=prompt, **kw)


def stream_completion(ctx, prompt, **kw):
    """Streams a completion; returns (text, chunks' texts, finish_reason, usage)."""
    kw.setdefault("max_tokens", 16)
    kw.setdefault("temperature", 0)
    pieces, finish, usage = [], None, None
    for ch in ctx.client.completions.create(
        model=MODEL, prompt=prompt, stream=True, stream_options={"include_usage": True}, **kw
    ):
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            if c.text:
                pieces.append(c.text)
            if c.finish_reason is not None:
                finish = c.finish_reason
    return "".join(pieces), pieces, finish, usage


def check_usage(r, max_tokens):
    u = r.usage
    assert u.prompt_tokens > 0, u
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u
    assert 1 <= u.completion_tokens <= max_tokens, u
    if r.choices[0].finish_reason == "length":
        assert u.completion_tokens == max_tokens, u


def check_stats(r):
    s = extra(r, "dspark")
    for k in ("tau", "drafted", "accepted", "target_calls", "acceptance_by_position"):
        assert k in s, (k, s)
    assert s["tau"] >= 1.0 or r.usage.completion_tokens <= 1, s
    assert s["accepted"] <= s["drafted"], s


# ---- full suite ----------------------------------------------------------------


@check("full")
def health_and_models(ctx):
    h = ctx.health()
    assert h["status"] == "ready", h
    ids = [m.id for m in ctx.client.models.list().data]
    assert ids == [MODEL], ids


@check("full")
def chat_non_streaming(ctx):
    r = chat(ctx, "Name the capital city of France.", max_tokens=16)
    assert r.object == "chat.completion", r
    msg = r.choices[0].message
    assert msg.role == "assistant", msg
    assert msg.content.startswith("The capital city of France is Paris"), msg.content
    assert r.choices[0].finish_reason in ("stop", "length"), r.choices[0]
    check_usage(r, 16)
    check_stats(r)


@check("full")
def chat_streaming_equals_non_streaming(ctx):
    q = "Name three colors."
    full = chat(ctx, q, max_tokens=20)
    pieces, finish, usage, roles = [], None, None, []
    for ch in ctx.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": q}],
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        assert ch.object == "chat.completion.chunk", ch
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason is not None:
                finish = c.finish_reason
    assert roles == ["assistant"], roles
    assert "".join(pieces) == full.choices[0].message.content, (pieces, full.choices[0].message.content)
    assert finish == full.choices[0].finish_reason, (finish, full.choices[0].finish_reason)
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens, (usage, full.usage)
    assert usage.prompt_tokens == full.usage.prompt_tokens, (usage, full.usage)


@check("full")
def completion_streaming_equals_non_streaming(ctx):
    p = "The quick brown fox"
    full = complete(ctx, p, max_tokens=20)
    assert full.object == "text_completion", full
    check_usage(full, 20)
    check_stats(full)
    text, pieces, finish, usage = stream_completion(ctx, p, max_tokens=20)
    assert text == full.choices[0].text, (pieces, full.choices[0].text)
    assert finish == full.choices[0].finish_reason, finish
    assert usage.completion_tokens == full.usage.completion_tokens, (usage, full.usage)


@check("full")
def streamed_chunks_are_valid_utf8(ctx):
    # Japanese and emoji come out as several byte-level tokens per character:
    # no chunk may carry half a character.
    prompt = "日本語の例文: 今日はとても良い天気ですね。🌸 明日は"
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0, "stream": True})
    status, headers, raw = ctx.raw("POST", "/v1/completions", body.encode())
    assert status == 200, (status, raw[:300])
    assert headers.get("content-type", "").startswith("text/event-stream"), headers
    events = [e for e in raw.split(b"\n\n") if e.strip()]
    assert events[-1] == b"data: [DONE]", events[-1]
    text = []
    for e in events[:-1]:
        if e.startswith(b":"):
            continue  # keep-alive comment
        assert e.startswith(b"data: "), e
        payload = e[len(b"data: ") :].decode("utf-8")  # strict: raises on a split character
        chunk = json.loads(payload)
        for c in chunk["choices"]:
            text.append(c["text"])
    full = complete(ctx, prompt, max_tokens=24)
    assert "".join(text) == full.choices[0].text, ("".join(text), full.choices[0].text)
    assert len(text) >= 3, text
    assert any(ord(ch) > 0x7F for ch in full.choices[0].text), full.choices[0].text


@check("full")
def generation_cut_inside_a_character_drops_it(ctx):
    # 3 tokens of this answer end after the first bytes of a character: they
    # are dropped, not sent as U+FFFD (streamed or not); usage counts 3.
    q = "こんにちは、元気ですか？"
    r = chat(ctx, q, max_tokens=3)
    assert r.choices[0].message.content == "こ", r.choices[0].message.content
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length", r
    pieces = []
    for ch in ctx.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": q}], max_tokens=3, temperature=0, stream=True
    ):
        for c in ch.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
    assert "".join(pieces) == "こ", pieces
    assert chat(ctx, q, max_tokens=4).choices[0].message.content.startswith("こん")


def two_token_stop(text):
    """A stop string across a word boundary (the pre-tokenizer puts the space
    with the next word, so it spans at least two tokens): 'ab cd' around the
    first space with two letters on either side after the first few chars."""
    for i in range(4, len(text) - 3):
        if text[i] == " " and text[i - 2 : i].isalpha() and text[i + 1 : i + 3].isalpha():
            stop = text[i - 2 : i + 3]
            if text.find(stop) == i - 2:
                return stop, i - 2
    raise AssertionError("no word boundary to put a stop string on in %r" % text)


@check("full")
def stop_string_across_tokens(ctx):
    prompt = "Once upon a time, in a small village by the sea,"
    base = complete(ctx, prompt, max_tokens=24)
    t = base.choices[0].text
    stop, at = two_token_stop(t)
    for stops in ([stop], ["never-appears-§", stop]):
        r = complete(ctx, prompt, max_tokens=24, stop=stops)
        assert r.choices[0].text == t[:at], (stops, r.choices[0].text, t[:at])
        assert r.choices[0].finish_reason == "stop", r.choices[0]
        k = r.usage.completion_tokens
        # k counts the tokens up to and including the one completing the stop:
        # the first k tokens contain it, the first k-1 do not.
        with_k = complete(ctx, prompt, max_tokens=k).choices[0].text
        assert stop in with_k, (k, with_k, stop)
        if k > 1:
            without = complete(ctx, prompt, max_tokens=k - 1).choices[0].text
            assert stop not in without, (k, without, stop)
        text, pieces, finish, usage = stream_completion(ctx, prompt, max_tokens=24, stop=stops)
        assert text == t[:at], (pieces, t[:at])
        assert finish == "stop", finish
        assert usage.completion_tokens == k, (usage, k)
        assert all(stop not in p for p in pieces), pieces


@check("full")
def stop_string_in_chat(ctx):
    full = chat(ctx, "Name the capital city of France.", max_tokens=16).choices[0].message.content
    r = chat(ctx, "Name the capital city of France.", max_tokens=16, stop=["Paris"])
    assert r.choices[0].message.content == full[: full.index("Paris")], (r.choices[0].message.content, full)
    assert r.choices[0].finish_reason == "stop"


@check("full")
def held_back_text_is_flushed(ctx):
    prompt = "Once upon a time, in a small village by the sea,"
    base = complete(ctx, prompt, max_tokens=24)
    t = base.choices[0].text
    assert base.choices[0].finish_reason == "length", base.choices[0]
    # The last characters are a prefix of this stop string, so they are held
    # back until generation ends; then they must come out.
    stop = t[-3:] + "\u2603\u2603never"
    r = complete(ctx, prompt, max_tokens=24, stop=stop)
    assert r.choices[0].text == t, (r.choices[0].text, t)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 24
    text, pieces, finish, usage = stream_completion(ctx, prompt, max_tokens=24, stop=stop)
    assert text == t, (pieces, t)
    assert finish == "length" and usage.completion_tokens == 24, (finish, usage)


@check("full")
def content_given_as_text_parts(ctx):
    # What current OpenAI SDKs and LangChain send: a list of text parts.
    q = "Name the capital city of France."
    plain = chat(ctx, q).choices[0].message.content
    parts = ctx.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": q}]}], max_tokens=16, temperature=0
    )
    assert parts.choices[0].message.content == plain, (parts.choices[0].message.content, plain)
    try:
        ctx.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": [{"type": "text", "text": q},
                                                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}],
            max_tokens=4,
        )
    except openai.BadRequestError as e:
        assert "image_url" in str(e) and "text only" in str(e), e
    else:
        raise AssertionError("an image part was accepted")


@check("full")
def completion_prompt_lists_and_token_ids(ctx):
    prompts = ["The quick brown fox", "Once upon a time"]
    alone = [complete(ctx, p, max_tokens=8) for p in prompts]
    both = complete(ctx, prompts, max_tokens=8)
    assert [c.index for c in both.choices] == [0, 1], both.choices
    assert [c.text for c in both.choices] == [a.choices[0].text for a in alone], (both.choices, alone)
    assert both.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone), both.usage
    assert both.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone), both.usage
    # Token ids as llama.cpp's server takes them (/tokenize gives them).
    status, _, raw = ctx.raw("POST", "/tokenize", json.dumps({"content": prompts[0], "add_special": True}).encode())
    assert status == 200, (status, raw)
    ids = json.loads(raw)["tokens"]
    assert len(ids) == alone[0].usage.prompt_tokens, (ids, alone[0].usage)
    by_ids = complete(ctx, ids, max_tokens=8)
    assert by_ids.choices[0].text == alone[0].choices[0].text, (by_ids.choices[0].text, alone[0].choices[0].text)
    two = complete(ctx, [ids, ids[:-1]], max_tokens=4)
    assert len(two.choices) == 2 and two.usage.prompt_tokens == 2 * len(ids) - 1, two
    status, _, raw = ctx.raw("POST", "/detokenize", json.dumps({"tokens": ids}).encode())
    assert status == 200 and json.loads(raw)["content"].endswith(prompts[0]), (status, raw)  # after a BOS, if any
    # Streaming several prompts: each chunk names its choice.
    texts, finishes = {}, {}
    for ch in ctx.client.completions.create(model=MODEL, prompt=prompts, max_tokens=8, temperature=0, stream=True):
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert texts == {0: alone[0].choices[0].text, 1: alone[1].choices[0].text}, texts
    assert set(finishes) == {0, 1}, finishes
    status, _, raw = ctx.raw("POST", "/v1/completions", json.dumps({"prompt": [10**9], "max_tokens": 2}).encode())
    assert status == 400 and "outside the vocabulary" in json.loads(raw)["error"]["message"], (status, raw)


@check("full")
def logprobs_of_greedy_tokens(ctx):
    # Completions: logprobs=N; the greedy token is the most likely one.
    r = complete(ctx, "The quick brown fox", max_tokens=10, logprobs=3)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text, (lp.tokens, r.choices[0].text)
    assert len(lp.token_logprobs) == r.usage.completion_tokens, lp
    for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) <= 3 and value <= 0, top
        assert value == max(top.values()) and top[tok] == value, (tok, value, top)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset), lp.text_offset
    # Chat: logprobs=true, top_logprobs=N.
    c = chat(ctx, "Name three colors.", max_tokens=10, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens, content
    assert "".join(e.token for e in content) == c.choices[0].message.content
    for e in content:
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob == e.logprob, e
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token, e
    assert chat(ctx, "Name three colors.", max_tokens=4).choices[0].logprobs is None
    # Streamed, the chunks carry the same values.
    streamed = []
    for ch in ctx.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name three colors."}], max_tokens=10, temperature=0,
        logprobs=True, top_logprobs=2, stream=True,
    ):
        for ch_choice in ch.choices:
            if ch_choice.logprobs and ch_choice.logprobs.content:
                streamed += [(e.token, e.logprob) for e in ch_choice.logprobs.content]
    assert streamed == [(e.token, e.logprob) for e in content], (streamed, content)


PROMPTS = [
    "What is the capital of France?",
    "Name three colors.",
    "Write a haiku about the sea.",
    "What is 2 + 2?",
    "Give me a synonym for happy.",
    "Who wrote Hamlet?",
    "Describe a cat in one sentence.",
    "List two prime numbers.",
]


@check("full")
def concurrent_requests_equal_sequential(ctx):
    alone = []
    steps0 = ctx.health()["steps"]
    for p in PROMPTS:
        r = chat(ctx, p, max_tokens=12)
        alone.append((r.choices[0].message.content, r.usage.completion_tokens, r.choices[0].finish_reason))
    steps_alone = ctx.health()["steps"] - steps0

    together = [None] * len(PROMPTS)
    errors = []

    def run(i):
        try:
            r = chat(ctx, PROMPTS[i], max_tokens=12)
            together[i] = (r.choices[0].message.content, r.usage.completion_tokens, r.choices[0].finish_reason)
        except Exception as e:  # reported below
            errors.append(repr(e))

    steps0 = ctx.health()["steps"]
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    steps_together = ctx.health()["steps"] - steps0
    assert not errors, errors
    for i, (a, b) in enumerate(zip(alone, together)):
        assert a == b, (PROMPTS[i], a, b)
    # Batched: far fewer target calls than one request after another.
    assert steps_together < steps_alone, (steps_together, steps_alone)


BAD = [
    ("/v1/completions", b'{"model": "x", "prompt": "hi",', ""),
    ("/v1/completions", b"not json at all", ""),
    ("/v1/completions", b"[1, 2, 3]", ""),
    ("/v1/completions", b'{"max_tokens": 4}', "prompt"),
    ("/v1/completions", b'{"prompt": 42}', "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": "ten"}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 0}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": -3}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 10000000}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 9223372036854775807}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": "hot"}', "temperature"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": -0.5}', "temperature"),
    ("/v1/completions", b'{"prompt": "hi", "top_p": 0}', "top_p"),
    ("/v1/completions", b'{"prompt": "hi", "top_p": 1.5}', "top_p"),
    ("/v1/completions", b'{"prompt": "hi", "stop": 7}', "stop"),
    ("/v1/completions", b'{"prompt": "hi", "stream": "yes"}', "stream"),
    ("/v1/chat/completions", b'{"messages": "hello"}', "messages"),
    ("/v1/chat/completions", b'{"messages": []}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "hi"}]}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1.5}', "max_tokens"),
]


@check("full")
def bad_requests_get_400_and_server_keeps_serving(ctx):
    for path, body, param in BAD:
        status, headers, raw = ctx.raw("POST", path, body)
        assert status == 400, (body, status, raw)
        assert headers.get("content-type", "").startswith("application/json"), (body, headers)
        err = json.loads(raw)["error"]
        assert err["type"] == "invalid_request_error", (body, err)
        assert isinstance(err["message"], str) and err["message"], (body, err)
        assert err["param"] == (param or None), (body, err)
    status, _, raw = ctx.raw("GET", "/v1/no-such-endpoint")
    assert status == 404 and "error" in json.loads(raw), (status, raw)
    # A known endpoint asked with the wrong method: 405 naming the right one.
    status, headers, raw = ctx.raw("GET", "/v1/completions")
    assert status == 405 and headers.get("allow") == "POST", (status, headers, raw)
    assert "expects POST" in json.loads(raw)["error"]["message"], raw
    # A large prompt is fine as JSON; as a form-encoded body (curl -d's
    # default type) the HTTP library stops at 8 KiB, and the error says so.
    big = json.dumps({"prompt": "word " * 1700, "max_tokens": 1, "temperature": 0}).encode()
    status, _, raw = ctx.raw("POST", "/v1/completions", big)
    assert status == 200, (status, raw[:300])
    status, headers, raw = ctx.raw("POST", "/v1/completions", big, content_type="application/x-www-form-urlencoded")
    assert status == 413 and headers.get("content-type", "").startswith("application/json"), (status, headers)
    assert "application/json" in json.loads(raw)["error"]["message"], raw
    # A POST whose Content-Length is missing, unreadable or over the limit is
    # refused from its headers, at once (the HTTP library alone would wait
    # for its 5 s read timeout), and the connection is closed.
    for length, want_status, want_message in (
        (b"-5", 400, "Content-Length: expected a non-negative integer, got '-5'"),
        (b"abc", 400, "Content-Length: expected a non-negative integer, got 'abc'"),
        (b"99999999999999999999", 413, "the limit is 64 MiB"),
        (None, 411, "a POST needs a Content-Length header"),
        (b"2\r\nTransfer-Encoding: chunked", 400, "must not carry both Transfer-Encoding and Content-Length"),
    ):
        with socket.create_connection((ctx.host, ctx.port), timeout=4.5) as sock:
            header = b"" if length is None else b"Content-Length: " + length + b"\r\n"
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + header + b"\r\n{}")
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                part = sock.recv(65536)  # socket.timeout here: the reply waited for the body
                if not part:
                    break
                reply += part
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 %d" % want_status), (length, reply[:300])
        assert b"connection: close" in head.lower(), (length, head)
        assert want_message in json.loads(body)["error"]["message"], (length, body)
    # A body that stops short of its Content-Length is answered after the
    # read timeout (5 s), saying so.
    with socket.create_connection((ctx.host, ctx.port), timeout=15) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{\"prompt\": \"hi\""
        )
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            part = sock.recv(65536)
            if not part:
                break
            reply += part
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), reply[:300]
    assert "before the 100 bytes its Content-Length announced" in json.loads(body)["error"]["message"], body
    # The official client surfaces them as BadRequestError.
    for kw in ({"max_tokens": 0}, {"temperature": -1}, {"max_tokens": 10**7}):
        try:
            complete(ctx, "hi", **kw)
        except openai.BadRequestError as e:
            assert e.status_code == 400, e
        else:
            raise AssertionError("accepted %r" % (kw,))
    # Unknown fields with correct types are ignored; the server still serves.
    status, _, raw = ctx.raw(
        "POST", "/v1/completions", b'{"prompt": "Hello", "max_tokens": 3, "temperature": 0, "frobnicate": {"x": 1}}'
    )
    assert status == 200, (status, raw)
    r = json.loads(raw)
    assert r["usage"]["completion_tokens"] <= 3, r
    assert ctx.health()["status"] == "ready"


# ---- seeds suite ---------------------------------------------------------------

SEEDED = [
    "Tell me a short story about a lighthouse.",
    "Write a haiku about rain.",
    "What should I cook tonight?",
    "Describe a cat in three sentences.",
    "Give me a name for a bakery.",
    "Explain why the sea is salty.",
    "Invent a new board game.",
    "What is a good morning routine?",
]


@check("seeds")
def seeded_requests_are_batch_independent(ctx):
    """Eight sampled requests with distinct seeds return, when sent together,
    exactly what each returns alone (seed-stable sampling)."""

    def ask(i):
        r = chat(ctx, SEEDED[i], max_tokens=48, temperature=0.8, seed=1000 + i)
        return r.choices[0].message.content, r.usage.completion_tokens, r.choices[0].finish_reason

    alone = [ask(i) for i in range(len(SEEDED))]
    together = [None] * len(SEEDED)
    errors = []

    def run(i):
        try:
            together[i] = ask(i)
        except Exception as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(SEEDED))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    same = sum(a == b for a, b in zip(alone, together))
    for i, (a, b) in enumerate(zip(alone, together)):
        assert a == b, ("%d of %d identical" % (same, len(SEEDED)), SEEDED[i], a, b)
    # Distinct seeds give distinct texts (the seed is used at all).
    assert len({a[0] for a in alone}) == len(SEEDED), alone
    print("  %d of %d seeded requests identical together and alone" % (same, len(SEEDED)))


# ---- logprobs suite ----------------------------------------------------------------

LOGPROB_REQUESTS = [
    dict(prompt="Once upon a time, in a small village by the sea,", max_tokens=24, temperature=0, logprobs=5),
    dict(prompt="Write a poem where every line starts with 'The sea is'.\nThe sea is", max_tokens=24, temperature=0,
         logprobs=2),
    dict(prompt="Tell me about the moon.", max_tokens=24, temperature=0.8, seed=1234, logprobs=3),
]


@check("logprobs")
def logprobs_equal_across_servers(ctx):
    """The values of fixed requests, written to --logprobs-file by the first
    server and compared exactly by the next (speculative against plain)."""
    got = []
    for kw in LOGPROB_REQUESTS:
        r = ctx.client.completions.create(model=MODEL, **kw)
        lp = r.choices[0].logprobs
        got.append({"text": r.choices[0].text, "tokens": lp.tokens, "token_logprobs": lp.token_logprobs,
                    "top_logprobs": lp.top_logprobs, "dspark": extra(r, "dspark")})
    path = ctx.logprobs_file
    if not os.path.exists(path):
        with open(path, "w") as f:
            json.dump(got, f)
        print("  recorded %d requests" % len(got))
        return
    with open(path) as f:
        want = json.load(f)
    for i, (a, b) in enumerate(zip(want, got)):
        for key in ("text", "tokens", "token_logprobs", "top_logprobs"):
            assert a[key] == b[key], (i, key, a[key], b[key])
    tau = [g["dspark"]["tau"] for g in got]
    print("  %d requests equal; tau here %s, there %s" % (len(got), tau, [w["dspark"]["tau"] for w in want]))


# ---- auth suite: a server started with --api-key KEY and --api-key-file --------------

KEYS = ("sk-test-one", "sk-test-file")


@check("auth")
def every_model_route_needs_a_key(ctx):
    routes = [
        ("GET", "/v1/models", None),
        ("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "temperature": 0}),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
        ("POST", "/tokenize", {"content": "Hi"}),
        ("POST", "/detokenize", {"tokens": [1]}),
    ]
    for method, path, body in routes:
        data = None if body is None else json.dumps(body).encode()
        for header, want in ((None, 401), ("Bearer wrong-key", 401), ("sk-test-one", 401), ("Bearer " + KEYS[0], 200),
                             ("bearer " + KEYS[1], 200)):
            status, headers, raw = ctx.raw(method, path, data, auth=header)
            assert status == want, (path, header, status, raw[:200])
            if want == 401:
                err = json.loads(raw)["error"]
                assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error", err
                assert headers.get("www-authenticate") == "Bearer", headers
    # /health and /metrics stay open.
    for path in ("/health", "/metrics"):
        status, _, _ = ctx.raw("GET", path)
        assert status == 200, (path, status)
    # The official client: the right key works, a wrong one is AuthenticationError.
    good = openai.OpenAI(base_url=ctx.base + "/v1", api_key=KEYS[0], max_retries=0, timeout=180 * SLOW)
    assert good.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0).usage.completion_tokens >= 1
    try:
        ctx.client.models.list()
    except openai.AuthenticationError as e:
        assert e.status_code == 401, e
    else:
        raise AssertionError("a wrong key was accepted")


# ---- ops suite: metrics, the bounded queue, deadlines (a --parallel 1 --max-queue 1 server)


def metrics(ctx):
    """The /metrics samples as {(name, frozenset(labels without model)): value}."""
    status, headers, raw = ctx.raw("GET", "/metrics")
    assert status == 200 and headers.get("content-type", "").startswith("text/plain"), (status, headers)
    out = {}
    for line in raw.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^(\w+)\{(.*)\} (\S+)$', line)
        assert m, line
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
        assert labels.pop("model") == MODEL, line
        out[(m.group(1), frozenset(labels.items()))] = float(m.group(3))
    return out


def metric(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


@check("ops")
def metrics_after_known_requests(ctx):
    before = metrics(ctx)
    rs = [complete(ctx, "The quick brown fox", max_tokens=4), complete(ctx, "Once upon a time", max_tokens=3),
          chat(ctx, "Name three colors.", max_tokens=2)]
    status, _, _ = ctx.raw("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": 0}')
    assert status == 400
    after = metrics(ctx)
    d = lambda name, **labels: metric(after, name, **labels) - metric(before, name, **labels)  # noqa: E731
    assert d("dspark_requests_total", route="/v1/completions", status="200") == 2, d
    assert d("dspark_requests_total", route="/v1/chat/completions", status="200") == 1
    assert d("dspark_requests_total", route="/v1/completions", status="400") == 1
    tokens = sum(r.usage.completion_tokens for r in rs)
    assert d("dspark_generation_tokens_total") == tokens, (d("dspark_generation_tokens_total"), tokens)
    assert d("dspark_prompt_tokens_total") == sum(r.usage.prompt_tokens for r in rs)
    assert d("dspark_time_to_first_token_seconds_count") == 3
    assert d("dspark_time_per_output_token_seconds_count") == tokens - 3
    finished = sum(d("dspark_requests_finished_total", reason=r) for r in ("stop", "length"))
    assert finished == 3, finished
    assert metric(after, "dspark_slots") == ctx.health()["parallel"]
    assert metric(after, "dspark_requests_active") == 0 and metric(after, "dspark_requests_queued") == 0
    # Histograms are cumulative and end at _count.
    buckets = sorted((float(dict(k[1])["le"].replace("+Inf", "inf")), v) for k, v in after.items()
                     if k[0] == "dspark_time_to_first_token_seconds_bucket")
    assert [v for _, v in buckets] == sorted(v for _, v in buckets), buckets
    assert buckets[-1][1] == metric(after, "dspark_time_to_first_token_seconds_count")


def long_stream(ctx):
    """A streamed request that holds the one slot until closed."""
    stream = ctx.client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=4000, temperature=0, stream=True)
    it = iter(stream)
    next(it)
    return stream


@check("ops")
def beyond_the_queue_is_503_with_retry_after(ctx):
    h = ctx.health()
    assert h["parallel"] == 1 and h["max_queue"] == 1 and h["status"] == "ready", h
    # More prompts in one request than a slot and the queue can ever hold:
    # 400, and nothing was queued (not a 503 that no retry could cure).
    status, _, raw = ctx.raw("POST", "/v1/completions", b'{"prompt": ["a", "b", "c"], "max_tokens": 2}')
    assert status == 400, (status, raw)
    assert "holds 3 prompts, but this server takes at most 2 at once" in json.loads(raw)["error"]["message"], raw
    assert ctx.health()["queued"] == 0
    holder = long_stream(ctx)
    waiting_out = {}

    def wait_in_queue():
        r = complete(ctx, "Hello", max_tokens=2)
        waiting_out["text"] = r.choices[0].text

    waiter = threading.Thread(target=wait_in_queue)
    waiter.start()
    end = time.time() + 30 * SLOW
    while ctx.raw("GET", "/health")[0] != 503:
        assert time.time() < end, ctx.raw("GET", "/health")
        time.sleep(0.05)
    status, headers, raw = ctx.raw("GET", "/health")
    assert status == 503 and json.loads(raw)["status"] == "full", raw
    status, headers, raw = ctx.raw("POST", "/v1/completions", b'{"prompt": "Hi", "max_tokens": 2}')
    assert status == 503, (status, raw)
    assert int(headers["retry-after"]) >= 1, headers
    assert "retry later" in json.loads(raw)["error"]["message"], raw
    holder.close()
    waiter.join()
    assert waiting_out.get("text") is not None, waiting_out
    wait_idle(ctx)
    assert ctx.health()["status"] == "ready"


@check("ops")
def deadlines(ctx):
    # Running: ends at its deadline with the text so far, as "length".
    r = complete(ctx, COUNTING, max_tokens=4000, extra_body={"deadline_ms": 1500})
    assert r.choices[0].finish_reason == "length" and extra(r, "dspark")["deadline_exceeded"], r
    assert 1 <= r.usage.completion_tokens < 4000, r.usage
    # Queued past its deadline behind a request holding the slot: 503.
    holder = long_stream(ctx)
    status, headers, raw = ctx.raw("POST", "/v1/completions", b'{"prompt": "Hi", "max_tokens": 2, "deadline_ms": 200}')
    holder.close()
    assert status == 503 and "retry-after" in headers, (status, headers, raw)
    assert "waited for a slot" in json.loads(raw)["error"]["message"], raw
    wait_idle(ctx)


# ---- shutdown suite: SIGTERM mid-stream (--pid: the server) ----------------------------


def read_stream(ctx, body, first_chunk):
    """A raw streamed request: returns the events; sets first_chunk once one arrived."""
    conn = http.client.HTTPConnection(ctx.host, ctx.port, timeout=120 * SLOW)
    conn.request("POST", "/v1/completions", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    events = []
    for raw in r:
        line = raw.strip()
        if line.startswith(b"data: "):
            events.append(line[6:])
            first_chunk.set()
        if line == b"data: [DONE]":
            break
    conn.close()
    return events


@check("shutdown")
def sigterm_finishes_streams_in_flight(ctx):
    """SIGTERM mid-stream: no new connections, the stream still ends with its
    final chunk (it fits in --shutdown-timeout) or, past it, with an error
    event; [DONE] either way. ctx.expect_cancel says which."""
    first = threading.Event()
    out = {}
    max_tokens = 4000 if ctx.expect_cancel else 12
    t = threading.Thread(target=lambda: out.update(events=read_stream(
        ctx, {"prompt": COUNTING, "max_tokens": max_tokens, "temperature": 0, "stream": True}, first)))
    t.start()
    assert first.wait(120 * SLOW), "no first chunk"
    os.kill(ctx.pid, signal.SIGTERM)
    # New connections are refused (or, on one already open, answered 503).
    end = time.time() + 10 * SLOW
    while True:
        try:
            status, _, _ = ctx.raw("GET", "/health", timeout=5)
            if status == 503:
                break
        except OSError:
            break
        assert time.time() < end, "still accepting requests after SIGTERM"
        time.sleep(0.05)
    t.join(300 * SLOW)
    events = out["events"]
    assert events[-1] == b"[DONE]", events[-3:]
    last = json.loads(events[-2])
    if ctx.expect_cancel:
        assert "error" in last and "shutting down" in last["error"]["message"], last
    else:
        assert last["choices"][0]["finish_reason"] == "length" and last["usage"]["completion_tokens"] == 12, last


# ---- disconnect suite ------------------------------------------------------------

COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"


def wait_idle(ctx, timeout=30):
    end = time.time() + timeout * SLOW
    while time.time() < end:
        h = ctx.health()
        if h["active"] == 0 and h["queued"] == 0:
            return h
        time.sleep(0.1)
    raise AssertionError("slot not freed: %r" % ctx.health())


def quick_request_completes(ctx):
    t0 = time.time()
    r = complete(ctx, "Hello", max_tokens=4)
    assert r.usage.completion_tokens >= 1, r
    assert time.time() - t0 < 60 * SLOW, time.time() - t0


@check("disconnect")
def client_abort_frees_slot(ctx):
    assert ctx.health()["parallel"] == 1
    done0 = ctx.health()["completed"]
    # The official client: read two chunks of a long stream, then close it.
    stream = ctx.client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=4000, temperature=0, stream=True)
    got = 0
    for ch in stream:
        got += 1
        if got == 2:
            break
    stream.close()
    h = wait_idle(ctx)
    assert h["completed"] == done0 + 1, h
    quick_request_completes(ctx)


@check("disconnect")
def socket_reset_frees_slot(ctx):
    # A raw socket that sends a streaming request and resets the connection.
    done0 = ctx.health()["completed"]
    body = json.dumps({"prompt": COUNTING, "max_tokens": 4000, "temperature": 0, "stream": True}).encode()
    s = socket.create_connection((ctx.host, ctx.port), timeout=60 * SLOW)
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
    buf = b""
    while buf.count(b"data: ") < 3:
        part = s.recv(4096)
        assert part, buf
        buf += part
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()
    h = wait_idle(ctx)
    assert h["completed"] == done0 + 1, h
    quick_request_completes(ctx)


@check("disconnect")
def non_streaming_client_that_leaves_frees_slot(ctx):
    # A non-streaming request whose client closes the connection while it
    # is being decoded is cancelled: the slot frees long before 4000 tokens,
    # and /metrics counts it as 499 (client closed), not as a 503.
    done0 = ctx.health()["completed"]
    before = metrics(ctx)
    body = json.dumps({"prompt": COUNTING, "max_tokens": 4000, "temperature": 0}).encode()
    s = socket.create_connection((ctx.host, ctx.port), timeout=60 * SLOW)
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
    end = time.time() + 60 * SLOW
    while ctx.health()["active"] == 0:
        assert time.time() < end, ctx.health()
        time.sleep(0.05)
    time.sleep(0.5)
    s.close()
    t0 = time.time()
    h = wait_idle(ctx)
    assert h["completed"] == done0 + 1, h
    assert time.time() - t0 < 10 * SLOW, time.time() - t0
    end = time.time() + 10 * SLOW
    while metric(metrics(ctx), "dspark_requests_total", route="/v1/completions", status="499") == metric(
            before, "dspark_requests_total", route="/v1/completions", status="499"):
        assert time.time() < end, "no 499 counted for the abandoned request"
        time.sleep(0.05)
    after = metrics(ctx)
    assert metric(after, "dspark_requests_total", route="/v1/completions", status="503") == metric(
        before, "dspark_requests_total", route="/v1/completions", status="503")
    quick_request_completes(ctx)


@check("disconnect")
def queued_request_waits_for_the_slot(ctx):
    # With one slot, two requests still both complete (the second waits).
    out = [None, None]

    def run(i):
        out[i] = complete(ctx, "Hello", max_tokens=6).choices[0].text

    ths = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert out[0] is not None and out[0] == out[1], out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--suite", default="full", choices=sorted(CHECKS))
    ap.add_argument("-k", default="", help="run only checks whose name contains this")
    ap.add_argument("--logprobs-file", default="", help="logprobs suite: record here, or compare with what is here")
    ap.add_argument("--pid", type=int, default=0, help="shutdown suite: the server's process id")
    ap.add_argument("--expect-cancel", action="store_true", help="shutdown suite: the stream outlasts the grace period")
    a = ap.parse_args()
    ctx = Ctx(a.base_url)
    ctx.logprobs_file = a.logprobs_file
    ctx.pid = a.pid
    ctx.expect_cancel = a.expect_cancel
    failed = 0
    for fn in CHECKS[a.suite]:
        if a.k not in fn.__name__:
            continue
        t0 = time.time()
        try:
            fn(ctx)
            print("PASS %-45s %6.1fs" % (fn.__name__, time.time() - t0), flush=True)
        except Exception:
            failed += 1
            print("FAIL %-45s %6.1fs" % (fn.__name__, time.time() - t0), flush=True)
            traceback.print_exc()
    print("%s: %d failed" % (a.suite, failed), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
