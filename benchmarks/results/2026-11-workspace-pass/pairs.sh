#!/usr/bin/env bash
# One-token and eight-token passes at 512 tokens of context, specdec (abpass.py: min and median of 300 passes)
# and llama-bench (-p 1 and -p 8, 5 repetitions: tokens/s, mean and sd), alternating three rounds a model, so that both
# engines' figures come from the same minutes of a machine whose memory speed drifts.
set -u
cd "$(dirname "$0")/../../.."
py=$PWD/.venv/bin/python
bench_bin=$(dirname "$($py benchmarks/llamacpp_bench.py --build-only | tail -1)")/llama-bench
smol=$($py -c "from specdec.models import load_model; print(load_model('smollm2-135m', dtype='bf16').gguf_path)" 2>/dev/null | tail -1)
qwen=$HOME/.cache/specdec/pulled/qwen2.5-coder-1.5b.gguf
for pair in "smollm2-135m $smol" "qwen2.5-coder-1.5b $qwen"; do
  set -- $pair
  for r in 1 2 3; do
    echo "$1 specdec $($py benchmarks/results/2026-11-workspace-pass/abpass.py $1 2>/dev/null | tail -1)"
    echo "$1 llama-bench $($bench_bin -m "$2" -p 1,8 -n 0 -d 512 -t 2 -r 5 -o md 2>/dev/null | grep -E "pp[18] " | awk -F'|' '{print $7 ":" $8}' | tr -s ' ' | tr '\n' ' ')"
  done
done
