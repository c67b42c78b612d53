#!/usr/bin/env bash
# The Spec-Bench comparisons again, alone, right after the first sitting, with every engine run on each prompt in
# turn (`llamacpp_bench.py --interleave`: the machine's drift meets every engine alike). Resumable.
set -u
cd "$(dirname "$0")/../../../.."
out=docs/results/2026-11-q6k-head/interleaved
py=$PWD/.venv/bin/python
lscpu | grep -E "Model name" > $out/machine.txt
uptime >> $out/machine.txt
step() { local file=$1; shift; [ -s "$out/$file" ] && return; echo "== $file: $*" >&2; "$@" > "$out/$file.tmp" && mv "$out/$file.tmp" "$out/$file"; }
step spec-bench-qwen.md $py benchmarks/llamacpp_bench.py --model qwen2.5-coder-1.5b --categories coding,math \
  --per-category 10 --backends default --methods plain,logitspec --spec-types ngram-mod --interleave \
  --out $out/spec-bench-qwen.jsonl
uptime >> $out/machine.txt
step spec-bench-smollm2.md $py benchmarks/llamacpp_bench.py --per-category 10 --backends default \
  --methods plain,logitspec --spec-types ngram-map-k,ngram-mod --interleave --out $out/spec-bench-smollm2.jsonl
uptime >> $out/machine.txt
