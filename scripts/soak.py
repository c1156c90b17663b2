#!/usr/bin/env python3
"""Soak test of an OpenAI-compatible server: mixed traffic for a set time,
every answer checked.

    python3 scripts/soak.py --minutes 10                    # starts build/dspark serve
    python3 scripts/soak.py --minutes 1 --binary PATH -- --parallel 8 --drafter none
    python3 scripts/soak.py --minutes 10 --llama-server ~/.cache/llamacpp/build/bin/llama-server -- -np 8

Traffic: chat and completion requests, streamed and not, greedy and seeded
(temperature 0.8, seed-stable on dspark), short prompts and long ones
(--long-tokens), and streams whose client disconnects after a few chunks.
The run has three phases of equal length at 1, 4 and 8 concurrent clients
(--clients). Everything is loopback only, and bounded: --max-requests per
phase, max_tokens of --max-tokens at most.

Checks:
  * no HTTP 5xx and no transport error (deliberate disconnects aside);
  * usage.completion_tokens equals the tokens the answer carries (one
    logprobs entry per emitted token; --no-logprobs turns this off for a
    server without them);
  * every greedy and seeded answer equals the same request sent alone: after
    the phases, each distinct request that was answered is sent once more,
    alone, and every answer recorded for it must equal that one.
Reports per phase: requests, errors, p50/p99 time to first token and
per-token latency of streamed requests, aggregate tokens/s; and the server's
RSS at the start, after each phase (the first is the warm-up) and at the end. Exit
status 1 when a check fails. --json FILE writes the figures.

The server is started on 127.0.0.1 (a free port) and stopped with SIGTERM:
`dspark serve` from --binary (default build/dspark) with the arguments after
`--`, or llama.cpp's `llama-server` with --llama-server PATH (-m is the
GGUF file of --model resolved as dspark does: an alias or a path).
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from proc_stats import percentile, rss_mib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALIASES = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}

SHORT = [
    "What is the capital of France?",
    "Name three colors.",
    "Write a haiku about the sea.",
    "Give me a synonym for happy.",
    "Who wrote Hamlet?",
    "List two prime numbers.",
    "Describe a cat in one sentence.",
    "Why is the sky blue?",
]
LONG_BASE = (
    "The lighthouse keeper climbed the stairs every evening, counted the steps, trimmed the wick and "
    "wrote the weather into a leather book. Ships passed in the night and the sea kept its own counsel. "
)


def model_path(model):
    if os.path.isfile(model):
        return model
    home = os.environ.get("DSPARK_HOME", os.path.expanduser("~/.cache/dspark"))
    return os.path.join(home, "models", ALIASES.get(model, model))


class ServerProcess:
    """A server on 127.0.0.1 and a free port, stopped with SIGTERM."""

    def __init__(self, cmd, port_from_log):
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.port = port_from_log
        deadline = time.time() + 600
        while time.time() < deadline:
            time.sleep(0.2)
            if self.port is None:
                m = re.search(r"listening on http://[^:]+:(\d+)", self.text())
                self.port = int(m.group(1)) if m else None
            if self.port is not None and self.healthy():
                return
            if self.proc.poll() is not None:
                break
        sys.exit("the server did not become ready:\n" + self.text()[-4000:])

    def text(self):
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def healthy(self):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            return r.status == 200
        except OSError:
            return False

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        os.unlink(self.log.name)
        return rc


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the request pool ---------------------------------------------------------


def make_pool(rng, long_tokens, max_tokens):
    """Request specs: (key, endpoint, body, checked). Checked requests are
    greedy or seeded, so their answer must not depend on the traffic."""
    long_text = (LONG_BASE * (1 + 4 * long_tokens // len(LONG_BASE)))[: 4 * long_tokens]
    long_prompts = [long_text + "\n\nQuestion %d: in one sentence, what does the keeper do?" % i for i in range(2)]
    pool = []
    for i, p in enumerate(SHORT + long_prompts):
        is_long = i >= len(SHORT)
        for chat in (True, False):
            for mode in ("greedy", "seeded", "unseeded"):
                body = {"model": "m", "max_tokens": rng.randint(max(2, max_tokens // 2), max_tokens)}
                if chat:
                    body["messages"] = [{"role": "user", "content": p}]
                else:
                    body["prompt"] = p if is_long else "Question: %s\nAnswer:" % p
                if mode == "greedy":
                    body["temperature"] = 0
                else:
                    body["temperature"] = 0.8
                    if mode == "seeded":
                        body["seed"] = 1000 + i
                key = "%s/%s/%d/%s" % ("chat" if chat else "cmpl", mode, i, "long" if is_long else "short")
                pool.append((key, "/v1/chat/completions" if chat else "/v1/completions", body, mode != "unseeded"))
    return pool


# ---- one request -----------------------------------------------------------------


class Result:
    def __init__(self):
        self.status = None
        self.text = ""
        self.completion_tokens = None
        self.emitted = 0  # logprobs entries: tokens the answer carried
        self.ttft = None
        self.per_token = None
        self.error = None
        self.disconnected = False


def with_logprobs(endpoint, body, on):
    b = dict(body)
    if on:
        if endpoint == "/v1/chat/completions":
            b["logprobs"] = True
        else:
            b["logprobs"] = 0
    return b


def count_logprobs(lp):
    if not lp:
        return 0
    if "content" in lp:
        return len(lp["content"] or [])
    return len(lp.get("tokens") or [])


def send(port, endpoint, body, stream, logprobs, disconnect_after=0, timeout=600):
    """One request; streamed ones record the time to the first text and the
    mean interval between later chunks' tokens."""
    r = Result()
    b = with_logprobs(endpoint, body, logprobs)
    if stream:
        b["stream"] = True
        b["stream_options"] = {"include_usage": True}
    data = json.dumps(b).encode()
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", endpoint, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        r.status = resp.status
        if resp.status != 200:
            r.error = "HTTP %d: %s" % (resp.status, resp.read()[:300])
            return r
        if not stream:
            j = json.loads(resp.read())
            c = j["choices"][0]
            r.text = c["message"]["content"] if "message" in c else c["text"]
            r.completion_tokens = j["usage"]["completion_tokens"]
            r.emitted = count_logprobs(c.get("logprobs"))
            return r
        chunks, t_first, t_last, tokens_after_first = 0, None, None, 0
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            payload = line[6:]
            if payload == b"[DONE]":
                break
            j = json.loads(payload)
            if "error" in j:
                r.error = "stream error: %s" % j["error"]
                return r
            if j.get("usage"):
                r.completion_tokens = j["usage"]["completion_tokens"]
            for c in j.get("choices", []):
                piece = (c.get("delta") or {}).get("content") if "delta" in c else c.get("text")
                n = count_logprobs(c.get("logprobs"))
                r.emitted += n
                if piece or n:
                    now = time.perf_counter()
                    if t_first is None:
                        t_first = now
                    else:
                        tokens_after_first += max(n, 1)
                    t_last = now
                if piece:
                    r.text += piece
                    chunks += 1
            if disconnect_after and chunks >= disconnect_after:
                r.disconnected = True
                conn.sock.shutdown(socket.SHUT_RDWR)
                return r
        if t_first is not None:
            r.ttft = t_first - t0
            if tokens_after_first > 0:
                r.per_token = (t_last - t_first) / tokens_after_first
        return r
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        r.error = "%s: %s" % (type(e).__name__, e)
        return r
    finally:
        conn.close()


# ---- the run ---------------------------------------------------------------------


class Phase:
    def __init__(self, clients):
        self.clients = clients
        self.results = []  # (key, stream, Result)
        self.lock = threading.Lock()
        self.wall = 0.0
        self.rss_mib = None  # the server's RSS at the end of the phase


def run_phase(port, pool, phase, seconds, max_requests, logprobs, seed):
    deadline = time.time() + seconds
    counter = [0]

    def client(ci):
        rng = random.Random(seed * 1000 + ci)
        while time.time() < deadline:
            with phase.lock:
                if counter[0] >= max_requests:
                    return
                counter[0] += 1
            key, endpoint, body, checked = pool[rng.randrange(len(pool))]
            stream = rng.random() < 0.5
            disconnect = 2 if stream and rng.random() < 0.1 else 0
            res = send(port, endpoint, body, stream, logprobs, disconnect)
            with phase.lock:
                phase.results.append((key, stream, res))

    t0 = time.time()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(phase.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    phase.wall = time.time() - t0


def summarize(phase):
    done = [r for _, _, r in phase.results if not r.disconnected]
    errors = [r for r in done if r.error]
    fivexx = [r for r in done if r.status is not None and r.status >= 500]
    ttft = [r.ttft for _, s, r in phase.results if s and r.ttft is not None and not r.disconnected]
    tpot = [r.per_token for _, s, r in phase.results if s and r.per_token is not None and not r.disconnected]
    tokens = sum(r.completion_tokens or 0 for r in done if not r.error)
    return {
        "clients": phase.clients,
        "requests": len(phase.results),
        "disconnects": sum(r.disconnected for _, _, r in phase.results),
        "errors": len(errors),
        "http_5xx": len(fivexx),
        "first_error": errors[0].error if errors else None,
        "ttft_p50_s": percentile(ttft, 0.5),
        "ttft_p99_s": percentile(ttft, 0.99),
        "tpot_p50_s": percentile(tpot, 0.5),
        "tpot_p99_s": percentile(tpot, 0.99),
        "completion_tokens": tokens,
        "aggregate_tok_s": tokens / phase.wall if phase.wall > 0 else 0.0,
        "wall_s": phase.wall,
        "rss_mib": phase.rss_mib,
    }


def fmt(x, unit=""):
    return "-" if x is None else ("%.3f%s" % (x, unit))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the three phases together")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "dspark"), help="the dspark binary")
    ap.add_argument("--llama-server", help="soak llama.cpp's llama-server (this binary) instead of dspark")
    ap.add_argument("-m", "--model", default="smollm2", help="model alias or GGUF path")
    ap.add_argument("--clients", default="1,4,8", help="concurrent clients of each phase")
    ap.add_argument("--max-tokens", type=int, default=24, help="the most tokens a request asks for")
    ap.add_argument("--long-tokens", type=int, default=600, help="about how long the long prompts are")
    ap.add_argument("--max-requests", type=int, default=5000, help="the most requests of one phase")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-logprobs", action="store_true", help="do not ask for logprobs (no token count check)")
    ap.add_argument("--no-solo-check", action="store_true", help="skip the solo re-run of every answered request")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("server_args", nargs="*", help="after --: arguments of the server")
    a = ap.parse_args()

    if a.llama_server:
        port = free_port()
        cmd = [a.llama_server, "-m", model_path(a.model), "--host", "127.0.0.1", "--port", str(port)] + a.server_args
        server = ServerProcess(cmd, port)
    else:
        cmd = [a.binary, "serve", "-m", a.model, "--host", "127.0.0.1", "--port", "0"] + a.server_args
        server = ServerProcess(cmd, None)
    pid, port = server.proc.pid, server.port
    logprobs = not a.no_logprobs
    rng = random.Random(a.seed)
    pool = make_pool(rng, a.long_tokens, a.max_tokens)
    clients = [int(c) for c in a.clients.split(",")]
    seconds = 60.0 * a.minutes / len(clients)

    rss = {"start": rss_mib(pid)}
    phases = []
    for i, n in enumerate(clients):
        ph = Phase(n)
        run_phase(port, pool, ph, seconds, a.max_requests, logprobs, a.seed + i)
        phases.append(ph)
        ph.rss_mib = rss_mib(pid)
        if i == 0:
            rss["after_warmup"] = ph.rss_mib
        s = summarize(ph)
        print("phase %d clients: %d requests (%d disconnects), %d errors, %d 5xx | TTFT p50 %s p99 %s | "
              "per token p50 %s p99 %s | %.1f tok/s | RSS %s MiB" % (
                  n, s["requests"], s["disconnects"], s["errors"], s["http_5xx"], fmt(s["ttft_p50_s"], " s"),
                  fmt(s["ttft_p99_s"], " s"), fmt(s["tpot_p50_s"], " s"), fmt(s["tpot_p99_s"], " s"),
                  s["aggregate_tok_s"], fmt(ph.rss_mib)), flush=True)
    rss["end"] = rss_mib(pid)

    failures = []
    for ph in phases:
        for key, _, r in ph.results:
            if r.disconnected:
                continue
            if r.error:
                failures.append("%s: %s" % (key, r.error))
            elif logprobs and r.completion_tokens != r.emitted:
                failures.append("%s: usage.completion_tokens %s but %d tokens emitted" % (key, r.completion_tokens,
                                                                                          r.emitted))
    # Greedy and seeded answers against the same request alone.
    mismatches, compared = 0, 0
    if not a.no_solo_check:
        answers = {}
        for ph in phases:
            for key, _, r in ph.results:
                if not r.disconnected and not r.error:
                    answers.setdefault(key, []).append(r.text)
        specs = {key: (endpoint, body) for key, endpoint, body, checked in pool if checked}
        for key in sorted(answers):
            if key not in specs:
                continue
            endpoint, body = specs[key]
            solo = send(port, endpoint, body, False, logprobs)
            if solo.error:
                failures.append("%s alone: %s" % (key, solo.error))
                continue
            for text in answers[key]:
                compared += 1
                if text != solo.text:
                    mismatches += 1
                    failures.append("%s: %r differs from the request alone: %r" % (key, text[:80], solo.text[:80]))
    rc = server.stop()

    growth = None
    if rss.get("after_warmup") and rss.get("end"):
        growth = rss["end"] / rss["after_warmup"] - 1.0
    print("RSS: start %s MiB, after warm-up %s MiB, end %s MiB (growth after warm-up %s)" % (
        fmt(rss["start"]), fmt(rss.get("after_warmup")), fmt(rss["end"]),
        "-" if growth is None else "%.1f%%" % (100 * growth)))
    print("checked answers: %d compared with the request alone, %d differ; %d failures; server exit %d" % (
        compared, mismatches, len(failures), rc))
    for f in failures[:20]:
        print("  " + f)
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:  # written whole, then renamed into place
            json.dump({"server": "llama-server" if a.llama_server else "dspark", "command": cmd,
                       "phases": [summarize(p) for p in phases], "rss_mib": rss, "rss_growth_after_warmup": growth,
                       "compared": compared, "mismatches": mismatches, "failures": failures, "exit_status": rc},
                      f, indent=1)
        os.replace(tmp, a.json)
    return 1 if failures or rc != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
