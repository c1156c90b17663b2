#!/usr/bin/env python3
"""dspark side by side with llama.cpp on one target file, prompt set, gamma and thread count.

Rows, each at every --temps temperature:
  llama.cpp plain            llama-server, no speculation
  llama.cpp ngram-mod        llama-server --spec-type ngram-mod (drafts of up to gamma tokens)
  llama.cpp ngram-map-k      llama-server --spec-type ngram-map-k (m-grams of gamma tokens)
  llama.cpp draft-dspark     llama-server --spec-type draft-dspark with the drafter
                             exported by `dspark export --format gguf`
  dspark plain / DSpark      `dspark bench` (plain and speculative in one process,
                             the default --compute quant and --schedule auto)
  dspark DSpark+lookup       the same with prompt-lookup drafts (--lookup-ngram N)
  dspark lookup              prompt-lookup drafts alone (--drafter none)

llama.cpp rows run either llama-server (--harness server: /v1/chat/completions,
the GGUF's chat template; decode tokens/s = sum(predicted_n) / sum(predicted_ms))
or one process per prompt (--harness cli, the default when there is no
llama-server: llama-completion for plain decoding, eval runs / eval time;
llama-speculative-simple for the drafters, tokens / decode time), on the
prompt as the GGUF's ChatML template renders it (default system turn
included), as `dspark bench --chat`-style encoding does; the script checks that
both engines see the same prompt lengths. tau = tokens per target forward =
tokens / (tokens - accepted drafts) (each verification pass emits its
accepted drafts plus one target token).
Each run visits every row once, rows in turn, so the machine's load falls on
all of them alike; tokens/s is the median over runs, tau pools all runs.
Sampling as llama.cpp's defaults (top-k 40, top-p 0.95, min-p 0.05) at the
given temperature; llama.cpp's draft-dspark drafts greedily and verifies by
exact match against the target's sample, dspark verifies with min(1, p/q).

Usage:
  scripts/bench_spec_vs_llamacpp.py [--runs 3] [--out bench.json]
  (defaults: -m ~/.cache/dspark/models/SmolLM2-135M-Instruct.Q4_1.gguf,
   --drafter drafters/smollm2, --prompts ../shared/data/dev-prompts.jsonl,
   --gamma 7, --threads 2, -n 128, --temps 0,0.7,
   --llamacpp ~/.cache/llamacpp/build/bin, --dspark build/dspark)
Needs only the Python standard library.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOME = Path(os.environ.get("DSPARK_HOME", Path.home() / ".cache/dspark"))


def default_prompts() -> Path:
    shared = REPO.parent / "shared/data/dev-prompts.jsonl"
    return shared if shared.exists() else REPO / "data/dev-prompts.jsonl"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, path: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Server:
    """One llama-server process for one llama.cpp row."""

    def __init__(self, name: str, args: argparse.Namespace, extra: list[str], logdir: Path):
        self.name, self.port = name, free_port()
        cmd = [str(args.llamacpp / "llama-server"), "-m", str(args.model), "-t", str(args.threads),
               "-tb", str(args.threads), "-c", "4096", "-np", "1", "--port", str(self.port),
               "--host", "127.0.0.1", "--no-webui", *extra]
        self.log = open(logdir / f"{name}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while True:
            if self.proc.poll() is not None:
                sys.exit(f"llama-server for {name} exited with {self.proc.returncode}: see {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                sys.exit(f"llama-server for {name} did not become ready: see {self.log.name}")
            time.sleep(0.5)

    def run(self, prompts: list[dict], args: argparse.Namespace, temp: float) -> dict:
        n = ms = accepted = drafted = 0
        prompt_n = []
        for i, p in enumerate(prompts):
            body = {"messages": [{"role": "user", "content": p["prompt"]}], "max_tokens": args.n_predict,
                    "temperature": temp, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
                    "seed": args.seed + i, "stream": False, "cache_prompt": False}
            t = post(self.port, "/v1/chat/completions", body)["timings"]
            n += t["predicted_n"]
            ms += t["predicted_ms"]
            accepted += t.get("draft_n_accepted", 0)
            drafted += t.get("draft_n", 0)
            prompt_n.append(t["prompt_n"])
        return {"tok_s": n / (ms / 1e3), "tokens": n, "accepted": accepted, "drafted": drafted,
                "tau": n / (n - accepted) if n > accepted else float("nan"), "prompt_n": prompt_n}

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def gguf_strings(path: Path, keys: set[str]) -> dict[str, str]:
    """The string metadata values of `keys` in a GGUF file (stdlib-only reader)."""
    import struct
    out: dict[str, str] = {}
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        def u32() -> int: return struct.unpack("<I", f.read(4))[0]
        def u64() -> int: return struct.unpack("<Q", f.read(8))[0]
        def string() -> str: return f.read(u64()).decode("utf-8", "replace")
        def skip(t: int) -> None:
            if t == 8:
                f.seek(u64(), 1)
            elif t == 9:
                et, n = u32(), u64()
                if et in sizes:
                    f.seek(sizes[et] * n, 1)
                else:
                    for _ in range(n):
                        skip(et)
            else:
                f.seek(sizes[t], 1)
        if f.read(4) != b"GGUF":
            sys.exit(f"{path}: not a GGUF file")
        u32(); u64(); n_kv = u64()
        for _ in range(n_kv):
            key, t = string(), u32()
            if key in keys and t == 8:
                out[key] = string()
            else:
                skip(t)
    return out


def chatml_prompt(model: Path, user: str) -> str:
    """The prompt as a ChatML template renders one user message (with the
    template's default system turn, as SmolLM2's writes one)."""
    import re
    tpl = gguf_strings(model, {"tokenizer.chat_template"}).get("tokenizer.chat_template", "")
    if "<|im_start|>" not in tpl:
        sys.exit(f"{model}: --harness cli needs a ChatML chat template")
    m = re.search(r"'<\|im_start\|>system\n(.*?)<\|im_end\|>\n'", tpl, re.S)
    system = f"<|im_start|>system\n{m.group(1)}<|im_end|>\n" if m else ""
    return f"{system}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


class Cli:
    """One llama.cpp process per prompt for one row."""

    def __init__(self, name: str, args: argparse.Namespace, extra: list[str], logdir: Path):
        self.name, self.extra, self.logdir = name, extra, logdir

    def run(self, prompts: list[dict], args: argparse.Namespace, temp: float) -> dict:
        import re
        n = acc = drafted = 0
        secs = 0.0
        prompt_n = []
        tool = "llama-completion" if not self.extra else "llama-speculative-simple"
        for i, p in enumerate(prompts):
            cmd = [str(args.llamacpp / tool), "-m", str(args.model), "-p", chatml_prompt(args.model, p["prompt"]),
                   "-n", str(args.n_predict), "--temp", str(temp), "--top-k", "40", "--top-p", "0.95",
                   "--min-p", "0.05", "--seed", str(args.seed + i), "-t", str(args.threads), "-tb",
                   str(args.threads), "-c", "4096", *self.extra]
            if not self.extra:
                cmd += ["-no-cnv", "--no-warmup"]
            for attempt in range(3):  # a process that ends without its timings is run again
                r = subprocess.run(cmd, capture_output=True, text=True)
                (self.logdir / f"{self.name}-{i}.log").write_text(r.stderr)
                if r.returncode == 0 and ("eval time" in r.stderr or "decoded" in r.stderr):
                    break
            else:
                sys.exit(f"{tool} failed on prompt {i}: see {self.logdir / f'{self.name}-{i}.log'}")
            err = r.stderr
            if not self.extra:
                pe = re.search(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens", err)
                ev = re.search(r"\seval time =\s*([\d.]+) ms /\s*(\d+) runs", err)
                prompt_n.append(int(pe.group(1)))
                n += int(ev.group(2))
                secs += float(ev.group(1)) / 1e3
            else:
                dec = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", err)
                prompt_n.append(int(re.search(r"encoded\s+(\d+) tokens", err).group(1)))
                n += int(dec.group(1))
                secs += float(dec.group(2))
                acc += int(re.search(r"n_accept\s*=\s*(\d+)", err).group(1))
                drafted += int(re.search(r"n_drafted\s*=\s*(\d+)", err).group(1))
        return {"tok_s": n / secs, "tokens": n, "accepted": acc, "drafted": drafted,
                "tau": n / (n - acc) if n > acc else float("nan"), "prompt_n": prompt_n}

    def close(self) -> None:
        pass


def dspark_bench(args: argparse.Namespace, temp: float, extra: tuple[str, ...] = (), drafter: str | None = None) -> dict:
    cmd = [str(args.dspark), "bench", "-m", str(args.model), "--drafter", drafter or str(args.drafter), "--gamma",
           str(args.gamma), "-t", str(args.threads), "-n", str(args.n_predict), "--runs", "1", "--temp",
           str(temp), "--prompts", str(args.prompts), "--seed", str(args.seed), "--json", "--limit", str(args.limit), *extra]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    agg = out["aggregate"]
    return {"plain_tok_s": agg["plain_tok_s"], "spec_tok_s": agg["spec_tok_s"], "tau": agg["tau"],
            "accepted": agg["accepted"], "drafted": agg["drafted"], "target_calls": agg["target_calls"],
            "tokens": sum(r.get("plain_tokens", 0) for r in out["prompts"]),
            "lossless": agg["lossless"], "by_position": agg["acceptance_by_position"], "prompt_n": [r["prompt_tokens"] for r in out["prompts"]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, default=HOME / "models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--drafter", type=Path, default=REPO / "drafters/smollm2")
    ap.add_argument("--prompts", type=Path, default=default_prompts())
    ap.add_argument("--gamma", type=int, default=7)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("--temps", default="0,0.7")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lookup-ngram", type=int, default=2,
                    help="shortest n-gram of dspark's prompt-lookup rows (dspark --lookup-ngram)")
    ap.add_argument("--limit", type=int, default=0, help="first N prompts only (0 = all)")
    ap.add_argument("--llamacpp", type=Path, default=Path.home() / ".cache/llamacpp/build/bin")
    ap.add_argument("--dspark", type=Path, default=REPO / "build/dspark")
    ap.add_argument("--harness", choices=["server", "cli"],
                    help="how llama.cpp runs (default: server when llama-server is built, else cli)")
    ap.add_argument("--out", type=Path, help="write every figure as JSON here")
    ap.add_argument("--keep-servers", action="store_true",
                    help="one llama.cpp process per row for all runs (its n-gram memory then spans runs)")
    args = ap.parse_args()
    prompts = [json.loads(l) for l in args.prompts.read_text().splitlines() if l.strip()]
    if args.limit:
        prompts = prompts[: args.limit]
    temps = [float(t) for t in args.temps.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-vs-llamacpp-"))
    gguf = work / "drafter.gguf"
    subprocess.run([str(args.dspark), "export", "-m", str(args.model), "--drafter", str(args.drafter),
                    "--format", "gguf", "-o", str(gguf)], check=True)
    g = str(args.gamma)
    rows = {
        "llama.cpp plain": [],
        "llama.cpp ngram-mod": ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", g, "--spec-ngram-mod-n-min", "1"],
        "llama.cpp ngram-map-k": ["--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-m", g],
        "llama.cpp draft-dspark": ["--spec-type", "draft-dspark", "-md", str(gguf), "--spec-draft-n-max", g],
    }
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load_start = os.getloadavg()
    harness = args.harness or ("server" if (args.llamacpp / "llama-server").exists() else "cli")
    runner = Server if harness == "server" else Cli
    # Fresh llama.cpp processes for every run (unless --keep-servers): the
    # n-gram drafters keep a server-wide n-gram memory across requests, and a
    # run repeats the prompts of the run before it, so a kept server drafts
    # the previous run's answers. Each `dspark bench` is a fresh process too.
    start = lambda: {name: runner(name.split()[-1], args, extra, work) for name, extra in rows.items()}
    servers = start()
    lk = str(args.lookup_ngram)
    # dspark rows: (--drafter, extra flags); each `dspark bench` call also
    # measures plain decoding, pooled into the "dspark plain" row.
    dspark_rows = {
        "dspark DSpark": (None, ("--lookup-ngram", "0")),
        "dspark DSpark+lookup": (None, ("--lookup-ngram", lk)),
        "dspark lookup": ("none", ("--lookup-ngram", lk)),
    }
    results: dict = {t: {name: [] for name in [*rows, *dspark_rows]} for t in temps}
    try:
        for run in range(args.runs):
            if run > 0 and not args.keep_servers:
                for s in servers.values():
                    s.close()
                servers = start()
            for t in temps:
                for name, server in servers.items():
                    results[t][name].append(server.run(prompts, args, t))
                    print(f"run {run + 1}/{args.runs} T={t} {name}: {results[t][name][-1]['tok_s']:.1f} tok/s",
                          file=sys.stderr)
                for name, (drafter, extra) in dspark_rows.items():
                    results[t][name].append(dspark_bench(args, t, extra, drafter))
                    d = results[t][name][-1]
                    print(f"run {run + 1}/{args.runs} T={t} {name}: plain {d['plain_tok_s']:.1f}, speculative "
                          f"{d['spec_tok_s']:.1f} tok/s", file=sys.stderr)
        # Acceptance at T = 0 with every drafted token verified, as llama.cpp
        # does (dspark's default scheduler verifies fewer under load).
        full = dspark_bench(args, 0.0, ("--schedule", "off", "--lookup-ngram", "0")) if 0.0 in temps else None
    finally:
        for s in servers.values():
            s.close()

    def pooled_tau(runs: list[dict]) -> float:
        n = sum(r["tokens"] for r in runs)
        acc = sum(r["accepted"] for r in runs)
        return n / (n - acc) if n > acc else float("nan")

    table = []
    for t in temps:
        ds = results[t]["dspark DSpark"]
        if ds[0]["prompt_n"] != results[t]["llama.cpp plain"][0]["prompt_n"]:
            print(f"warning: prompt lengths differ between llama.cpp and dspark at T={t}", file=sys.stderr)
        for name in rows:
            rr = results[t][name]
            table.append({"row": name, "temp": t, "tok_s": statistics.median(r["tok_s"] for r in rr),
                          "tau": pooled_tau(rr) if name != "llama.cpp plain" else 1.0,
                          "accept_rate": (sum(r["accepted"] for r in rr) / max(1, sum(r["drafted"] for r in rr)))})
        all_ds = [r for name in dspark_rows for r in results[t][name]]
        table.append({"row": "dspark plain", "temp": t, "tok_s": statistics.median(r["plain_tok_s"] for r in all_ds),
                      "tau": 1.0, "accept_rate": None})
        for name in dspark_rows:
            ds = results[t][name]
            table.append({"row": name, "temp": t, "tok_s": statistics.median(r["spec_tok_s"] for r in ds),
                          "tau": sum(r["tau"] * r["target_calls"] for r in ds) / sum(r["target_calls"] for r in ds),
                          "accept_rate": sum(r["accepted"] for r in ds) / max(1, sum(r["drafted"] for r in ds))})
    print(f"\nllama.cpp via {harness}; {len(prompts)} prompts, -n {args.n_predict}, gamma {args.gamma}, {args.threads} threads, "
          f"{args.runs} runs (median tok/s), {started}, load {load_start[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"{'row':<24} {'T':>4} {'tok/s':>8} {'tau':>6} {'accept':>7} {'vs llama.cpp plain':>19}")
    for r in table:
        base = next(x["tok_s"] for x in table if x["temp"] == r["temp"] and x["row"] == "llama.cpp plain")
        acc = "-" if r["accept_rate"] is None else f"{r['accept_rate']:.2f}"
        print(f"{r['row']:<24} {r['temp']:>4} {r['tok_s']:>8.1f} {r['tau']:>6.2f} {acc:>7} {r['tok_s'] / base:>18.2f}x")
    for t in temps:
        ours = next(x["tok_s"] for x in table if x["temp"] == t and x["row"] == "dspark DSpark")
        theirs = next(x["tok_s"] for x in table if x["temp"] == t and x["row"] == "llama.cpp draft-dspark")
        print(f"T={t}: dspark DSpark / llama.cpp draft-dspark = {ours / theirs:.2f}x")
    if full is not None:
        ll = results[0.0]["llama.cpp draft-dspark"]
        print(f"acceptance at T=0, every draft verified: dspark tau {full['tau']:.2f} (accepted/drafted "
              f"{full['accepted'] / max(1, full['drafted']):.3f}, by position "
              f"{' '.join(f'{a:.2f}' for a in full['by_position'])}); llama.cpp draft-dspark tau "
              f"{pooled_tau(ll):.2f} (accepted/drafted {sum(r['accepted'] for r in ll) / max(1, sum(r['drafted'] for r in ll)):.3f})")
    if args.out:
        args.out.write_text(json.dumps({"full_verify_t0": full, "started": started, "host": platform.node(), "cpus": os.cpu_count(),
                                        "load_start": load_start, "load_end": os.getloadavg(),
                                        "args": {k: str(v) for k, v in vars(args).items()}, "harness": harness,
                                        "table": table, "runs": {str(t): results[t] for t in temps}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
