#!/bin/bash
# The temperature-1 measurement on the final code (a35395e), first 10 questions per category.
cd /work/main
date -u; uptime
PYTHONPATH=/tmp/s15f/src .venv/bin/specdec bench --dtype bf16 --per-category 10 --max-new-tokens 128 --warmup 1 \
  --no-progress --temperature 1.0 --seed 0 --methods plain,pld,logitspec,recycle --out results/s15/t1rep > results/s15/t1rep.log 2>&1
date -u; uptime; echo done
