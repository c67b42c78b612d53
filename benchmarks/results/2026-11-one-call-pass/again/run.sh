#!/usr/bin/env bash
# SmolLM2's Spec-Bench comparison again, alone, half an hour after the first sitting, on the pass with two more
# cuts of Python a pass (fused passes skip transformers' attention-setting context; one row's tree tokens and
# positions from lists). Every engine on each prompt in turn. Resumable.
set -u
cd "$(dirname "$0")/../../../.."
out=docs/results/2026-11-one-call-pass/again
py=$PWD/.venv/bin/python
lscpu | grep -E "Model name" > $out/machine.txt
uptime >> $out/machine.txt
step() { local file=$1; shift; [ -s "$out/$file" ] && return; echo "== $file: $*" >&2; "$@" > "$out/$file.tmp" && mv "$out/$file.tmp" "$out/$file"; }
step spec-bench-smollm2.md $py benchmarks/llamacpp_bench.py --per-category 10 --backends default \
  --methods plain,logitspec --spec-types ngram-map-k,ngram-mod --interleave --out $out/spec-bench-smollm2.jsonl
uptime >> $out/machine.txt
