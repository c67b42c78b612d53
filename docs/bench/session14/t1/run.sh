#!/bin/bash
cd /tmp/snap14b
PYTHONPATH=/tmp/snap14b/src /work/main/.venv/bin/specdec bench --dtype bf16 --per-category 10 --max-new-tokens 128 --warmup 1 --temperature 1.0 --seed 0 --methods plain,pld,logitspec,logitspec:recycle=false --no-progress --out /work/main/results/s14/t1 > /work/main/results/s14/t1.log 2>&1
echo "done $(date -u)" >> /work/main/results/s14/t1.log
