#!/usr/bin/env python3
"""Muon + AdamW reference steps, written by an independent NumPy implementation.

Writes tests/golden/muon/muon_steps.json, which tests/train_optimizer_test.cpp
reproduces with dspark's optimizer (include/dspark/train/optimizer.hpp):

  newton_schulz  inputs and outputs of the quintic Newton-Schulz iteration
                 (coefficients 3.4445, -4.7750, 2.0315; 5 steps; X / max(|X|_F, eps);
                 transposed when the matrix has more rows than columns), as in
                 Keller Jordan's reference Muon and torch.optim.Muon (PyTorch 2.9);
  runs           a few parameters (Muon matrices, one of them tall, and AdamW
                 tensors: a vector and a matrix that Muon must not touch), three
                 steps with given gradients, and the parameters after each step,
                 for two option sets (Nesterov momentum with the "original"
                 learning-rate scale sqrt(max(1, A/B)) and weight decay; plain
                 momentum with the "match_rms_adamw" scale 0.2*sqrt(max(A, B))).

Everything runs in float64 (PyTorch runs Newton-Schulz in bf16; the C++ test
runs dspark's optimizer on fp64 tensors against these values, and on fp32 with
a looser tolerance). The update rules, written out here from the published
algorithms (no PyTorch needed):

  Muon    buf = mu*buf + (1-mu)*g;  u = (1-mu)*g + mu*buf (Nesterov) or buf
          p = p*(1 - lr*wd) - lr*scale(A, B)*NS5(u)
  AdamW   p = p*(1 - lr*wd); m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2
          p = p - lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)       (torch.optim.AdamW)

Usage:  python3 scripts/golden/make_muon_golden.py [--out PATH]
Pins:   NUMPY_PIP in scripts/versions.env (numpy==2.4.6):
        python3 -m pip install "numpy==2.4.6"
Runs in well under a second; the output is about 50 KB.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests/golden/muon/muon_steps.json"

NS_COEFFS = (3.4445, -4.7750, 2.0315)


def newton_schulz(g: np.ndarray, steps: int = 5, eps: float = 1e-7) -> np.ndarray:
    a, b, c = NS_COEFFS
    tall = g.shape[0] > g.shape[1]
    x = g.T.copy() if tall else g.copy()
    x = x / max(np.linalg.norm(x), eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def lr_scale(shape, mode: str) -> float:
    rows, cols = shape
    if mode == "original":
        return max(1.0, rows / cols) ** 0.5
    if mode == "match-rms-adamw":
        return 0.2 * max(rows, cols) ** 0.5
    raise ValueError(mode)


def run(opts: dict, params: dict, grads: list[dict]) -> list[dict]:
    p = {k: v["value"].copy() for k, v in params.items()}
    buf = {k: np.zeros_like(v["value"]) for k, v in params.items() if v["muon"]}
    m = {k: np.zeros_like(v["value"]) for k, v in params.items() if not v["muon"]}
    v2 = {k: np.zeros_like(v["value"]) for k, v in params.items() if not v["muon"]}
    b1, b2, eps, wd = opts["beta1"], opts["beta2"], opts["eps"], opts["weight_decay"]
    out = []
    for t, (g_all, lrs) in enumerate(zip(grads, opts["lr_schedule"]), start=1):
        lr, muon_lr = lrs
        for name, spec in params.items():
            g = g_all[name]
            if spec["muon"]:
                mu = opts["momentum"]
                buf[name] = mu * buf[name] + (1 - mu) * g
                u = (1 - mu) * g + mu * buf[name] if opts["nesterov"] else buf[name]
                o = newton_schulz(u, opts["ns_steps"], opts["ns_eps"])
                p[name] = p[name] * (1 - muon_lr * wd) - muon_lr * lr_scale(p[name].shape, opts["lr_scale"]) * o
            else:
                p[name] = p[name] * (1 - lr * wd)
                m[name] = b1 * m[name] + (1 - b1) * g
                v2[name] = b2 * v2[name] + (1 - b2) * g * g
                denom = np.sqrt(v2[name]) / np.sqrt(1 - b2**t) + eps
                p[name] = p[name] - lr / (1 - b1**t) * m[name] / denom
        out.append({k: v.copy() for k, v in p.items()})
    return out


def enc(a: np.ndarray) -> dict:
    return {"shape": list(a.shape), "values": [float(x) for x in a.reshape(-1)]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rng = np.random.default_rng(20260101)

    ns_cases = []
    for shape, scale in [((5, 8), 1.0), ((9, 4), 3.0), ((6, 6), 1e-3)]:
        g = rng.standard_normal(shape) * scale
        ns_cases.append({"input": enc(g), "output": enc(newton_schulz(g))})

    params = {
        "attn.weight": {"muon": True, "value": rng.standard_normal((4, 6)) * 0.1},
        "ffn.weight": {"muon": True, "value": rng.standard_normal((7, 3)) * 0.1},
        "norm.weight": {"muon": False, "value": 1 + 0.1 * rng.standard_normal(5)},
        "embedding": {"muon": False, "value": rng.standard_normal((10, 4)) * 0.1},
    }
    grads = [{k: rng.standard_normal(v["value"].shape) * 0.05 for k, v in params.items()} for _ in range(3)]
    option_sets = [
        {"name": "nesterov-original-wd", "momentum": 0.95, "nesterov": True, "lr_scale": "original",
         "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "ns_steps": 5, "ns_eps": 1e-7,
         "lr_schedule": [[1e-3, 0.02], [2e-3, 0.04], [5e-4, 0.01]]},
        {"name": "plain-match-rms", "momentum": 0.9, "nesterov": False, "lr_scale": "match-rms-adamw",
         "weight_decay": 0.0, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "ns_steps": 5, "ns_eps": 1e-7,
         "lr_schedule": [[3e-3, 3e-3], [3e-3, 3e-3], [1e-3, 1e-3]]},
    ]
    runs = []
    for opts in option_sets:
        steps = run(opts, params, grads)
        runs.append({"options": opts,
                     "params": {k: {"muon": v["muon"], **enc(v["value"])} for k, v in params.items()},
                     "grads": [{k: enc(g) for k, g in step.items()} for step in grads],
                     "after": [{k: enc(a) for k, a in step.items()} for step in steps]})

    doc = {"generator": "scripts/golden/make_muon_golden.py", "numpy": np.__version__,
           "ns_coefficients": list(NS_COEFFS), "newton_schulz": ns_cases, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
