#!/usr/bin/env bash
# The compiled pass (inductor) on specdec's 4-bit kernel and on bf16 weights, after run.sh, alone.
# Compiling happens first and untimed: a warm-up bench of 2 questions per configuration.
set -u
cd "$(dirname "$0")/../../.."
out=docs/results/2026-11-q4-kernel
py=.venv/bin/python
for config in "compiled-int4:--pack int4" "compiled-bf16:--pack auto"; do
  name=${config%%:*}; flags=${config#*:}
  [ -s "$out/bench-$name/summary.md" ] && continue
  rm -rf "/tmp/warm-$name" "$out/bench-$name"
  start=$(date +%s)
  .venv/bin/specdec-hf bench --backend compiled --dtype bf16 $flags --methods plain,logitspec --per-category 1 \
    --max-new-tokens 128 --out "/tmp/warm-$name" --no-progress > "$out/warm-$name.log" 2>&1
  echo "$name: compile and warm-up $(( $(date +%s) - start )) s" >> $out/compile_times.txt
  .venv/bin/specdec-hf bench --backend compiled --dtype bf16 $flags --methods plain,logitspec --per-category 10 \
    --max-new-tokens 128 --out "$out/bench-$name" --no-progress > "$out/bench-$name.log" 2>&1
done
[ -s $out/step_cost_compiled.md ] || $py benchmarks/step_cost.py --dtype bf16 --backend compiled-int4,compiled --pack on \
  --contexts 512 --sizes 1,2,4,8,16 --no-profile --repeats 15 > $out/step_cost_compiled.md
uptime >> $out/machine.txt
