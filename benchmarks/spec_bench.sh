#!/bin/bash
# The benchmark (reported questions: first 10 per category), greedy, from a worktree of the commit under test.
cd /tmp/s16old
date -u > /work/main/results/s16/rep.log; uptime >> /work/main/results/s16/rep.log
PYTHONPATH=/tmp/s16old/src /work/main/.venv/bin/specdec bench --dtype bf16 --per-category 10 --max-new-tokens 128 --warmup 1 \
  --methods plain,hf-greedy,hf-pld,pld,recycle,logitspec,logitspec:adaptive=false --no-progress \
  --out /work/main/results/s16/rep >> /work/main/results/s16/rep.log 2>&1
echo "done $(date -u)" >> /work/main/results/s16/rep.log; uptime >> /work/main/results/s16/rep.log
