#!/usr/bin/env python3
"""DSpark drafters written and run by an independent implementation: DeepSpec.

Builds three small random drafters with DeepSpec's own modeling code
(Qwen3DSparkModel with a vanilla Markov head, a gated Markov head and an RNN
head; confidence head on [h ; W1[x_prev]]), saves each with DeepSpec's
save_pretrained (config.json + model.safetensors: the layout `dspark import
--format hf` reads), and records what DeepSpec computes for one drafting pass:

  context       [C, m*d] f32  the tapped target features of positions 0..C-1
  anchor        [1] i64       the anchor token, at position C
  block_hidden  [g, d] f32    DeepSpec's _forward_backbone on [anchor, MASK x (g-1)]
                               (non-causal, KV injection, positions 0..C+g-1)
  base_logits   [g, V] f32    compute_logits(block_hidden)
  logits        [g, V] f32    base_logits + the sequential head's bias along the
                               greedy path (sample_draft_tokens, temperature 0)
  tokens        [g] i64       the greedy draft
  conf_logits   [g] f32       predict_confidence_step on [h_k ; W1[x_{k-1}]]

into tests/golden/deepspec/<head>/golden.safetensors. tests/deepspec_golden_test.cpp
imports each drafter into dspark (with a tiny target whose embedding and LM head
are the drafter's embed_tokens and lm_head) and reproduces these values within
bf16 tolerance. Weights are rounded to bf16 and DeepSpec runs in fp32, so the
reference is exact for the stored weights.

Pins (scripts/versions.env): DeepSpec at DEEPSPEC_COMMIT (the four files used
are checked by SHA-256 below), and DEEPSPEC_TORCH_PIP / DEEPSPEC_TRANSFORMERS_PIP
/ DEEPSPEC_SAFETENSORS_PIP, DeepSpec's own requirements:

  git clone https://github.com/deepseek-ai/DeepSpec /tmp/deepspec
  git -C /tmp/deepspec checkout afdfa7c9382a3341a3e6f17756dd816da79f132c
  python3 -m venv /tmp/ds-venv && /tmp/ds-venv/bin/pip install torch==2.9.1 transformers==5.10.2 safetensors==0.7.0
  /tmp/ds-venv/bin/python scripts/golden/make_deepspec_golden.py --deepspec /tmp/deepspec

Runs on CPU in a few seconds; the output is about 0.3 MB.
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests/golden/deepspec"

DEEPSPEC_COMMIT = "afdfa7c9382a3341a3e6f17756dd816da79f132c"
PINNED_FILES = {
    "deepspec/modeling/dspark/qwen3/modeling.py": "9ad90bcb926b32b5144e8a27816ef18b51e9e5ee083108c5fbd8f63bc92b3953",
    "deepspec/modeling/dspark/markov_head.py": "6659bcdc12d923d4fc16cc2280c03078c2110a4792305e1f3f42b5468f75ef46",
    "deepspec/modeling/dspark/common.py": "45273cf6c806cdb1ad249df3e3b4d4dd34be47e74ae342608f60ede39febd088",
    "deepspec/utils/sampling.py": "8f8ff58387e70526452672372628d1b2fbacb778a89f1a46abc9e2b7639d215a",
}

# The tiny geometry, shared with tests/deepspec_golden_test.cpp.
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 4, 2, 16, 128
VOCAB = 262            # the tiny Llama vocabulary of tests/test_util.hpp
TARGET_LAYERS = 2      # tiny target depth; taps are the outputs of layers 0 and 1
BLOCK, RANK, MASK_ID, CONTEXT, ANCHOR = 5, 32, 261, 9, 100


def check_sources(root: Path) -> None:
    for rel, want in PINNED_FILES.items():
        got = hashlib.sha256((root / rel).read_bytes()).hexdigest()
        if got != want:
            sys.exit(f"{root / rel}: SHA-256 {got}, expected {want} (DeepSpec commit {DEEPSPEC_COMMIT})")


def build(head: str, seed: int):
    import torch
    from transformers import Qwen3Config
    from deepspec.modeling.dspark.qwen3.modeling import Qwen3DSparkModel

    cfg = Qwen3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=2,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
        rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=256, tie_word_embeddings=False,
    )
    cfg.architectures = ["Qwen3DSparkModel"]
    cfg.layer_types = ["full_attention"] * 2
    cfg.num_target_layers = TARGET_LAYERS
    cfg.block_size = BLOCK
    cfg.target_layer_ids = [0, 1]
    cfg.mask_token_id = MASK_ID
    cfg.num_anchors = 16
    cfg.enable_confidence_head = True
    cfg.confidence_head_with_markov = True
    cfg.markov_rank = RANK
    cfg.markov_head_type = head
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Qwen3DSparkModel(cfg).float().eval()
    # Unit-scale random weights (DeepSpec's init is 0.02-scale and leaves
    # the Markov projection tiny), rounded to bf16 so the stored file is exact.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn_like(p))
            elif "embed_tokens" in name or "markov_w1" in name:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            p.copy_(p.to(torch.bfloat16).float())
    return model


def run(model) -> dict:
    import torch

    g = torch.Generator().manual_seed(7)
    context = torch.randn(1, CONTEXT, 2 * HIDDEN, generator=g)
    ids = torch.tensor([[ANCHOR] + [MASK_ID] * (BLOCK - 1)])
    positions = torch.arange(CONTEXT + BLOCK).unsqueeze(0)
    with torch.no_grad():
        hidden = model._forward_backbone(
            position_ids=positions, noise_embedding=model.embed_tokens(ids), target_hidden_states=context,
            attention_mask=None, past_key_values=None, use_cache=False, is_causal=False)
        base = model.compute_logits(hidden)
        tokens, logits = model.sample_draft_tokens(
            base, first_prev_token_ids=ids[:, 0], temperature=0.0, hidden_states=hidden)
        prev = torch.cat([ids[:, :1], tokens[:, :-1]], dim=1)
        conf = model.predict_confidence_step(hidden, prev_token_ids=prev)
    return {
        "context": context[0].contiguous(),
        "anchor": torch.tensor([ANCHOR], dtype=torch.int64),
        "block_hidden": hidden[0].float().contiguous(),
        "base_logits": base[0].float().contiguous(),
        "logits": logits[0].float().contiguous(),
        "tokens": tokens[0].to(torch.int64).contiguous(),
        "conf_logits": conf[0].float().contiguous(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deepspec", type=Path, required=True, help=f"DeepSpec checkout at {DEEPSPEC_COMMIT}")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    check_sources(args.deepspec)
    sys.path.insert(0, str(args.deepspec))
    import torch
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    for seed, head in enumerate(["vanilla", "gated", "rnn"], start=1):
        model = build(head, seed)
        out = args.out / head
        shutil.rmtree(out, ignore_errors=True)
        model.to(torch.bfloat16).save_pretrained(out)
        model.float()
        save_file(run(model), str(out / "golden.safetensors"),
                  metadata={"deepspec_commit": DEEPSPEC_COMMIT, "torch": torch.__version__})
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
