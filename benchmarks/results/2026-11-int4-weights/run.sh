#!/bin/bash
# 4-bit decoder weights (pack=int4) beside the model's bf16 weights, eager and compiled, and llama-server, in one sitting.
cd "$(dirname "$0")/../../.."  # the repository root
OUT=docs/results/2026-11-int4-weights
uptime  # load-start
lscpu | grep -E "Model name|Flags"
.venv/bin/python benchmarks/step_cost.py --backend compiled,torch-int4,compiled-int4 --contexts 128,512,2048 \
  --sizes 1,4,16,64 --repeats 10 > $OUT/step_cost.txt 2> $OUT/step_cost.log
uptime  # load-mid
.venv/bin/python benchmarks/llamacpp_bench.py --per-category 10 --backends compiled,compiled-int4,torch-int4 \
  --methods plain,pld,logitspec --spec-types "" --out $OUT/rows.jsonl > $OUT/summary.txt 2> $OUT/bench.log
uptime  # load-end
# Then the A/B of ab.txt: each backend in a process of its own, alternating, twice.
uptime > $OUT/ab.txt
for i in 1 2; do for b in compiled compiled-int4; do
  .venv/bin/python benchmarks/step_cost.py --backend $b --contexts 128,512 --sizes 1,4,16 --repeats 20 2>/dev/null | grep "^| $b" >> $OUT/ab.txt
done; done
uptime >> $OUT/ab.txt
.venv/bin/python benchmarks/int8_products.py > $OUT/products.txt
