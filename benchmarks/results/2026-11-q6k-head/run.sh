#!/usr/bin/env bash
# One sitting, alone: Qwen2.5-Coder-1.5B's Q6_K head multiplied from its own 6-bit values, int8 sub-scales and
# fp16 super-block scales (`q6_k.Q6Linear`) instead of 8-bit values with an fp32 scale per 16, beside llama.cpp's
# own tools on the same GGUF (llama-bench for pass costs, llama-server for decoding, plain and with n-gram
# speculation), and the two head forms in one process (`ab.py`: same bits, so the same texts).
# Resumable: each step writes its own file and is skipped when that file exists.
set -u
cd "$(dirname "$0")/../../.."
out=docs/results/2026-11-q6k-head
py=$PWD/.venv/bin/python
bin=$($py benchmarks/llamacpp_bench.py --build-only | tail -1)
bench_bin=$(dirname "$bin")/llama-bench
smol=$($py -c "from specdec.models import load_model; print(load_model('smollm2-135m', dtype='bf16').gguf_path)" 2>/dev/null | tail -1)
qwen=$HOME/.cache/specdec/pulled/qwen2.5-coder-1.5b.gguf
[ -s $out/machine.txt ] || lscpu | grep -E "Model name|^Flags" | sed 's/^Flags:.*\(avx512_bf16\).*\(avx512_vnni\).*/Flags: ... avx512_bf16 ... avx512_vnni .../' > $out/machine.txt
uptime >> $out/machine.txt
step() { local file=$1; shift; [ -s "$out/$file" ] && return; echo "== $file: $*" >&2; "$@" > "$out/$file.tmp" && mv "$out/$file.tmp" "$out/$file"; }
# The head alone and whole decoding, both forms in one process (held-out math_reasoning questions 11-13).
step ab.txt $py benchmarks/results/2026-11-q6k-head/ab.py plain logitspec
# Pass costs at 512 tokens of context: llama-bench (-p N at depth 512: one pass over N tokens), the engine's passes.
step llama-bench-qwen.md $bench_bin -m "$qwen" -p 1,2,4,8 -n 16 -d 512 -t 2 -r 3 -o md
step step_cost-qwen.md $py benchmarks/step_cost.py --model qwen2.5-coder-1.5b --dtype bf16 \
  --backend torch-int4-exact --contexts 512 --sizes 1,2,4,8 --no-profile --repeats 7
step llama-bench-smollm2.md $bench_bin -m "$smol" -p 1,2,4,8,16 -n 32 -d 512 -t 2 -r 5 -o md
step step_cost-smollm2.md $py benchmarks/step_cost.py --dtype bf16 --backend torch-int4-exact \
  --contexts 512 --sizes 1,2,4,8,16 --no-profile --repeats 21
uptime >> $out/machine.txt
# Qwen2.5-Coder-1.5B on the coding and math questions (MT-Bench's, first 10 each, first turns: 20 prompts), 128
# new tokens, greedy: llama-server plain and with n-gram speculation, specdec at default settings.
step spec-bench-qwen.md $py benchmarks/llamacpp_bench.py --model qwen2.5-coder-1.5b --categories coding,math \
  --per-category 10 --backends default --methods plain,logitspec --spec-types ngram-mod \
  --out $out/spec-bench-qwen.jsonl
uptime >> $out/machine.txt
