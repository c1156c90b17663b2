#!/usr/bin/env python3
"""Averages the weights of drafters of one architecture into a new drafter.

    python3 scripts/data/average_drafters.py --out DIR A B [C ...] [--weights 0.5,0.5]

A, B, ... are drafter directories (dspark.json + model.safetensors, as
`dspark train` or `dspark draft-vocab` leave them) of the same target and
configuration; they may differ only in their draft vocabulary and
calibration. Every tensor of the output is the weighted mean of the inputs'
(computed in float32, equal weights unless --weights says otherwise), stored
in the first input's dtype (bf16 rounded to nearest even, or f32). The output
takes the first input's config, including its draft vocabulary, without its
calibration (`config.sts`; run `dspark calibrate` on it), and records the
inputs under "train". Both files are written under temporary names and
renamed into place, so DIR may be one of the inputs and a failure leaves it
as it was.

Refused with a message naming the input and what differs: a different target,
configuration, tensor set, shape or dtype; weights that do not sum to 1.
"""

import argparse
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

DTYPES = {"BF16": np.uint16, "F32": np.float32}


def read_safetensors(path: Path):
    data = path.read_bytes()
    if len(data) < 8:
        raise SystemExit(f"{path}: {len(data)} bytes, too short for a safetensors file")
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    tensors = {}
    for name, t in header.items():
        if t["dtype"] not in DTYPES:
            raise SystemExit(f"{path}: tensor '{name}' has dtype {t['dtype']}, expected BF16 or F32")
        s, e = t["data_offsets"]
        raw = np.frombuffer(data, dtype=DTYPES[t["dtype"]], count=(e - s) // np.dtype(DTYPES[t["dtype"]]).itemsize,
                            offset=8 + n + s)
        f32 = (raw.astype(np.uint32) << 16).view(np.float32) if t["dtype"] == "BF16" else raw
        tensors[name] = (t["dtype"], tuple(t["shape"]), f32)
    return tensors


def to_bf16(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path: Path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, values = tensors[name]
        blob = (to_bf16(values) if dtype == "BF16" else values.astype(np.float32)).tobytes()
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def comparable(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in ("sts", "draft_vocab")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output drafter directory")
    ap.add_argument("--weights", help="comma-separated weights summing to 1 (default: equal)")
    ap.add_argument("inputs", nargs="+", help="drafter directories")
    a = ap.parse_args(argv)
    if len(a.inputs) < 2:
        raise SystemExit("average_drafters: expected at least two drafters, got " + str(len(a.inputs)))
    weights = [1.0 / len(a.inputs)] * len(a.inputs)
    if a.weights:
        weights = [float(w) for w in a.weights.split(",")]
        if len(weights) != len(a.inputs) or abs(sum(weights) - 1.0) > 1e-6:
            raise SystemExit(f"--weights: expected {len(a.inputs)} weights summing to 1, got {a.weights}")
    dirs = [Path(d) for d in a.inputs]
    configs = [json.loads((d / "dspark.json").read_text()) for d in dirs]
    tensors = [read_safetensors(d / "model.safetensors") for d in dirs]
    first, ref = configs[0], tensors[0]
    for d, c, t in zip(dirs[1:], configs[1:], tensors[1:]):
        for key in ("target_id", "variant", "dims"):
            if c.get(key) != first.get(key):
                raise SystemExit(f"{d}: {key} {c.get(key)!r} differs from {dirs[0]}'s {first.get(key)!r}")
        if comparable(c["config"]) != comparable(first["config"]):
            diff = sorted(k for k in set(c["config"]) | set(first["config"])
                          if k not in ("sts", "draft_vocab") and c["config"].get(k) != first["config"].get(k))
            raise SystemExit(f"{d}: config differs from {dirs[0]}'s in {', '.join(diff)}")
        if set(t) != set(ref):
            raise SystemExit(f"{d}: tensors {sorted(set(t) ^ set(ref))} are not in both {d} and {dirs[0]}")
        for name, (dtype, shape, _) in t.items():
            if (dtype, shape) != ref[name][:2]:
                raise SystemExit(f"{d}: tensor '{name}' is {dtype} {list(shape)}, {dirs[0]}'s is "
                                 f"{ref[name][0]} {list(ref[name][1])}")
    mean = {}
    for name, (dtype, shape, _) in ref.items():
        acc = np.zeros(int(np.prod(shape)) if shape else 1, dtype=np.float32)
        for w, t in zip(weights, tensors):
            acc += np.float32(w) * t[name][2]
        mean[name] = (dtype, shape, acc)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    config = dict(first)
    config["config"] = {k: v for k, v in first["config"].items() if k != "sts"}
    config["train"] = {"average_of": [{"drafter": str(d), "weight": w, "train": c.get("train")}
                                      for d, w, c in zip(dirs, weights, configs)]}
    weights_path, config_path = out / "model.safetensors", out / "dspark.json"
    tmp_w, tmp_c = out / "model.safetensors.new", out / "dspark.json.new"
    try:
        write_safetensors(tmp_w, mean)
        config["weights_bytes"] = tmp_w.stat().st_size
        tmp_c.write_text(json.dumps(config, indent=2) + "\n")
        os.replace(tmp_w, weights_path)
        os.replace(tmp_c, config_path)
    finally:
        for p in (tmp_w, tmp_c):
            if p.exists():
                p.unlink()
    print(f"{out}: mean of {len(dirs)} drafters (weights {', '.join(f'{w:g}' for w in weights)}), "
          f"{len(mean)} tensors; calibrate it next (dspark calibrate)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
