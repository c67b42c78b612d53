#!/bin/bash
# T=1: logitspec with recycle greedy-only (a: 0e29356) vs recycle also when sampling (b: rule removed); pld in-run baseline.
cd /work/main
run() {  # snap tag data
  XDG_CACHE_HOME=/tmp/xdg_t1 PYTHONPATH=/tmp/s15$1/src .venv/bin/specdec bench --dtype bf16 --data $3 \
    --max-new-tokens 128 --warmup 1 --no-progress --temperature 1.0 --seed 0 --methods pld,logitspec \
    --out results/s15/t1_$2 > results/s15/t1_$2.log 2>&1
}
date -u; uptime
run a a15 results/s14/dev15.jsonl; date -u
run b b15 results/s14/dev15.jsonl; date -u
run b b20 results/s14/dev20.jsonl; date -u
run a a20 results/s14/dev20.jsonl; date -u; uptime
echo done
