#!/usr/bin/env python3
"""Regenerates tests/golden/gemma_tokenizer.jsonl, the SentencePiece tokenizer
parity oracle on the real Gemma 3 270M GGUF.

Two independent references encode every case:

  * llama.cpp's own tokenizer: llama_tokenize, the call behind
    `llama-tokenize`, driven for the whole corpus by one process
    (scripts/oracle/llamacpp_tokenize_batch.cpp, compiled against the llama.cpp
    tree) and spot-checked against the `llama-tokenize` binary itself (no BOS;
    special tokens parsed or not) — the reference the engine's ids must equal;
  * Hugging Face `tokenizers`, configured from the same GGUF metadata: a BPE
    model with byte fallback whose merges are derived from the vocabulary
    scores the way transformers converts a SentencePiece model
    (SentencePieceExtractor: every split of a piece into two pieces, ranked by
    the piece's score, ties in vocabulary order), normalizer " " -> "▁" (no
    dummy prefix: tokenizer.ggml.add_space_prefix is false), user-defined
    tokens added as non-special tokens and control tokens as special ones
    (only when special tokens are parsed). HF's merge-rank BPE and
    SentencePiece's score-based merging agree on almost every text; the file
    records where they do not.

The cases are the SmolLM2 tokenizer corpus (make_tokenizer_golden.py: unicode,
emoji, whitespace runs, digits, code, URLs, contractions, odd code points,
long texts, random strings) plus Gemma's own markers, HTML-like user-defined
tokens and newline runs, each encoded with special tokens parsed, and a set
of texts encoded with special-token parsing off.

Usage:  python3 scripts/golden/make_gemma_tokenizer_golden.py [--model PATH] [--out PATH]
Pins:   GGUF_PIP and HF_TOKENIZERS_PIP in scripts/versions.env (checked).
Output: a header line (model, versions, counts), then one JSON object per case:
  {"name", "text", "parse_special", "ids" (llama.cpp), "hf_ids" (present only
   when HF differs)}
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "oracle"))
import gguf  # noqa: E402
import llamacpp  # noqa: E402
from make_tokenizer_golden import case_strings, check_pins, literal_cases  # noqa: E402
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers  # noqa: E402

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6


def read_vocab(path: Path) -> dict:
    r = gguf.GGUFReader(str(path))

    def arr(key):
        f = r.fields[key]
        if f.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]

    model = bytes(r.fields["tokenizer.ggml.model"].parts[-1]).decode()
    if model != "llama":
        sys.exit(f"expected tokenizer.ggml.model 'llama', got {model!r}")
    return {"tokens": arr("tokenizer.ggml.tokens"), "scores": arr("tokenizer.ggml.scores"),
            "types": arr("tokenizer.ggml.token_type")}


def build_hf(v: dict, parse_special: bool) -> Tokenizer:
    tokens, scores, types = v["tokens"], v["scores"], v["types"]
    vocab = {t: i for i, t in enumerate(tokens)}
    mergeable = {t for t, ty in zip(tokens, types) if ty not in (CONTROL, BYTE, UNKNOWN)}
    merges = []
    for i, piece in enumerate(tokens):
        if piece not in mergeable or vocab[piece] != i:
            continue
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece))
                 if piece[:k] in mergeable and piece[k:] in mergeable]
        local.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
        merges += [(l, r, scores[i]) for l, r in local]
    merges.sort(key=lambda m: m[2], reverse=True)  # stable: ties keep vocabulary order
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(l, r) for l, r, _ in merges], unk_token="<unk>",
                               fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == USER_DEFINED])
    if parse_special:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, ty in zip(tokens, types) if ty == CONTROL])
    return tok


def gemma_cases() -> list[tuple[str, str]]:
    texts = [
        "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad><unk><mask>",
        "<start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\n",
        "Hello<eos>World", "<unused0><unused1> <unused99>", "<start_of_image><end_of_image>[multimodal]",
        "<h1>Title</h1>\n<p>Some <b>bold</b> text.</p>", "</footer></iframe><table><tr><td>1</td></tr></table>",
        "\n\n", "\n\n\n\n\n\n\n", "a\n\n\n\nb", "  \n\n  \n", "\t\t\t\tdeep", "x" + " " * 31 + "y",
        "<start_of_turn", "start_of_turn>", "<<start_of_turn>>", "<START_OF_TURN>",
    ]
    return [(f"gemma-{i:02d}", t) for i, t in enumerate(texts)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=llamacpp.default_model())
    ap.add_argument("--out", type=Path, default=llamacpp.REPO / "tests" / "golden" / "gemma_tokenizer.jsonl")
    ap.add_argument("--allow-version-mismatch", action="store_true")
    args = ap.parse_args()
    versions = check_pins(args.allow_version_mismatch)
    v = read_vocab(args.model)
    hf = {True: build_hf(v, True), False: build_hf(v, False)}
    cases = [(n, t, True) for n, t in case_strings([]) + gemma_cases()]
    cases += [(n, t, False) for n, t in literal_cases() + [("literal-gemma-" + n, t) for n, t in gemma_cases()]]
    all_ids = llamacpp.tokenize_batch(args.model, [(t, ps) for _, t, ps in cases])
    # Spot check: the llama-tokenize binary itself gives the same ids.
    for k in range(0, len(cases), max(1, len(cases) // 8)):
        if llamacpp.tokenize(args.model, cases[k][1], cases[k][2]) != all_ids[k]:
            sys.exit(f"{cases[k][0]}: llama-tokenize and llama_tokenize disagree")
    records, hf_diff = [], 0
    for (name, text, parse_special), ids in zip(cases, all_ids):
        rec = {"name": name, "text": text, "parse_special": parse_special, "ids": ids}
        hf_ids = hf[parse_special].encode(text, add_special_tokens=False).ids
        if hf_ids != ids:
            rec["hf_ids"] = hf_ids
            hf_diff += 1
        records.append(rec)
    header = {"kind": "header", "model_file": args.model.name, "model_sha256": llamacpp.sha256_file(args.model),
              "llama_cpp_build": llamacpp.build_id(), "versions": versions, "cases": len(records),
              "hf_differs": hf_diff}
    with open(args.out, "w", encoding="utf-8") as f:
        for r in [header] + records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}: {len(records)} cases, HF tokenizers differs from llama.cpp on {hf_diff}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
