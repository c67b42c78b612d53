#!/usr/bin/env bash
# A second sitting, alone, after the first: tree attention running a key head's query heads together,
# drafting's top-k in the extension and the cache claim without views. SmolLM2's pass costs and Spec-Bench
# first turns beside llama-server plain and its two best n-gram speculation types of the first sitting.
# Resumable: each step writes its own file and is skipped when that file exists.
set -u
cd "$(dirname "$0")/../../../.."
out=docs/results/2026-11-int8-activations/second-sitting
py=$PWD/.venv/bin/python
[ -s $out/machine.txt ] || lscpu | grep -E "Model name" > $out/machine.txt
uptime >> $out/machine.txt
step() { local file=$1; shift; [ -s "$out/$file" ] && return; echo "== $file: $*" >&2; "$@" > "$out/$file.tmp" && mv "$out/$file.tmp" "$out/$file"; }
step step_cost-smollm2.md $py benchmarks/step_cost.py --dtype bf16 --backend torch-int4-exact \
  --contexts 512 --sizes 1,2,4,8,16 --no-profile --repeats 21
step spec-bench-smollm2.md $py benchmarks/llamacpp_bench.py --per-category 10 --backends default \
  --methods plain,logitspec --spec-types ngram-map-k,ngram-mod --out $out/spec-bench-smollm2.jsonl
uptime >> $out/machine.txt
