#!/usr/bin/env python3
"""Writes the tiny Qwen3 GGUFs that tests/qwen3_test.cpp checks dspark on.

  python3 scripts/golden/qwen3_tiny.py --out DIR
      -> DIR/qwen3-tiny-bf16.gguf, DIR/qwen3-tiny-q8_0.gguf

The model: a Qwen3ForCausalLM of hidden 64, 2 layers, 4 query heads and 2 KV
heads of 32 (key length != hidden / heads, as in Qwen3-0.6B), FFN 128, RoPE
base 1e6, tied embeddings, with the cut-down real Qwen3 tokenizer of
tests/golden/qwen3/tokenizer-gguf.json. Its weights come from `weights()`: a
counter-based generator (SplitMix64 of a SHA-256 key per tensor, a sum of four
uniforms for a unit-variance bell shape) with only exactly rounded arithmetic,
so every machine and numpy version computes the same bits, rounded to bf16.

The files are written with llama.cpp's own GGUF library (the `gguf` package,
GGUF_PIP in scripts/versions.env), tensors, metadata and their order as
llama.cpp's convert_hf_to_gguf.py writes them for this model (`--outtype bf16`
and `q8_0`: norms in f32, matrices in bf16 or Q8_0 by gguf.quants).
scripts/golden/make_qwen3_golden.py builds the same model in transformers,
converts it with llama.cpp's converter and requires the converter's files to
be byte for byte the ones this script writes (their SHA-256 are recorded in
golden.safetensors' metadata, and this script refuses to leave files with
other digests); it also computes the reference logits and greedy tokens the
test compares with.

Needs numpy and gguf; no model download, no PyTorch. `make build` runs it.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "tests/golden/qwen3/tokenizer-gguf.json"
GOLDEN = REPO / "tests/golden/qwen3/golden.safetensors"

# The geometry, shared with tests/qwen3_test.cpp.
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 2, 4, 2, 32, 128
ROPE_BASE, RMS_EPS, CONTEXT = 1e6, 1e-6, 512
# Of seeds 1-60, one whose greedy run varies most without near-ties (top-2 gap
# >= 0.08); chosen by make_qwen3_golden.py --pick-seed.
SEED = 23

_MASK = (1 << 64) - 1


def _uniforms(key: int, n: int) -> np.ndarray:
    """n doubles in [0, 1): SplitMix64 outputs of key + (i + 1) * golden gamma."""
    with np.errstate(over="ignore"):
        z = np.uint64(key) + (np.arange(n, dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def bell(seed: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Mean 0, variance 1: (u1 + u2 + u3 + u4 - 2) * sqrt(3), summed left to right."""
    key = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & _MASK
    n = math.prod(shape)
    u = _uniforms(key, 4 * n).reshape(n, 4)
    s = ((u[:, 0] + u[:, 1]) + u[:, 2]) + u[:, 3]
    return ((s - 2.0) * math.sqrt(3.0)).reshape(shape)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bits, round to nearest even (no NaN here)."""
    b = x.astype(np.float32).view(np.uint32)
    return ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def bf16_round(x: np.ndarray) -> np.ndarray:
    return (to_bf16_bits(x).astype(np.uint32) << np.uint32(16)).view(np.float32)


def hf_shapes(vocab: int) -> dict[str, tuple[int, ...]]:
    """transformers' parameter names and shapes ([out, in] for matrices)."""
    s = {"model.embed_tokens.weight": (vocab, HIDDEN), "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        s |= {p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
              p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
              p + "self_attn.q_norm.weight": (HEAD_DIM,), p + "self_attn.k_norm.weight": (HEAD_DIM,),
              p + "mlp.gate_proj.weight": (FFN, HIDDEN), p + "mlp.up_proj.weight": (FFN, HIDDEN),
              p + "mlp.down_proj.weight": (HIDDEN, FFN)}
    return s


def weights(vocab: int, seed: int = SEED) -> dict[str, np.ndarray]:
    """Every parameter (transformers' names), fp32 holding bf16 values.

    A useful scale (HF's 0.02-scale init makes every logit ~0): matrices
    ~ (0, 1/in), the embedding ~ (0, 0.3^2) and the blocks' output projections
    doubled, so that the blocks, not the tied embedding's self-similarity,
    decide the next token and greedy decoding does not just repeat it; norms
    ~ 1 + (0, 0.1^2).
    """
    out = {}
    for name, shape in hf_shapes(vocab).items():
        n = bell(seed, name, shape)
        if "norm" in name:
            w = 1.0 + 0.1 * n
        elif "embed_tokens" in name:
            w = 0.3 * n
        elif "o_proj" in name or "down_proj" in name:
            w = 2.0 * n / math.sqrt(shape[1])
        else:
            w = n / math.sqrt(shape[1])
        out[name] = bf16_round(w)
    return out


def gguf_tensors() -> list[tuple[str, str]]:
    """(GGUF name, transformers name) in the converter's order."""
    order = [("token_embd.weight", "model.embed_tokens.weight")]
    for i in range(LAYERS):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        order += [(b + "attn_norm.weight", p + "input_layernorm.weight"),
                  (b + "ffn_down.weight", p + "mlp.down_proj.weight"),
                  (b + "ffn_gate.weight", p + "mlp.gate_proj.weight"),
                  (b + "ffn_up.weight", p + "mlp.up_proj.weight"),
                  (b + "ffn_norm.weight", p + "post_attention_layernorm.weight"),
                  (b + "attn_k_norm.weight", p + "self_attn.k_norm.weight"),
                  (b + "attn_k.weight", p + "self_attn.k_proj.weight"),
                  (b + "attn_output.weight", p + "self_attn.o_proj.weight"),
                  (b + "attn_q_norm.weight", p + "self_attn.q_norm.weight"),
                  (b + "attn_q.weight", p + "self_attn.q_proj.weight"),
                  (b + "attn_v.weight", p + "self_attn.v_proj.weight")]
    return order + [("output_norm.weight", "model.norm.weight")]


def load_tokenizer(path: Path = TOKENIZER) -> dict:
    try:
        tok = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        sys.exit(f"qwen3_tiny: cannot read the tokenizer arrays {path}: {e}")
    need = ("tokens", "token_type", "merges", "eos_token_id", "padding_token_id", "bos_token_id",
            "add_bos_token", "chat_template")
    missing = [k for k in need if k not in tok]
    if missing or len(tok["tokens"]) != len(tok["token_type"]):
        sys.exit(f"qwen3_tiny: {path} must hold {', '.join(need)} with one type per token; "
                 f"missing {missing}, {len(tok.get('tokens', []))} tokens, {len(tok.get('token_type', []))} types")
    return tok


def write_gguf(path: Path, outtype: str, w: dict[str, np.ndarray], tok: dict) -> None:
    """One GGUF (outtype bf16 or q8_0), written to a temporary file and renamed."""
    import gguf
    qtype = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[outtype]
    ftype = {"bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype]
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    os.close(fd)
    try:
        wr = gguf.GGUFWriter(tmp, "qwen3")
        wr.add_type(gguf.GGUFType.MODEL)
        wr.add_name("Qwen3 Tiny")
        wr.add_size_label("305K")
        wr.add_block_count(LAYERS)
        wr.add_context_length(CONTEXT)
        wr.add_embedding_length(HIDDEN)
        wr.add_feed_forward_length(FFN)
        wr.add_head_count(HEADS)
        wr.add_head_count_kv(KV_HEADS)
        wr.add_rope_freq_base(ROPE_BASE)
        wr.add_layer_norm_rms_eps(RMS_EPS)
        wr.add_key_length(HEAD_DIM)
        wr.add_value_length(HEAD_DIM)
        wr.add_file_type(ftype)
        wr.add_quantization_version(gguf.GGML_QUANT_VERSION)
        wr.add_tokenizer_model("gpt2")
        wr.add_tokenizer_pre("qwen2")
        wr.add_token_list(tok["tokens"])
        wr.add_token_types(tok["token_type"])
        wr.add_token_merges(tok["merges"])
        wr.add_eos_token_id(tok["eos_token_id"])
        wr.add_pad_token_id(tok["padding_token_id"])
        wr.add_bos_token_id(tok["bos_token_id"])
        wr.add_add_bos_token(tok["add_bos_token"])
        wr.add_chat_template(tok["chat_template"])
        for gname, hname in gguf_tensors():
            x = w[hname]
            if x.ndim == 1:
                wr.add_tensor(gname, x.astype(np.float32))
            else:
                wr.add_tensor(gname, gguf.quants.quantize(x.astype(np.float32), qtype), raw_dtype=qtype)
        wr.write_header_to_file()
        wr.write_kv_data_to_file()
        wr.write_tensors_to_file()
        wr.close()
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def recorded_digests(golden: Path) -> dict[str, str]:
    """sha256_bf16 / sha256_q8_0 from a safetensors file's __metadata__."""
    try:
        with golden.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            meta = json.loads(f.read(n)).get("__metadata__", {})
    except (OSError, ValueError) as e:
        sys.exit(f"qwen3_tiny: cannot read the golden header of {golden}: {e}")
    digests = {k: meta.get(f"sha256_{k}") for k in ("bf16", "q8_0")}
    if None in digests.values():
        sys.exit(f"qwen3_tiny: {golden} records no sha256_bf16 / sha256_q8_0 (made by an older "
                 "make_qwen3_golden.py?)")
    return digests


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for qwen3-tiny-{bf16,q8_0}.gguf")
    ap.add_argument("--tokenizer", type=Path, default=TOKENIZER, help="the tokenizer arrays (JSON)")
    ap.add_argument("--golden", type=Path, default=GOLDEN, help="golden.safetensors recording the digests")
    ap.add_argument("--no-check", action="store_true", help="skip the digest check (while making goldens)")
    args = ap.parse_args()
    if importlib.util.find_spec("gguf") is None:
        sys.exit("qwen3_tiny: needs the Python package gguf (GGUF_PIP in scripts/versions.env; make setup)")
    tok = load_tokenizer(args.tokenizer)
    w = weights(len(tok["tokens"]))
    args.out.mkdir(parents=True, exist_ok=True)
    want = None if args.no_check else recorded_digests(args.golden)
    for outtype in ("bf16", "q8_0"):
        path = args.out / f"qwen3-tiny-{outtype}.gguf"
        write_gguf(path, outtype, w, tok)
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        if want is not None and got != want[outtype]:
            path.unlink()
            sys.exit(f"qwen3_tiny: wrote {path.name} with SHA-256 {got}, but {args.golden} was made from "
                     f"{want[outtype]}; numpy or gguf differ from NUMPY_PIP / GGUF_PIP in "
                     "scripts/versions.env, or the goldens need make_qwen3_golden.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
