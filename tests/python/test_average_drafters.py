"""scripts/data/average_drafters.py: the weighted mean of drafters' weights,
checked on small drafters with hand-computed values."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "data" / "average_drafters.py"
sys.path.insert(0, str(ROOT / "scripts" / "data"))

from average_drafters import read_safetensors, write_safetensors  # noqa: E402


def drafter(path: Path, a, b, vocab=(1, 2), layers=2, sts=True):
    path.mkdir()
    config = {"n_layers": layers, "gamma": 7, "draft_vocab": list(vocab)}
    if sts:
        config["sts"] = {"thresholds": [0.1]}
    (path / "dspark.json").write_text(json.dumps({
        "kind": "dspark-drafter", "variant": "dspark", "target_id": "t", "dims": {"hidden_size": 4},
        "config": config, "train": {"step": 10}}))
    write_safetensors(path / "model.safetensors", {
        "a.weight": ("BF16", (2, 2), np.array(a, dtype=np.float32)),
        "b.weight": ("F32", (3,), np.array(b, dtype=np.float32))})
    return path


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_mean_values_dtypes_and_config(tmp_path):
    # 1 + 2^-7 is a bf16 value (7 mantissa bits); its mean with 1 is 1 + 2^-8,
    # half way between two bf16 values: rounds to the even one, 1.
    x = drafter(tmp_path / "x", [1.0, 2.0, -4.0, 1.0 + 2**-7], [0.25, 1.0, 3.0], vocab=(5, 6))
    y = drafter(tmp_path / "y", [3.0, 2.0, 4.0, 1.0], [0.75, -1.0, 1.0], vocab=(7,))
    r = run("--out", tmp_path / "o", x, y)
    assert r.returncode == 0, r.stderr
    t = read_safetensors(tmp_path / "o" / "model.safetensors")
    assert t["a.weight"][0] == "BF16" and t["a.weight"][1] == (2, 2)
    assert t["a.weight"][2].tolist() == [2.0, 2.0, 0.0, 1.0]
    assert t["b.weight"][0] == "F32" and t["b.weight"][2].tolist() == [0.5, 0.0, 2.0]
    c = json.loads((tmp_path / "o" / "dspark.json").read_text())
    assert "sts" not in c["config"] and c["config"]["draft_vocab"] == [5, 6]
    assert [e["weight"] for e in c["train"]["average_of"]] == [0.5, 0.5]
    assert c["weights_bytes"] == (tmp_path / "o" / "model.safetensors").stat().st_size


def test_weights_and_output_in_place(tmp_path):
    x = drafter(tmp_path / "x", [4.0, 0.0, 0.0, 0.0], [4.0, 0.0, 8.0])
    y = drafter(tmp_path / "y", [0.0, 0.0, 0.0, 0.0], [0.0, 4.0, 0.0])
    assert run("--out", x, x, y, "--weights", "0.75,0.25").returncode == 0
    t = read_safetensors(x / "model.safetensors")
    assert t["a.weight"][2].tolist() == [3.0, 0.0, 0.0, 0.0]
    assert t["b.weight"][2].tolist() == [3.0, 1.0, 6.0]
    assert sorted(p.name for p in x.iterdir()) == ["dspark.json", "model.safetensors"]


def test_refusals_name_what_differs(tmp_path):
    x = drafter(tmp_path / "x", [1.0] * 4, [1.0] * 3)
    y = drafter(tmp_path / "y", [1.0] * 4, [1.0] * 3, layers=3)
    r = run("--out", tmp_path / "o", x, y)
    assert r.returncode != 0 and "config differs" in r.stderr and "n_layers" in r.stderr
    assert not (tmp_path / "o").exists()
    r = run("--out", tmp_path / "o", x, x, "--weights", "0.5,0.6")
    assert r.returncode != 0 and "summing to 1" in r.stderr
    r = run("--out", tmp_path / "o", x)
    assert r.returncode != 0 and "at least two" in r.stderr
