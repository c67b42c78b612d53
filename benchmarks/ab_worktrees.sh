#!/bin/bash
# A/B two checkouts of specdec on the same questions, in the order A, B, B, A, so that a machine
# that drifts during the runs weighs on both sides alike; compare ratios to an in-run baseline
# method (e.g. pld), never tokens/s across runs.
#
#   benchmarks/ab_worktrees.sh DIR_A DIR_B QUESTIONS.jsonl OUT_DIR [extra specdec bench args...]
#   e.g. git worktree add /tmp/a HEAD~1 && benchmarks/ab_worktrees.sh /tmp/a . dev.jsonl results/ab \
#          --dtype bf16 --methods pld,logitspec --temperature 1.0 --seed 0
#
# Each side runs with its own src/ first on the path (and its own cache folder, so cost curves
# measured by one side are not reused by the other). Use development questions, not the reported ones.
set -euo pipefail
A="$(cd "${1:?DIR_A}" && pwd)"; B="$(cd "${2:?DIR_B}" && pwd)"
DATA="$(realpath "${3:?QUESTIONS.jsonl}")"; OUT="${4:?OUT_DIR}"; shift 4
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
mkdir -p "$OUT"
run() {  # tag dir repeat [bench args...]
  local tag=$1 dir=$2 n=$3; shift 3
  XDG_CACHE_HOME="$OUT/cache-$tag" PYTHONPATH="$dir/src" "$PY" -m specdec.cli bench --data "$DATA" \
    --max-new-tokens 128 --warmup 1 --no-progress --out "$OUT/$tag-$n" "$@" > "$OUT/$tag-$n.log" 2>&1
}
date -u; uptime
run a "$A" 1 "${@}"; date -u
run b "$B" 1 "${@}"; date -u
run b "$B" 2 "${@}"; date -u
run a "$A" 2 "${@}"; date -u; uptime
echo "done: $OUT/{a,b}-{1,2}/summary.md"
