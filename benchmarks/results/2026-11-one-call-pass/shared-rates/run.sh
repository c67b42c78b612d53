#!/usr/bin/env bash
# LogitSpec's acceptance rates carried from request to request on the same loaded model (`shared_rates`, the
# default now), alone: chosen on held-out turns (`ab-*.txt`: the same tree with the rates per request, SHARE=0,
# or shared, SHARE=1, alternating processes), then reported on the Spec-Bench comparisons beside llama-server,
# every engine on each prompt in turn. Resumable.
set -u
cd "$(dirname "$0")/../../../.."
out=docs/results/2026-11-one-call-pass/shared-rates
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
