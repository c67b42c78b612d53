#!/usr/bin/env bash
# Qwen2.5-Coder-1.5B's pass at 512 tokens of context (benchmarks/step_cost.py), the Q6_K layers on their own bits
# (this tree) against re-quantized to 4 bits (BEFORE, a worktree of the commit before, with its own XDG cache
# BEFORE_CACHE), in alternating processes, alone. Writes ab-steps.txt.
set -u
cd "$(dirname "$0")/../../.."
out=docs/results/2026-11-q6k-layers
py=$PWD/.venv/bin/python
before=${BEFORE:-/tmp/wt-before}; before_cache=${BEFORE_CACHE:-/tmp/xdg-before}
run() {
  $py benchmarks/step_cost.py --model qwen2.5-coder-1.5b --dtype bf16 --backend torch-int4-exact \
    --contexts 512 --sizes 1,2,4,6,8 --no-profile --repeats 7 2>/dev/null | grep '^| torch' | awk -F'|' '{printf "%s ", $6} END {print ""}'
}
uptime >> $out/machine.txt
for round in 1 2; do
  echo "q6k-own-bits  $(run)" >> $out/ab-steps.txt
  echo "requantized   $(cd $before && PYTHONPATH=$before/src XDG_CACHE_HOME=$before_cache run)" >> $out/ab-steps.txt
done
