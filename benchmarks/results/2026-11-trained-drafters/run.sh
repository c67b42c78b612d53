#!/bin/bash
cd "$(dirname "$0")/../../.."  # the repository root
RESULTS=${RESULTS:-results/trained-drafters}
uptime  # load-start: the load seen
lscpu | grep -E "Model name|Flags"
mkdir -p "$RESULTS"
.venv/bin/specdec-hf bench --per-category 10 --max-new-tokens 128 --warmup 1 --no-progress \
  --methods plain,hf-greedy,pld,logitspec,eagle,eagle:retrieval=true,medusa \
  --out "$RESULTS"/greedy > "$RESULTS"/greedy.log 2>&1
uptime  # load-mid: the load seen
.venv/bin/specdec-hf bench --per-category 10 --max-new-tokens 128 --warmup 1 --no-progress --temperature 1.0 --seed 0 \
  --methods plain,pld,logitspec,eagle,eagle:sampled=true,eagle:retrieval=true,medusa \
  --out "$RESULTS"/temp1 > "$RESULTS"/temp1.log 2>&1
uptime  # load-end: the load seen

