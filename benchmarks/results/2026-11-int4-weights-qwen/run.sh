#!/bin/bash
# Qwen2.5-Coder-1.5B (the pulled Q4_K_M GGUF): 4-bit weights against bf16 ones, eager, and llama-server, in one sitting.
# Needs: .venv/bin/specdec-hf models pull qwen2.5-coder-1.5b (and one load to convert it) before.
cd "$(dirname "$0")/../../.."  # the repository root
OUT=docs/results/2026-11-int4-weights-qwen
uptime  # load-start
lscpu | grep -E "Model name|Flags"
.venv/bin/python benchmarks/step_cost.py --model qwen2.5-coder-1.5b --backend torch,torch-int4 --pack on --attn auto \
  --contexts 512 --sizes 1,4,16 --repeats 5 --no-profile > $OUT/step_cost.txt 2> $OUT/step_cost.log
uptime  # load-mid
.venv/bin/python benchmarks/llamacpp_bench.py --model qwen2.5-coder-1.5b --per-category 2 --backends torch,torch-int4 \
  --methods plain,logitspec --spec-types "" --out $OUT/rows.jsonl > $OUT/summary.txt 2> $OUT/bench.log
uptime  # load-end
