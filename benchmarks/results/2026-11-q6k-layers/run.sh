#!/usr/bin/env bash
# One sitting, alone: Qwen2.5-Coder-1.5B with its Q6_K decoder tensors (attn_v and ffn_down in 14 of 28 layers)
# run from their own bits: its pass beside llama-bench on the same file, then the Spec-Bench comparison
# beside llama-server (coding and math, first 10 each, interleaved per prompt). ab_steps.sh (run before it) has
# the pass against the previous tree's, where those tensors were re-quantized to 4 bits. Resumable: each step
# writes its own file, skipped when it exists.
set -u
cd "$(dirname "$0")/../../.."
out=docs/results/2026-11-q6k-layers
py=$PWD/.venv/bin/python
[ -s $out/machine.txt ] || lscpu | grep -E "Model name|CPU family|Model:|MHz" > $out/machine.txt
uptime >> $out/machine.txt
step() { local file=$1; shift; [ -s "$out/$file" ] && return; echo "== $file: $*" >&2; "$@" > "$out/$file.tmp" && mv "$out/$file.tmp" "$out/$file"; }
bin=$($py benchmarks/llamacpp_bench.py --build-only | tail -1)
bench_bin=$(dirname "$bin")/llama-bench
qwen=$HOME/.cache/specdec/pulled/qwen2.5-coder-1.5b.gguf
step llama-bench-qwen.md $bench_bin -m "$qwen" -p 1,2,4,8 -n 16 -d 512 -t 2 -r 3 -o md
step step_cost-qwen.md $py benchmarks/step_cost.py --model qwen2.5-coder-1.5b --dtype bf16 \
  --backend torch-int4-exact --contexts 512 --sizes 1,2,4,8 --no-profile --repeats 7
uptime >> $out/machine.txt
step spec-bench-qwen.md $py benchmarks/llamacpp_bench.py --model qwen2.5-coder-1.5b --categories coding,math \
  --per-category 10 --backends default --methods plain,logitspec --spec-types ngram-mod --interleave \
  --out $out/spec-bench-qwen.jsonl
uptime >> $out/machine.txt
# SmolLM2 on the same machine (its bundled GGUF has no Q6_K tensor: its path is unchanged), for the same sitting's
# ratios.
smol=$($py -c "from specdec.models import load_model; print(load_model('smollm2-135m', dtype='bf16').gguf_path)" 2>/dev/null | tail -1)
step llama-bench-smollm2.md $bench_bin -m "$smol" -p 1,2,4,8,16 -n 32 -d 512 -t 2 -r 5 -o md
step step_cost-smollm2.md $py benchmarks/step_cost.py --dtype bf16 --backend torch-int4-exact \
  --contexts 512 --sizes 1,2,4,8,16 --no-profile --repeats 21
uptime >> $out/machine.txt
step spec-bench-smollm2.md $py benchmarks/llamacpp_bench.py --per-category 10 --backends default \
  --methods plain,logitspec --spec-types ngram-map-k,ngram-mod --interleave --out $out/spec-bench-smollm2.jsonl
uptime >> $out/machine.txt
