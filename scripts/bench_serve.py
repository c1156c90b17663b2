#!/usr/bin/env python3
"""Load benchmark of `dspark serve` with the official `openai` client.

Sends N requests (default 200) at concurrency C (default 8), each a chat
request for a prompt of the dev set with max_tokens -n (default 64), and
reports errors, aggregate completion tokens/s, the median per-request
tokens/s (completion tokens / request latency) and the mean τ reported in the
responses' "dspark" object. Prompts whose "kind" is "completion" (e.g.
data/completion-prompts.jsonl, for a base model such as gemma3) go to
/v1/completions as text to continue. With several configurations at
temperature 0, it also counts the answers that differ from the first
configuration's to the same request.

Against a running server:
    python3 scripts/bench_serve.py --base-url http://127.0.0.1:8080

Or start the server configurations one after another (each on a free port):
plain (--drafter none), fixed-γ speculative (--drafter DIR --sps none: every
drafted position that survives pruning is verified) and scheduled speculative
(--drafter DIR --sps PROFILE: the prefix scheduler picks verify lengths):
    python3 scripts/bench_serve.py --binary build/dspark --drafter DIR [--sps measure]

Install the client with the pin in scripts/versions.env (OPENAI_PIP).
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_prompts(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                out.append((row["prompt"], row.get("kind") == "completion"))
    if not out:
        sys.exit("%s: no prompts" % path)
    return out


def run_load(base_url, prompts, n_requests, concurrency, max_tokens, temperature, model):
    client = openai.OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=3600)

    def one(i):
        t0 = time.perf_counter()
        text, completion = prompts[i % len(prompts)]
        try:
            if completion:
                r = client.completions.create(
                    model=model, prompt=text, max_tokens=max_tokens, temperature=temperature, seed=i
                )
                answer = r.choices[0].text
            else:
                r = client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": text}],
                    max_tokens=max_tokens,
                    temperature=temperature,
                    seed=i,
                )
                answer = r.choices[0].message.content
        except Exception as e:  # counted as an error
            return {"error": repr(e)}
        dt = time.perf_counter() - t0
        stats = r.to_dict().get("dspark", {})
        return {"tokens": r.usage.completion_tokens, "latency": dt, "tau": stats.get("tau", 0.0), "answer": answer}

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, range(n_requests)))
    wall = time.perf_counter() - t0
    ok = [r for r in results if "tokens" in r]
    errors = [r["error"] for r in results if "error" in r]
    tokens = sum(r["tokens"] for r in ok)
    per_req = [r["tokens"] / r["latency"] for r in ok if r["latency"] > 0]
    return {
        "requests": n_requests,
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "wall_s": wall,
        "completion_tokens": tokens,
        "aggregate_tok_s": tokens / wall if wall > 0 else 0.0,
        "median_request_tok_s": statistics.median(per_req) if per_req else 0.0,
        "median_latency_s": statistics.median([r["latency"] for r in ok]) if ok else 0.0,
        "mean_tau": statistics.mean([r["tau"] for r in ok]) if ok else 0.0,
        "answers": [r.get("answer") for r in results],
    }


class Server:
    """`dspark serve` on a free port; stopped with SIGTERM."""

    def __init__(self, binary, args):
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        cmd = [binary, "serve", "--host", "127.0.0.1", "--port", "0"] + args
        print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None
        for _ in range(6000):
            time.sleep(0.1)
            with open(self.log.name, encoding="utf-8", errors="replace") as f:
                m = re.search(r"listening on http://[^:]+:(\d+)", f.read())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                break
        if self.port is None:
            with open(self.log.name, encoding="utf-8", errors="replace") as f:
                sys.exit("server did not start:\n" + f.read())
        self.url = "http://127.0.0.1:%d" % self.port
        # It listens while the model loads: wait for /health to say "ready".
        for _ in range(6000):
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (OSError, urllib.error.URLError):
                pass
            if self.proc.poll() is not None:
                with open(self.log.name, encoding="utf-8", errors="replace") as f:
                    sys.exit("server exited:\n" + f.read())
            time.sleep(0.1)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.unlink(self.log.name)


def report(name, r):
    print(
        "%-22s errors %3d | %6.1f tok/s aggregate | %6.2f tok/s per request (median) | "
        "latency %6.2f s (median) | tau %.2f | %d tokens in %.1f s"
        % (
            name,
            r["errors"],
            r["aggregate_tok_s"],
            r["median_request_tok_s"],
            r["median_latency_s"],
            r["mean_tau"],
            r["completion_tokens"],
            r["wall_s"],
        ),
        flush=True,
    )
    if r["first_error"]:
        print("  first error: " + r["first_error"], flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", help="a running server (otherwise --binary starts the configurations)")
    ap.add_argument("--binary", help="the dspark binary to start servers with")
    ap.add_argument("--drafter", help="drafter directory for the speculative configurations")
    ap.add_argument("--sps", default="measure", help="profile for the scheduled configuration (FILE or 'measure')")
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-N", "--requests", type=int, default=200)
    ap.add_argument("-C", "--concurrency", type=int, default=8)
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--prompts", default=os.path.join(ROOT, "data", "dev-prompts.jsonl"))
    ap.add_argument("--only", default="", help="comma-separated configurations: plain,fixed,scheduled")
    ap.add_argument("--json", action="store_true", help="print one JSON object at the end")
    a = ap.parse_args()
    prompts = load_prompts(a.prompts)
    results = {}
    if a.base_url:
        results["server"] = run_load(a.base_url, prompts, a.requests, a.concurrency, a.max_tokens, a.temperature, a.model)
        report("server", results["server"])
    else:
        if not a.binary:
            sys.exit("give --base-url or --binary")
        common = ["-m", a.model, "-t", str(a.threads), "--parallel", str(a.concurrency)]
        configs = [("plain", common + ["--drafter", "none"])]
        if a.drafter:
            configs.append(("fixed", common + ["--drafter", a.drafter, "--sps", "none"]))
            configs.append(("scheduled", common + ["--drafter", a.drafter, "--sps", a.sps]))
        if a.only:
            keep = a.only.split(",")
            configs = [c for c in configs if c[0] in keep]
        for name, args in configs:
            server = Server(a.binary, args)
            try:
                results[name] = run_load(
                    server.url, prompts, a.requests, a.concurrency, a.max_tokens, a.temperature, a.model
                )
            finally:
                server.stop()
            report(name, results[name])
    names = list(results)
    if a.temperature == 0 and len(names) > 1:
        first = results[names[0]]["answers"]
        for name in names[1:]:
            differ = sum(1 for x, y in zip(first, results[name]["answers"]) if x is not None and y is not None and x != y)
            print("%s: %d of %d answers differ from %s's" % (name, differ, len(first), names[0]), flush=True)
    if a.json:
        print(json.dumps(results, indent=2))
    return 1 if any(r["errors"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
