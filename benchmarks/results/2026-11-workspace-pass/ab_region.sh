#!/usr/bin/env bash
# A (main's tree) vs B (the one-region tree), alternating processes.
# team: a worktree with one-region.diff applied and its own XDG cache (/tmp/xdg-omp).
rounds=${ROUNDS:-4}; model=${MODEL:-smollm2-135m}
cd "$(dirname "$0")/../../.."
for r in $(seq $rounds); do
  for side in main team; do
    if [ $side = main ]; then unset XDG_CACHE_HOME; export PYTHONPATH=$PWD/src; else export XDG_CACHE_HOME=/tmp/xdg-omp PYTHONPATH=/tmp/wt-omp/src; fi
    echo "$side $($PWD/.venv/bin/python benchmarks/results/2026-11-workspace-pass/abpass.py $model 2>/dev/null | tail -1)"
  done
done
