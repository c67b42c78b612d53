#!/bin/bash
# The compiled verification pass beside the eager one, llama.cpp's backend and llama-server, in one sitting.
cd "$(dirname "$0")/../../.."  # the repository root
OUT=docs/results/2026-11-compiled-step
uptime  # load-start
lscpu | grep -E "Model name|Flags"
.venv/bin/python benchmarks/step_cost.py --backend torch,compiled --pack on --attn auto --contexts 128,512,2048 \
  --sizes 1,4,16,64 --repeats 10 --no-profile > $OUT/step_cost.txt 2> $OUT/step_cost.log
uptime  # load-mid
.venv/bin/python benchmarks/llamacpp_bench.py --per-category 10 --backends torch,compiled,llamacpp \
  --methods plain,pld,logitspec --spec-types ngram-mod --out $OUT/rows.jsonl > $OUT/summary.txt 2> $OUT/bench.log
uptime  # load-end
