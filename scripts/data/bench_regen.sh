#!/usr/bin/env bash
# Measures `dspark regen` throughput for several batch sizes on the first
# prompts of a prompts file (max(32, 4*B) prompts per batch size, so every
# run spends a similar share of its time draining the last batch).
#
#   scripts/data/bench_regen.sh [PROMPTS] [N_PREDICT] [THREADS] [ROUNDS]
#
# Prints one line per run: batch, prompts, tokens generated, wall seconds of
# the generation (model loading excluded),
# tokens/s, CPU seconds and tokens per CPU second. Rounds interleave the batch
# sizes so that background load affects them alike.
set -euo pipefail
cd "$(dirname "$0")/../.."
PROMPTS="${1:-data/train-prompts/prompts.jsonl}"
N="${2:-96}"
THREADS="${3:-2}"
ROUNDS="${4:-1}"
DSPARK="${DSPARK:-build/dspark}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
printf '%-6s %-8s %-8s %-8s %-8s %-8s %-10s\n' batch prompts tokens wall_s tok/s cpu_s tok/cpu_s
for round in $(seq "$ROUNDS"); do
  for B in 1 4 8 16 32; do
    n=$(( 4 * B > 32 ? 4 * B : 32 ))
    rm -rf "$tmp/out"
    /usr/bin/time -f '%e %U %S' -o "$tmp/time" \
      "$DSPARK" regen -m smollm2 --prompts "$PROMPTS" --out "$tmp/out" --limit "$n" -n "$N" \
      --batch "$B" -t "$THREADS" > "$tmp/log" 2>/dev/null
    tokens=$(sed -n 's/.* \([0-9]*\) tokens generated.*/\1/p' "$tmp/log")
    wall=$(sed -n 's/.* tokens generated in \([0-9.]*\) s.*/\1/p' "$tmp/log")  # excludes model loading
    read -r _ user sys < "$tmp/time"
    awk -v b="$B" -v n="$n" -v t="$tokens" -v w="$wall" -v u="$user" -v s="$sys" 'BEGIN {
      printf "%-6d %-8d %-8d %-8.1f %-8.1f %-8.1f %-10.1f\n", b, n, t, w, t / w, u + s, t / (u + s) }'
  done
done
