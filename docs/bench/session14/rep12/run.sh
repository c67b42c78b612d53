#!/bin/bash
# the list on the reported questions (first 10 per category), from a worktree of the commit under test
cd /tmp/snap14b
PYTHONPATH=/tmp/snap14b/src /work/main/.venv/bin/specdec bench --dtype bf16 --per-category 10 --max-new-tokens 128 --warmup 1 --methods plain,hf-greedy,hf-pld,pld,recycle,logitspec,logitspec:adaptive=false,logitspec:recycle=false --no-progress --out /work/main/results/s14/rep12 > /work/main/results/s14/rep12.log 2>&1
echo "done $(date -u)" >> /work/main/results/s14/rep12.log
