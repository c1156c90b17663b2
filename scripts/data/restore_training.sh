#!/usr/bin/env bash
# Puts back on a fresh machine what a training run needs, in one command:
#
#   scripts/data/restore_training.sh [NAME] [MODEL]     # default: smollm2-greedy smollm2
#   scripts/data/restore_training.sh smollm2-greedy+smollm2-si2-greedy smollm2
#
# NAME joins with "+" the data sets of a run trained on several (`train
# --data A --data B`): each is restored as below, their features go to one
# cache, $DSPARK_HOME/cache/<the first NAME>, in the run's order.
#
# 1. the regenerated token data: unpacked from data/regen/NAME.tar.xz (kept in
#    the repository by scripts/data/pack_regen.sh) into
#    $DSPARK_HOME/data/regen/NAME; when the repository has no archive, it is
#    regenerated with the command that made it (REGEN_ARGS; hours of CPU);
# 2. the target features of every sequence in the disk feature cache
#    $DSPARK_HOME/cache/NAME (`dspark train --fill-feature-cache`, for the
#    taps and draft vocabulary of the drafter INIT, default drafters/smollm2),
#    so that later passes never run the target.
#
# 3. with RUN=ARCHIVE (written by scripts/data/pack_run.sh): the run's
#    latest checkpoint (weights, optimizer state, data position) unpacked
#    into $DSPARK_HOME/train/, and the `dspark train --resume` command that
#    continues it printed (scripts/data/resume_command.py). The trainer
#    refuses to resume on data other than the run's (by their fingerprint).
#
# Environment: DSPARK (default build/dspark), DSPARK_HOME (default
# ~/.cache/dspark), INIT, THREADS (default 2), PROMPTS and REGEN_ARGS (for
# step 1 without an archive), SKIP_FEATURES=1 to skip step 2, RUN.
# Every step is resumable and skips what is already there.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
NAME="${1:-smollm2-greedy}"
MODEL="${2:-smollm2}"
DSPARK="${DSPARK:-$REPO/build/dspark}"
HOME_DIR="${DSPARK_HOME:-$HOME/.cache/dspark}"
INIT="${INIT:-$REPO/drafters/smollm2}"
THREADS="${THREADS:-2}"
PROMPTS="${PROMPTS:-$REPO/data/train-prompts/prompts.jsonl}"
# The sets in data/regen/ were written greedy (NAME ending in -greedy) or
# with regen's default sampling.
if [[ "$NAME" == *-greedy ]]; then DEFAULT_REGEN="-n 256 --batch 32 --temp 0 --seed 0"
else DEFAULT_REGEN="-n 256 --batch 32 --seed 0"; fi
REGEN_ARGS="${REGEN_ARGS:-$DEFAULT_REGEN}"
IFS=+ read -r -a NAMES <<< "$NAME"
DATA_FLAGS=()
for part in "${NAMES[@]}"; do
  DATA="$HOME_DIR/data/regen/$part"
  ARCHIVE="$REPO/data/regen/$part.tar.xz"
  DATA_FLAGS+=(--data "$DATA")
  if [[ -f "$DATA/manifest.json" ]]; then
    echo "data: $DATA already there"
  elif [[ -f "$ARCHIVE" ]]; then
    mkdir -p "$(dirname "$DATA")"
    tar -xJf "$ARCHIVE" -C "$(dirname "$DATA")"
    echo "data: unpacked $ARCHIVE into $DATA"
  elif (( ${#NAMES[@]} == 1 )); then
    echo "data: no $ARCHIVE; regenerating (resumable; hours of CPU): dspark regen $REGEN_ARGS"
    # shellcheck disable=SC2086
    "$DSPARK" regen -m "$MODEL" --prompts "$PROMPTS" --out "$DATA" $REGEN_ARGS -t "$THREADS"
  else
    echo "data: no $ARCHIVE; restore $part on its own first (with its PROMPTS)" >&2
    exit 1
  fi
done

if [[ "${SKIP_FEATURES:-0}" != 1 ]]; then
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' EXIT
  "$DSPARK" train -m "$MODEL" "${DATA_FLAGS[@]}" --init "$INIT" --out "$scratch/out" \
    --feature-cache-dir "$HOME_DIR/cache/${NAMES[0]}" --fill-feature-cache -t "$THREADS"
fi

if [[ -n "${RUN:-}" ]]; then
  run_name="$(tar -tJf "$RUN" | awk -F/ 'NR == 1 { print $1 }')"  # reads it all: no SIGPIPE
  mkdir -p "$HOME_DIR/train"
  if [[ -f "$HOME_DIR/train/$run_name/checkpoints/latest.json" ]]; then
    echo "run: $HOME_DIR/train/$run_name already there (not overwritten)"
  else
    tar -xJf "$RUN" -C "$HOME_DIR/train"
    echo "run: unpacked $RUN into $HOME_DIR/train/$run_name"
  fi
  echo "continue it with:"
  DSPARK_HOME="$HOME_DIR" python3 "$REPO/scripts/data/resume_command.py" "$HOME_DIR/train/$run_name" \
    "${DATA_FLAGS[@]}" --dspark "$DSPARK" -m "$MODEL"
fi
