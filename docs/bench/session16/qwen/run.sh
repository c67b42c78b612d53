#!/bin/bash
# Issue #12 item 5 on the final code: Qwen2.5-Coder-1.5B, first turns of 10 coding + 10 math MT-bench
# questions + 2 of every other category (the set of session 8), greedy, bf16. Waits for rep.sh to finish.
while ! grep -q "^done" /work/main/results/s16/rep.log; do sleep 20; done
cd /tmp/s16old
date -u > /work/main/results/s16/qwen.log; uptime >> /work/main/results/s16/qwen.log
PYTHONPATH=/tmp/s16old/src /work/main/.venv/bin/specdec bench --model qwen2.5-coder-1.5b --dtype bf16 \
  --data /work/main/docs/bench/session8/qwen12/questions.jsonl --max-new-tokens 128 --warmup 1 \
  --methods plain,hf-pld,pld,recycle,logitspec --no-progress \
  --out /work/main/results/s16/qwen >> /work/main/results/s16/qwen.log 2>&1
echo "done $(date -u)" >> /work/main/results/s16/qwen.log; uptime >> /work/main/results/s16/qwen.log
