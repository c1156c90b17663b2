#!/usr/bin/env bash
# Plain decoding speed of dspark (both compute paths) and llama.cpp on the
# same GGUF file, measured alternately in one run so that both see the same
# machine load; prints the medians and their ratio.
#
#   scripts/bench_vs_llamacpp.sh [--runs 3] [--model smollm2|gemma3|FILE] [--prompts FILE] [-n 128] [-t 2]
#
# llama.cpp: `llama-bench -p 0 -n N -t T` (tg N, generation from an empty
# context) from $LLAMACPP_DIR (default ~/.cache/llamacpp; build it with
# ../shared/tools/build-llamacpp.sh or any llama.cpp checkout). dspark:
# `dspark bench --drafter none` on the prompt set (greedy, N tokens each).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
runs=3 model=smollm2 n=128 threads=2
prompts="$(ls "$here"/../shared/data/dev-prompts.jsonl 2>/dev/null || echo "$here/data/dev-prompts.jsonl")"
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --prompts) prompts="$2"; shift 2 ;;
    -n) n="$2"; shift 2 ;;
    -t) threads="$2"; shift 2 ;;
    *) echo "usage: $0 [--runs R] [--model smollm2|gemma3|FILE] [--prompts FILE] [-n N] [-t T]" >&2; exit 2 ;;
  esac
done
dspark="${DSPARK:-$here/build/dspark}"
bin="${LLAMACPP_DIR:-$HOME/.cache/llamacpp}/build/bin"
[ -x "$dspark" ] || { echo "$dspark not built (make cli)" >&2; exit 2; }
file="$model"
if [ ! -f "$file" ]; then
  source "$here/scripts/versions.env"
  case "$model" in
    smollm2) file="${DSPARK_HOME:-$HOME/.cache/dspark}/models/$SMOLLM2_GGUF" ;;
    gemma3) file="${DSPARK_HOME:-$HOME/.cache/dspark}/models/$GEMMA3_GGUF" ;;
    *) echo "unknown model '$model': expected smollm2, gemma3 or a GGUF path" >&2; exit 2 ;;
  esac
fi
have_llama=0; [ -x "$bin/llama-bench" ] && have_llama=1

ll=() dq=() db=()
for r in $(seq "$runs"); do
  if [ "$have_llama" = 1 ]; then
    ll+=("$("$bin/llama-bench" -m "$file" -p 0 -n "$n" -t "$threads" -r 1 -o json 2>/dev/null |
      python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])')")
  fi
  for c in quant bf16; do
    v="$("$dspark" bench -m "$file" --drafter none --compute "$c" --prompts "$prompts" -n "$n" -t "$threads" --json 2>/dev/null |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["aggregate"]["plain_tok_s"])')"
    if [ "$c" = quant ]; then dq+=("$v"); else db+=("$v"); fi
  done
  last="n/a"; [ ${#ll[@]} -gt 0 ] && last="${ll[-1]}"
  echo "run $r: llama.cpp $last | dspark quant ${dq[-1]} | dspark bf16 ${db[-1]} tok/s" >&2
done
python3 - "$file" "$n" "$threads" "${#ll[@]}" "${ll[@]}" "${dq[@]}" "${db[@]}" <<'PY'
import statistics, sys
file, n, t, k = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rest = [float(x) for x in sys.argv[5:]]
ll, rest = rest[:k], rest[k:]
half = len(rest) // 2
dq, db = rest[:half], rest[half:]
med = statistics.median
print(f"plain decoding, {file.split('/')[-1]}, {n} tokens, {t} threads, median of {len(dq)} runs:")
if ll:
    print(f"  llama.cpp (llama-bench tg{n})   {med(ll):7.1f} tok/s")
print(f"  dspark --compute quant          {med(dq):7.1f} tok/s" + (f"   {med(dq) / med(ll):.2f}x llama.cpp" if ll else ""))
print(f"  dspark --compute bf16           {med(db):7.1f} tok/s" + (f"   {med(db) / med(ll):.2f}x llama.cpp" if ll else ""))
if not ll:
    print("  (llama.cpp not found: build it with ../shared/tools/build-llamacpp.sh or set LLAMACPP_DIR)")
PY
