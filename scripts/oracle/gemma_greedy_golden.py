#!/usr/bin/env python3
"""Greedy (argmax) reference continuations from llama.cpp for the completion
prompts, on the Gemma 3 270M GGUF: writes tests/golden/llamacpp_gemma_greedy.json,
checked by tests/parity_test.cpp (the Gemma3 instance of LlamaCppParity).

Each prompt of data/completion-prompts.jsonl (a base model: plain text, no
chat template) is tokenized by llama.cpp (/tokenize, BOS added, special tokens
parsed, as llama-completion -p does) and decoded greedily by llama-server for
32 new tokens: temperature 0 (llama.cpp's greedy sampler), no penalties, no
prompt-cache reuse between prompts, stopping early only at an end-of-generation
token (kept as the last generated token, stopped_at_eog: true). Attention runs
in fp32 (fp32 KV cache, flash attention off: llama.cpp's CPU flash attention
rounds queries to fp16 and accumulates in fp16). `top2` holds
for every generated position llama.cpp's two most probable next tokens with
their softmax probabilities over the whole vocabulary (n_probs = 2, computed
before sampling); ln(p1 / p2) is llama.cpp's logit gap between them. Four of
the prompts are longer than Gemma's 512-token sliding window.

Usage: python3 scripts/oracle/gemma_greedy_golden.py [--model GGUF] [--prompts JSONL]
       [--out JSON] [--max-tokens 32] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=llamacpp.default_model())
    ap.add_argument("--prompts", type=Path, default=llamacpp.REPO / "data" / "completion-prompts.jsonl")
    ap.add_argument("--out", type=Path, default=llamacpp.REPO / "tests" / "golden" / "llamacpp_gemma_greedy.json")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    prompts = [json.loads(l) for l in args.prompts.read_text().splitlines() if l.strip()]
    results = []
    # The most precise attention llama.cpp offers: an fp32 KV cache and no
    # flash attention (whose CPU path rounds Q to fp16 and accumulates P.V in
    # fp16); the weights and their int8 activation products are unchanged.
    precise = ["--flash-attn", "off", "--cache-type-k", "f32", "--cache-type-v", "f32"]
    with llamacpp.server(args.model, args.threads, ctx=4096, extra=precise) as srv:
        props = srv.get("/props")
        eog = sorted({props.get("eos_token_id", 1), 1, 106})  # <eos>; <end_of_turn> is an EOG token in llama.cpp
        for p in prompts:
            toks = srv.post("/tokenize", {"content": p["prompt"], "add_special": True, "parse_special": True})["tokens"]
            r = srv.post("/completion", {
                "prompt": toks, "n_predict": args.max_tokens, "temperature": 0.0, "top_k": 1,
                "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
                "n_probs": 2, "post_sampling_probs": False, "cache_prompt": False, "return_tokens": True,
                "ignore_eos": False, "stream": False,
            })
            gen = list(r["tokens"])
            top2 = []
            for step in r["completion_probabilities"]:
                pair = step["top_logprobs"][:2]
                top2.append([[c["id"], float(f"{math.exp(c['logprob']):.7g}")] for c in pair])
                if pair[0]["id"] != step["id"] and pair[0]["logprob"] != step["logprob"]:
                    raise SystemExit(f"{p['id']}: greedy token {step['id']} is not the most probable")
            # At an end-of-generation token the server's tokens end with it.
            stopped = r.get("stop_type") == "eos"
            if stopped and (not gen or gen[-1] not in eog):
                raise SystemExit(f"{p['id']}: stopped at end of generation, but the tokens end with {gen[-1:]}")
            results.append({
                "id": p["id"], "kind": p.get("kind", "completion"), "prompt": p["prompt"], "prompt_tokens": toks,
                "generated_tokens": gen, "generated_text": r["content"], "stopped_at_eog": stopped,
                "top2": top2[:len(gen)],
            })
            print(f"{p['id']}: {len(toks)} prompt tokens, {len(gen)} generated{' (EOG)' if stopped else ''}",
                  file=sys.stderr)

    out = {
        "model_file": args.model.name,
        "model_sha256": llamacpp.sha256_file(args.model),
        "llama_cpp_build": llamacpp.build_id(),
        "oracle": "llama-server (llama.cpp built from source), CPU",
        "backend": "cpu",
        "threads": args.threads,
        "tokenization": "llama.cpp /tokenize: BOS added, special tokens parsed (as llama-completion -p)",
        "decoding": "greedy (temperature 0), no penalties, no prompt cache reuse",
        "server_options": " ".join(precise),
        "eog_tokens": eog,
        "max_new_tokens": args.max_tokens,
        "top2": True,
        "top2_note": "per generated position: llama.cpp's two most probable next tokens and their softmax "
                     "probabilities over the whole vocabulary (before sampling)",
        "prompts": results,
    }
    args.out.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
