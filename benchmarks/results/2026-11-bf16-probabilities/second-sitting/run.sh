#!/usr/bin/env bash
# A second sitting of the SmolLM2 Spec-Bench comparison, alone, right after the first: the first ran while this
# machine was in a slow phase (specdec's plain decoding at 3.58 ms a one-token pass in step_cost, yet 4.5 ms a
# token over the prompts; alternating runs of both checkouts minutes later gave 275-281 decode tokens/s).
# Resumable: each step writes its own file and is skipped when that file exists.
set -u
cd "$(dirname "$0")/../../../.."
out=docs/results/2026-11-bf16-probabilities/second-sitting
py=$PWD/.venv/bin/python
[ -s $out/machine.txt ] || lscpu | grep -E "Model name" > $out/machine.txt
uptime >> $out/machine.txt
step() { local file=$1; shift; [ -s "$out/$file" ] && return; echo "== $file: $*" >&2; "$@" > "$out/$file.tmp" && mv "$out/$file.tmp" "$out/$file"; }
step spec-bench-smollm2.md $py benchmarks/llamacpp_bench.py --per-category 10 --backends default \
  --methods plain,logitspec --spec-types ngram-map-k,ngram-mod --out $out/spec-bench-smollm2.jsonl
uptime >> $out/machine.txt
