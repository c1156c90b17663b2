#!/usr/bin/env python3
"""safetensors interoperability oracle, in both directions.

1. Writes tests/golden/safetensors_python.safetensors with the reference
   implementation (the PyPI `safetensors` package, whose serializer is the
   upstream Rust crate). tests/safetensors_test.cpp asserts that
   dspark::io::load_safetensors reads exactly the values defined in
   `expected()` below from it.

2. Verifies tests/golden/safetensors_dspark.safetensors, the file that
   dspark::io::save_safetensors produces for the same tensors and metadata
   (tensors in the order of `expected()`), with the reference reader: the
   reference must accept the file and return the same dtypes, shapes, raw
   bytes and metadata; the header keys must be in that order and the data
   section must start 8-byte aligned. The C++ test checks on every run that
   the writer still produces that committed file byte for byte, so this
   offline check covers the current writer without needing Python at test
   time. When the writer's output changes on purpose:

     DSPARK_UPDATE_GOLDEN=1 ./build/dspark_tests --gtest_filter='SafetensorsGolden.*'
     python3 scripts/golden/make_safetensors_golden.py --verify-only

Both files are about 1 KB. `expected()` must stay identical to
golden_tensors() in tests/safetensors_test.cpp. The reference serializer
orders the "__metadata__" keys by hash, so regenerating the reference file may
change its bytes but never its contents.

Usage:  python3 scripts/golden/make_safetensors_golden.py [--out PATH] [--dspark PATH] [--verify-only]
Pins:   SAFETENSORS_PIP and NUMPY_PIP in scripts/versions.env
        (safetensors==0.8.0, numpy==2.4.6), installed with
        python3 -m pip install "safetensors==0.8.0" "numpy==2.4.6"
Exit status 0 when everything matched, 1 (with a message) otherwise.
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np
import safetensors
from safetensors import TensorSpec, deserialize, safe_open, serialize

REPO = Path(__file__).resolve().parents[2]
PYTHON_GOLDEN = REPO / "tests/golden/safetensors_python.safetensors"
DSPARK_GOLDEN = REPO / "tests/golden/safetensors_dspark.safetensors"

METADATA = {"format": "np", "generator": "make_safetensors_golden.py", "text": "h\u00e9llo \u2713"}


def expected() -> list[tuple[str, str, list[int], np.ndarray]]:
    """(name, safetensors dtype, shape, array holding the exact little-endian bytes)."""
    f32_bits = np.array(
        [0x00000000, 0x80000000, 0x3FC00000, 0xC0100000,  # 0, -0, 1.5, -2.25
         0x7F800000, 0xFF800000, 0x7FC00001, 0x00000001],  # inf, -inf, NaN payload 1, min subnormal
        dtype="<u4")
    bf16_bits = np.array([0x3F80, 0xC000, 0x7FC1, 0x8000, 0x0001, 0x7F80], dtype="<u2")  # 1, -2, NaN, -0, sub, inf
    return [
        ("f64", "F64", [2, 3], np.arange(6, dtype="<f8") * 0.5 - 1.0),
        ("f32", "F32", [8], f32_bits.view("<f4")),
        ("f16", "F16", [2, 2, 2], np.arange(-4, 4, dtype="<f2") * np.float16(0.25)),
        ("bf16", "BF16", [2, 3], bf16_bits),
        ("i64", "I64", [4], np.array([-(2**63), -1, 1234567890123, 2**63 - 1], dtype="<i8")),
        ("i32", "I32", [3, 2], np.arange(-3, 3, dtype="<i4") * 100000),
        ("i16", "I16", [5], np.array([-32768, -1, 0, 1, 32767], dtype="<i2")),
        ("i8", "I8", [7], np.arange(-128, 128, 37, dtype="i1")),
        ("u8", "U8", [2, 3], np.arange(0, 256, 51, dtype="u1")),
        ("bool", "BOOL", [4], np.array([True, False, True, True])),
        ("scalar", "F32", [], np.array(3.25, dtype="<f4")),
        ("empty", "F32", [0, 3], np.zeros((0, 3), dtype="<f4")),
    ]


# dtype names accepted by safetensors.TensorSpec.
SPEC_DTYPE = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
              "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def write_python_golden(path: Path) -> None:
    arrays = []  # keeps the buffers alive while serialize() reads them
    specs = {}
    for name, dtype, shape, array in expected():
        array = np.ascontiguousarray(array)
        arrays.append(array)
        specs[name] = TensorSpec(dtype=SPEC_DTYPE[dtype], shape=shape, data_ptr=array.ctypes.data,
                                 data_len=array.nbytes)
    data = bytes(serialize(specs, metadata=METADATA))
    path.write_bytes(data)
    print(f"wrote {path.relative_to(REPO)} ({len(data)} bytes) with safetensors {safetensors.__version__}")


def verify_dspark_file(path: Path) -> list[str]:
    errors = []
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    if (8 + n) % 8 != 0:
        errors.append(f"data section starts at byte {8 + n}, not 8-byte aligned")
    header = json.loads(data[8:8 + n], object_pairs_hook=lambda pairs: pairs)
    keys = [k for k, _ in header if k != "__metadata__"]
    want_keys = [name for name, *_ in expected()]
    if keys != want_keys:
        errors.append(f"header order {keys}, expected {want_keys}")

    got = dict(deserialize(data))  # the reference parser validates the whole layout
    for name, dtype, shape, array in expected():
        if name not in got:
            errors.append(f"tensor {name!r} missing")
            continue
        t = got[name]
        if t["dtype"] != dtype or list(t["shape"]) != shape:
            errors.append(f"tensor {name!r}: {t['dtype']} {t['shape']}, expected {dtype} {shape}")
        if bytes(t["data"]) != np.ascontiguousarray(array).tobytes():
            errors.append(f"tensor {name!r}: bytes {bytes(t['data']).hex()}, expected {array.tobytes().hex()}")
    extra = sorted(set(got) - set(want_keys))
    if extra:
        errors.append(f"unexpected tensors {extra}")

    with safe_open(str(path), framework="numpy") as f:
        if f.metadata() != METADATA:
            errors.append(f"metadata {f.metadata()}, expected {METADATA}")
        for name, dtype, _, array in expected():
            if dtype == "BF16":
                continue  # numpy has no bfloat16; its bytes were compared above
            value = f.get_tensor(name)
            if value.dtype != array.dtype or value.tobytes() != array.tobytes():
                errors.append(f"tensor {name!r}: safe_open returned {value!r}")
    return errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=PYTHON_GOLDEN, help="reference file to write")
    ap.add_argument("--dspark", type=Path, default=DSPARK_GOLDEN, help="file written by dspark to verify")
    ap.add_argument("--verify-only", action="store_true", help="do not rewrite the reference file")
    args = ap.parse_args()

    if not args.verify_only:
        write_python_golden(args.out)
    if not args.dspark.exists():
        print(f"{args.dspark}: missing; create it with DSPARK_UPDATE_GOLDEN=1 (see the docstring)", file=sys.stderr)
        return 1
    errors = verify_dspark_file(args.dspark)
    for e in errors:
        print(f"{args.dspark}: {e}", file=sys.stderr)
    if errors:
        return 1
    print(f"verified {args.dspark} with safetensors {safetensors.__version__}: reads back exactly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
