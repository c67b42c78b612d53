#!/bin/bash
# SmolLM2-135M on the compiled backend (bf16 and 4-bit weights) beside llama-server plain, after the
# compiled pass's per-step overheads were cut (attention switch, packed-product op), in one sitting.
cd "$(dirname "$0")/../../.."  # the repository root
OUT=docs/results/2026-11-compiled-overhead
uptime  # load-start
lscpu | grep -E "Model name|Flags"
.venv/bin/python benchmarks/step_cost.py --backend compiled,compiled-int4 --pack on --attn auto \
  --contexts 512 --sizes 1,4,16 --repeats 7 --no-profile > $OUT/step_cost.txt 2> $OUT/step_cost.log
uptime  # load-mid
.venv/bin/python benchmarks/llamacpp_bench.py --per-category 10 --backends compiled,compiled-int4 \
  --methods plain,pld,logitspec --spec-types "" --out $OUT/rows.jsonl > $OUT/summary.txt 2> $OUT/bench.log
uptime  # load-end
