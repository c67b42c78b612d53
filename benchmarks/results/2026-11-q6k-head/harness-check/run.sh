#!/usr/bin/env bash
# Does running the engines interleaved per prompt (`llamacpp_bench.py --interleave`) change specdec's speculation
# gain against its own plain decoding? Held-out questions (11-13 of each category, `--skip 10`): sequential,
# interleaved, sequential again, alone. Resumable.
set -u
cd "$(dirname "$0")/../../../.."
out=docs/results/2026-11-q6k-head/harness-check
py=$PWD/.venv/bin/python
uptime > $out/machine.txt
for run in sequential interleaved sequential-again; do
  [ -s $out/$run.md ] && continue
  flag=""; [ $run = interleaved ] && flag=--interleave
  $py benchmarks/llamacpp_bench.py --skip 10 --per-category 3 --backends default --methods plain,logitspec \
    --spec-types "" $flag --out $out/$run.jsonl > $out/$run.md.tmp && mv $out/$run.md.tmp $out/$run.md
  uptime >> $out/machine.txt
done
