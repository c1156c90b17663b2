#!/usr/bin/env python3
"""Load test of `dspark serve`: short chat requests at a fixed concurrency, run
twice — alone, then with one long prompt (~6,000 tokens by default) sent
mid-run — reporting errors, the short requests' time to first token (TTFT)
and the server's memory.

Each short request is a streamed chat request for a prompt of the dev set
(max_tokens -n); its TTFT is the time to the first chunk that carries text.
The long request is sent when half of the second run's short requests have
been sent. "During the long prompt" are the short requests that started
after it was sent and before its first token came back.

Starts the server itself (on a free port, stopped with SIGTERM):
    python3 scripts/load_serve.py --binary build/dspark [-- serve options...]
or uses a running one (memory figures need --pid):
    python3 scripts/load_serve.py --base-url http://127.0.0.1:8080 --pid PID

Install the client with the pin in scripts/versions.env (OPENAI_PIP).
"""

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serve import ROOT, Server, load_prompts  # noqa: E402
from proc_stats import percentile, rss_mib  # noqa: E402


def p99(values):
    """Nearest-rank 99th percentile (None for no values)."""
    return percentile(values, 0.99)


def long_prompt_text(prompts, tokens):
    """Dev prompts joined until roughly `tokens` tokens (~4 characters each)."""
    parts, size, i = [], 0, 0
    while size < 4 * tokens:
        parts.append(prompts[i % len(prompts)])
        size += len(parts[-1]) + 1
        i += 1
    return "Summarize the following questions in one sentence.\n" + "\n".join(parts)


def streamed(client, model, content, max_tokens, temperature):
    """One streamed chat request: (ttft seconds or None, total seconds, prompt tokens)."""
    t0 = time.perf_counter()
    ttft, usage = None, None
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        temperature=temperature,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and ttft is None:
            ttft = time.perf_counter() - t0
        if chunk.usage:
            usage = chunk.usage
    return ttft, time.perf_counter() - t0, usage.prompt_tokens if usage else None


def run(base_url, prompts, a, with_long):
    client = openai.OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=3600)
    results = [None] * a.requests
    long_box = {}
    sent = [0]
    lock = threading.Lock()

    def send_long():
        long_box["sent"] = time.perf_counter()
        try:
            ttft, total, n = streamed(client, a.model, long_prompt_text(prompts, a.long_tokens), 16, 0.0)
            long_box.update(ttft=ttft, total=total, prompt_tokens=n)
        except Exception as e:  # counted as an error
            long_box["error"] = repr(e)
        long_box["first_token"] = long_box["sent"] + (long_box.get("ttft") or 0.0)

    long_thread = threading.Thread(target=send_long)

    def one(i):
        with lock:
            sent[0] += 1
            if with_long and sent[0] == a.requests // 2:
                long_thread.start()
        start = time.perf_counter()
        try:
            ttft, total, _ = streamed(client, a.model, prompts[i % len(prompts)], a.max_tokens, a.temperature)
            results[i] = {"start": start, "ttft": ttft, "total": total}
        except Exception as e:  # counted as an error
            results[i] = {"start": start, "error": repr(e)}

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=a.concurrency) as pool:
        list(pool.map(one, range(a.requests)))
    if with_long:
        long_thread.join()
    wall = time.perf_counter() - t0
    ok = [r for r in results if "ttft" in r and r["ttft"] is not None]
    errors = [r["error"] for r in results if "error" in r] + ([long_box["error"]] if "error" in long_box else [])
    out = {
        "requests": a.requests,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "wall_s": wall,
        "ttft_p50_s": sorted(r["ttft"] for r in ok)[len(ok) // 2] if ok else None,
        "ttft_p99_s": p99([r["ttft"] for r in ok]),
        "ttft_max_s": max((r["ttft"] for r in ok), default=None),
    }
    if with_long:
        during = [r["ttft"] for r in ok if long_box["sent"] <= r["start"] <= long_box.get("first_token", 0)]
        out["long"] = {k: long_box.get(k) for k in ("prompt_tokens", "ttft", "total")}
        out["during_long_requests"] = len(during)
        out["during_long_ttft_p99_s"] = p99(during)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", help="a running server (otherwise --binary starts one)")
    ap.add_argument("--pid", type=int, help="the running server's process id (memory figures)")
    ap.add_argument("--binary", help="the dspark binary to start the server with")
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-N", "--requests", type=int, default=200)
    ap.add_argument("-C", "--concurrency", type=int, default=8)
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--long-tokens", type=int, default=6000, help="approximate length of the long prompt")
    ap.add_argument("--prompts", default=os.path.join(ROOT, "data", "dev-prompts.jsonl"))
    ap.add_argument("serve_args", nargs="*", help="options for `dspark serve` (after --)")
    a = ap.parse_args()
    prompts = load_prompts(a.prompts)
    server = None
    if a.base_url:
        url, pid = a.base_url, a.pid
    else:
        if not a.binary:
            sys.exit("give --base-url or --binary")
        server = Server(a.binary, ["-m", a.model, "-c", "8192"] + a.serve_args)
        url, pid = server.url, server.proc.pid
    try:
        report = {"rss_start_mib": rss_mib(pid)}
        report["without_long"] = run(url, prompts, a, False)
        report["rss_after_first_run_mib"] = rss_mib(pid)
        report["with_long"] = run(url, prompts, a, True)
        time.sleep(2)
        report["rss_after_second_run_mib"] = rss_mib(pid)
        report["with_long"]["ttft_p99_ratio"] = (
            report["with_long"]["ttft_p99_s"] / report["without_long"]["ttft_p99_s"]
            if report["without_long"]["ttft_p99_s"]
            else None
        )
    finally:
        if server:
            server.stop()
    print(json.dumps(report, indent=2))
    errors = report["without_long"]["errors"] + report["with_long"]["errors"]
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
