#!/usr/bin/env bash
cd /work/main
for run in off-A on-B on-C off-D; do
  ex=${run%%-*}
  [ -s /tmp/exactab/$run/summary.md ] && continue
  rm -rf /tmp/exactab/$run
  uptime > /tmp/exactab/$run.load
  .venv/bin/specdec-hf bench --dtype bf16 --exact $ex --methods plain,logitspec --per-category 2 --max-new-tokens 128 --out /tmp/exactab/$run --no-progress > /tmp/exactab/$run.log 2>&1
  uptime >> /tmp/exactab/$run.load
done
