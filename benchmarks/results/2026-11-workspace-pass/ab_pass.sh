#!/usr/bin/env bash
# before: a worktree of the commit before (git worktree add --detach /tmp/wt-before <commit>) with its own
# XDG cache (/tmp/xdg-before/specdec: links to the model folders); after: this tree.
rounds=${ROUNDS:-4}; model=${MODEL:-smollm2-135m}
cd "$(dirname "$0")/../../.."
for r in $(seq $rounds); do
  for side in before after; do
    if [ $side = before ]; then export XDG_CACHE_HOME=/tmp/xdg-before PYTHONPATH=/tmp/wt-before/src; else unset XDG_CACHE_HOME; export PYTHONPATH=$PWD/src; fi
    echo "$side $($PWD/.venv/bin/python benchmarks/results/2026-11-workspace-pass/abpass.py $model 2>/dev/null | tail -1)"
  done
done
