#!/bin/bash
# A/B: logitspec with the 384-token cost curve (c3e28b5) vs per-context costs (931decf); pld as in-run baseline.
cd /work/main
run() {  # tag snap data
  XDG_CACHE_HOME=/tmp/xdg_$1 PYTHONPATH=/tmp/s15$1/src .venv/bin/specdec bench --dtype bf16 --data $3 \
    --max-new-tokens 128 --warmup 1 --no-progress --methods pld,logitspec --out results/s15/ab_$2 > results/s15/ab_$2.log 2>&1
}
date -u; uptime
run old old15 results/s14/dev15.jsonl; date -u
run new new15 results/s14/dev15.jsonl; date -u
run new new20 results/s14/dev20.jsonl; date -u
run old old20 results/s14/dev20.jsonl; date -u; uptime
echo done
