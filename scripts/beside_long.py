#!/usr/bin/env python3
"""A short chat request beside a long prompt: its time to first token (TTFT)
and per-token latency alone and when sent 0.2 s after a long prompt.

    python3 scripts/beside_long.py --binary build/dspark -- --parallel 8 -t 2 -c 8192
    python3 scripts/beside_long.py --binary build/dspark -- --parallel 8 -t 2 -c 8192 --prefill-slowdown 0

Each round sends the short request alone, then the long prompt (about
--long-tokens tokens of dev prompts, streamed, max_tokens 4) and, --delay
seconds later, the short request again. Both short requests are streamed,
greedy, with logprobs, so per-token latency is the time from the first to
the last token over the tokens after the first. Prints each round and the
medians of the ratios beside / alone. Starts the server on a free port and
stops it with SIGTERM; loopback only.
"""

import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serve import ROOT, Server, load_prompts  # noqa: E402
from load_serve import long_prompt_text  # noqa: E402
from soak import send  # noqa: E402

SHORT = "Write a short poem about the sea."


def chat(content, max_tokens):
    return {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "dspark"))
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("--long-tokens", type=int, default=4000, help="approximate length of the long prompt")
    ap.add_argument("-n", "--max-tokens", type=int, default=64, help="max_tokens of the short request")
    ap.add_argument("--delay", type=float, default=0.2, help="seconds between the long prompt and the short request")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompts", default=os.path.join(ROOT, "data", "dev-prompts.jsonl"))
    ap.add_argument("serve_args", nargs="*", help="options for `dspark serve` (after --)")
    a = ap.parse_args()

    long_text = long_prompt_text(load_prompts(a.prompts), a.long_tokens)
    server = Server(a.binary, ["-m", a.model] + a.serve_args)
    port = server.port
    ratios = {"ttft": [], "per_token": []}
    try:
        for i in range(a.rounds):
            alone = send(port, "/v1/chat/completions", chat(SHORT, a.max_tokens), True, True)
            long_out = {}
            t = threading.Thread(target=lambda: long_out.update(r=send(
                port, "/v1/chat/completions", chat(long_text, 4), True, True)))
            t.start()
            time.sleep(a.delay)
            beside = send(port, "/v1/chat/completions", chat(SHORT, a.max_tokens), True, True)
            t.join()
            long_r = long_out["r"]
            for r in (alone, beside, long_r):
                if r.error or r.ttft is None:
                    sys.exit("round %d: request failed: %s" % (i, r.error))
            if alone.text != beside.text:
                sys.exit("round %d: the short answer beside the long prompt differs from alone" % i)
            ratios["ttft"].append(beside.ttft / alone.ttft)
            ratios["per_token"].append(beside.per_token / alone.per_token)
            print("round %d: short alone TTFT %.3f s, %.1f ms/token | beside the long prompt TTFT %.3f s, "
                  "%.1f ms/token (%d tokens) | long prompt TTFT %.1f s" % (
                      i, alone.ttft, 1000 * alone.per_token, beside.ttft, 1000 * beside.per_token,
                      beside.completion_tokens, long_r.ttft), flush=True)
    finally:
        server.stop()
    print("median beside/alone: TTFT %.2fx, per-token latency %.2fx" % (
        statistics.median(ratios["ttft"]), statistics.median(ratios["per_token"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
