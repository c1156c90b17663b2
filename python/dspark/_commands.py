"""The `dspark` subcommands as functions: they run the same C++ code in-process."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from typing import Sequence

from . import _core


@contextlib.contextmanager
def _capture_fd(fd: int, sink: list):
    """Redirects file descriptor `fd` into a temporary file for the block,
    then appends what was written to `sink`. Other threads' output to `fd`
    is captured too."""
    stream = sys.stdout if fd == 1 else sys.stderr
    stream.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), fd)
        try:
            yield
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            f.seek(0)
            sink.append(f.read().decode("utf-8", errors="replace"))


def cli(args: Sequence[str], capture: bool = True) -> str:
    """Runs `dspark ARGS...` in-process and returns what it printed on stdout.
    Raises ValueError when an argument's value is refused (e.g. "top_p must
    be in (0, 1], got 9"), else DsparkError with the command's error message
    (a missing or bad file, a failure of the work; exit status 2 or 1).
    With capture=False the output goes to the process's stdout and "" is
    returned."""
    return _run(args, capture)


def _run(args: Sequence[str], capture: bool = True, names: dict[str, str] | None = None) -> str:
    """cli(); `names` maps the options a function passes to its keywords,
    which a refused value's message then names instead."""
    args = [str(a) for a in args]
    if not capture:
        rc, invalid = _core.cli(args)
        out, err = "", ""
    else:
        outs, errs = [], []
        with _capture_fd(1, outs), _capture_fd(2, errs):
            rc, invalid = _core.cli(args)
        out, err = outs[0], errs[0]
    if rc != 0:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        message = lines[-1] if lines else f"dspark {' '.join(args)} failed with exit status {rc}"
        for prefix in ("error: ", "internal error: "):
            if message.startswith(prefix):
                message = message[len(prefix):]
        if invalid:
            option, sep, rest = message.partition(": ")
            key = (names or {}).get(option)
            raise ValueError(f"{key}: {rest}" if key and sep else message)
        raise _core.DsparkError(message)
    return out


# Options the functions below pass, by the name the command's messages use.
_MODEL_NAMES = {"--model": "model", "--threads": "threads", "--compute": "compute", "--drafter": "drafter"}


def _model_args(model: str, threads: int, compute: str) -> list[str]:
    return ["-m", model, "-t", str(threads), "--compute", compute]


def _drafter_arg(drafter: str | None) -> list[str]:
    return ["--drafter", "none" if drafter is None else drafter]


def bench(
    prompts: str,
    model: str = "smollm2",
    drafter: str | None = "auto",
    max_tokens: int = 128,
    runs: int = 1,
    limit: int = 0,
    temperature: float = 0.0,
    threads: int = 2,
    compute: str = "quant",
    raw: bool = False,
) -> dict:
    """`dspark bench --json`: plain vs speculative decoding over a JSONL prompt
    set. Returns {"aggregate": {...}, "prompts": [{id, tau, speedup,
    plain_tok_s, spec_tok_s, acceptance_by_position, lossless}, ...]}."""
    args = ["bench", *_model_args(model, threads, compute), *_drafter_arg(drafter), "--prompts", prompts,
            "-n", max_tokens, "--runs", runs, "--limit", limit, "--temp", temperature, "--json"]
    if raw:
        args.append("--raw")
    names = {**_MODEL_NAMES, "--prompts": "prompts", "--n-predict": "max_tokens", "--runs": "runs",
             "--limit": "limit", "--temp": "temperature"}
    return json.loads(_run(args, names=names))


def calibrate(
    prompts: str | None = None,
    model: str = "smollm2",
    drafter: str = "auto",
    rounds: str | None = None,
    save_rounds: str | None = None,
    max_tokens: int | None = None,
    limit: int = 0,
    target_precision: float | None = None,
    plot: str | None = None,
    dry_run: bool = False,
    threads: int = 2,
    compute: str = "quant",
) -> str:
    """`dspark calibrate`: fits the STS temperatures and thresholds of the
    drafter's confidence head (written to its dspark.json unless dry_run).
    Rounds come from `prompts` (generated now) or a `rounds` JSONL file.
    Returns the command's report text. sts_report(save_rounds) gives the
    numbers behind it."""
    args = ["calibrate", *_model_args(model, threads, compute), "--drafter", drafter, "--limit", limit]
    for flag, value in (("--prompts", prompts), ("--rounds", rounds), ("--save-rounds", save_rounds),
                        ("-n", max_tokens), ("--target-precision", target_precision), ("--plot", plot)):
        if value is not None:
            args += [flag, value]
    if dry_run:
        args.append("--dry-run")
    names = {**_MODEL_NAMES, "--prompts": "prompts", "--rounds": "rounds", "--save-rounds": "save_rounds",
             "--n-predict": "max_tokens", "--limit": "limit", "--target-precision": "target_precision",
             "--plot": "plot"}
    return _run(args, names=names)


def profile(out: str, model: str = "smollm2", bmax: int = 16, context: int = 256, reps: int = 3,
            threads: int = 2, compute: str = "quant") -> dict:
    """`dspark profile`: measures SPS(B), target steps per second at B verify
    tokens, writes the profile JSON to `out` and returns it."""
    _run(["profile", *_model_args(model, threads, compute), "--bmax", bmax, "--context", context,
          "--reps", reps, "--out", out],
         names={**_MODEL_NAMES, "--bmax": "bmax", "--context": "context", "--reps": "reps", "--out": "out"})
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def init_drafter(out: str, model: str = "smollm2", head: str = "markov", layers: int = 1, gamma: int = 7,
                 seed: int = 0, force: bool = False) -> str:
    """`dspark init-drafter`: exports a randomly initialized DSpark drafter
    (dspark.json + model.safetensors) for `model` to the directory `out`."""
    args = ["init-drafter", "-m", model, "--out", out, "--head", head, "--layers", layers, "--gamma", gamma,
            "--seed", seed]
    if force:
        args.append("--force")
    _run(args, names={"--model": "model", "--out": "out", "--head": "head", "--layers": "layers", "--gamma": "gamma",
                      "--seed": "seed"})
    return out


def sts_report(rounds: str, gamma: int = 0, target: float = 0.5, bins: int = 15) -> dict:
    """The calibration report of recorded verify rounds (a `save_rounds`
    JSONL file): temperatures, thresholds, ECE and AUROC before/after, and the
    reliability bins per position before ("bins_before") and after
    ("bins_after") STS. gamma 0: the longest round."""
    return json.loads(_core.sts_report(rounds, gamma, target, bins))
