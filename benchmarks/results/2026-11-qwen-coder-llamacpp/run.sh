#!/bin/bash
# Qwen2.5-Coder-1.5B (the pulled Q4_K_M GGUF) with its 0.5B draft: specdec's plain, logitspec and draft
# pair on the torch backend (bf16, 4-bit) and the llama.cpp backend, beside llama-server plainly, with
# its ngram-mod speculation and with the same draft model, in one sitting.
# Needs: .venv/bin/specdec-hf models pull qwen2.5-coder-1.5b / qwen2.5-coder-0.5b (and one load of each
# to convert it) before.
cd "$(dirname "$0")/../../.."  # the repository root
OUT=docs/results/2026-11-qwen-coder-llamacpp
DRAFT=qwen2.5-coder-0.5b
uptime  # load-start
lscpu | grep -E "Model name|Flags"
.venv/bin/python benchmarks/step_cost.py --model qwen2.5-coder-1.5b --backend llamacpp \
  --contexts 512 --sizes 1,2,4,8,16 --repeats 5 --no-profile > $OUT/step_cost.txt 2> $OUT/step_cost.log
uptime  # load-mid
.venv/bin/python benchmarks/llamacpp_bench.py --model qwen2.5-coder-1.5b --per-category 2 \
  --backends llamacpp,torch,torch-int4 --draft-model $DRAFT --spec-types ngram-mod \
  --methods plain,logitspec,draft:draft_model=$DRAFT,jump=2,fill=6 \
  --out $OUT/rows.jsonl > $OUT/summary.txt 2> $OUT/bench.log
uptime  # load-end
