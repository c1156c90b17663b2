#!/usr/bin/env python3
"""Prints the `dspark train --resume` command that continues a run.

    scripts/data/resume_command.py OUT [--data DIR ...] [--dspark PATH] [-m MODEL]

Reads OUT/checkpoints/latest.json and the trainer_state.json of the step it
names, and writes the flags of the run's configuration (the ones a resume
must repeat: seed, batch, anchors per sequence, the eval split, the
optimizer and anchor draw, and the schedule, loss and precision the run
used). DIR defaults to $DSPARK_HOME/data/regen/<the data's name> (one --data
per data set of a run on several), MODEL to the target file the data was
generated with. Standard library only.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path


def flags(cfg: dict) -> list[str]:
    out: list[str] = []

    def add(flag: str, key: str) -> None:
        if key in cfg:
            out.extend([flag, str(cfg[key])])

    for flag, key in [("--steps", "steps"), ("--batch", "batch"), ("--anchors-per-seq", "anchors_per_seq"),
                      ("--seed", "seed"), ("--split-seed", "split_seed"), ("--eval-fraction", "eval_fraction"),
                      ("--eval-sequences", "eval_max_sequences"), ("--max-len", "max_len"), ("--lr", "lr"),
                      ("--warmup", "warmup"), ("--weight-decay", "weight_decay"), ("--grad-clip", "grad_clip"),
                      ("--gamma-decay", "gamma_decay"), ("--w-kl", "w_kl"), ("--optimizer", "optimizer"),
                      ("--anchors", "anchors"), ("--precision", "precision"), ("--device", "device")]:
        add(flag, key)
    if "loss_weights" in cfg:
        w_ce, w_l1, w_bce = cfg["loss_weights"]
        out += ["--w-ce", str(w_ce), "--w-l1", str(w_l1), "--w-bce", str(w_bce)]
    if cfg.get("optimizer") == "muon":
        muon = cfg.get("muon", {})
        for flag, key in [("--muon-lr", "lr"), ("--muon-momentum", "momentum"), ("--muon-lr-scale", "lr_scale")]:
            if key in muon:
                out += [flag, str(muon[key])]
    if cfg.get("aten_only"):
        out.append("--aten-only")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--data", action="append", help="a data set directory of the run (repeat: several, in order)")
    ap.add_argument("--dspark", default="build/dspark")
    ap.add_argument("-m", "--model")
    args = ap.parse_args()
    latest = json.loads((args.out / "checkpoints/latest.json").read_text())
    st = json.loads((args.out / "checkpoints" / latest["dir"] / "trainer_state.json").read_text())
    cfg = st["config"]
    recipe = st.get("data", {}).get("recipe", {})
    first = recipe[0] if isinstance(recipe, list) and recipe else recipe  # a run on several data sets
    home = os.environ.get("DSPARK_HOME", str(Path.home() / ".cache/dspark"))
    dirs = cfg["data_dir"] if isinstance(cfg["data_dir"], list) else [cfg["data_dir"]]
    data = args.data or [str(Path(home) / "data/regen" / Path(d).name) for d in dirs]
    model = args.model or (first or {}).get("target_path", "MODEL")
    cmd = [args.dspark, "train", "-m", model] + [a for d in data for a in ("--data", d)]
    cmd += ["--out", str(args.out)] + flags(cfg) + ["--resume"]
    print(" ".join(shlex.quote(c) for c in cmd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
