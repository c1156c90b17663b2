"""bench / calibrate / profile as functions, and dspark.plots rendering PNGs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

import dspark
from dspark import plots

ROOT = Path(__file__).resolve().parents[2]


def png_size(path):
    with Image.open(path) as im:
        assert im.format == "PNG"
        im.load()
        return im.size


def test_acceptance_plot(spec_model, tmp_path):
    r = spec_model.create_chat_completion([{"role": "user", "content": "Name three fruits."}], max_tokens=48,
                                         temperature=0)
    out = tmp_path / "acceptance.png"
    plots.acceptance_by_position(r, path=str(out))
    assert png_size(out) == (600, 400)
    with pytest.raises(ValueError):
        plots.acceptance_by_position({"dspark": {"acceptance_by_position": []}})


def test_bench_and_speedup_plot(prompts_file, tmp_path):
    result = dspark.bench(prompts_file, max_tokens=24, runs=1)
    assert [p["id"] for p in result["prompts"]] == ["sky", "list"]
    assert result["aggregate"]["lossless"] is True
    out = tmp_path / "speedup.png"
    plots.speedup_per_prompt(result, path=str(out))
    assert png_size(out) == (600, 400)


def test_calibrate_report_and_reliability_plot(prompts_file, tmp_path):
    rounds = tmp_path / "rounds.jsonl"
    text = dspark.calibrate(prompts_file, save_rounds=str(rounds), max_tokens=24, dry_run=True)
    assert "ECE" in text
    report = dspark.sts_report(str(rounds))
    assert report["gamma"] == len(report["temperatures"]) == len(report["bins_before"])
    out = tmp_path / "reliability.png"
    plots.reliability(report, path=str(out))
    assert png_size(out) == (1000, 460)


def test_profile_and_sps_plot(tmp_path):
    prof = dspark.profile(str(tmp_path / "sps.json"), bmax=4, context=16, reps=1)
    assert len(prof["sps"]) == 4
    out = tmp_path / "sps.png"
    plots.sps_curve(str(tmp_path / "sps.json"), path=str(out))
    assert png_size(out) == (600, 400)


def test_cli_errors_raise(prompts_file):
    with pytest.raises(dspark.DsparkError, match="nonexistent"):
        dspark.bench("/nonexistent/prompts.jsonl")
    # A refused value is a ValueError, naming the function's keyword where
    # the command names its option.
    for kwargs, message in (({"max_tokens": 0}, r"^max_tokens: expected a positive integer, got '0'"),
                            ({"limit": -1}, r"^limit: "), ({"runs": 0}, r"^runs: ")):
        with pytest.raises(ValueError, match=message):
            dspark.bench(prompts_file, **kwargs)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\], got 9"):
        dspark.cli(["generate", "-p", "hi", "--top-p", "9"])
    with pytest.raises(ValueError, match=r"gamma must be in \[1, 32\], got 0"):
        dspark.init_drafter("/nonexistent/out", gamma=0)


def test_quickstart_example_runs(tmp_path):
    env = dict(os.environ, DSPARK_EXAMPLE_TOKENS="16", DSPARK_EXAMPLE_OUT=str(tmp_path))
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "tau" in out.stdout
    assert png_size(tmp_path / "acceptance.png") == (600, 400)
