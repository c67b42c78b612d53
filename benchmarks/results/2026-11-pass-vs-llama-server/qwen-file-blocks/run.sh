#!/usr/bin/env bash
# Qwen2.5-Coder-1.5B once its Q4_K layers are read from the file (exact) instead of re-quantized: pass costs
# beside llama-bench and llama-cpp-python, and Spec-Bench coding + math beside llama-server plain. Alone.
set -u
cd "$(dirname "$0")/../../../.."
out=docs/results/2026-11-pass-vs-llama-server/qwen-file-blocks
py=$PWD/.venv/bin/python
bin=$($py benchmarks/llamacpp_bench.py --build-only | tail -1)
qwen=$HOME/.cache/specdec/pulled/qwen2.5-coder-1.5b.gguf
step() { local file=$1; shift; [ -s "$out/$file" ] && return; echo "== $file: $*" >&2; "$@" > "$out/$file.tmp" && mv "$out/$file.tmp" "$out/$file"; }
uptime > $out/machine.txt
step llama-bench-qwen.md $(dirname "$bin")/llama-bench -m "$qwen" -p 1,2,4,8 -n 16 -d 512 -t 2 -r 3 -o md
step step_cost-qwen.md $py benchmarks/step_cost.py --model qwen2.5-coder-1.5b --dtype bf16 \
  --backend torch-int4-exact,llamacpp --contexts 512 --sizes 1,2,4,8 --no-profile --repeats 7
uptime >> $out/machine.txt
step spec-bench-qwen.md $py benchmarks/llamacpp_bench.py --model qwen2.5-coder-1.5b --categories coding,math \
  --per-category 10 --backends default --methods plain,logitspec --spec-types "" --out $out/spec-bench-qwen.jsonl
uptime >> $out/machine.txt
