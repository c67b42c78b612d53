#!/bin/bash
# Reproduce the benchmark tables of docs/benchmarks.md, one workload per call:
#
#   benchmarks/spec_bench.sh WORKLOAD [OUT_DIR]
#
# WORKLOAD: greedy | sampling | lookahead-layerskip | session | third | qwen-retrieval |
#           qwen-draft | qwen-draft-hf | qwen-draft-mixed | qwen-draft-other | qwen-draft-sampling | qwen-hybrid
# The qwen-* workloads need `specdec models pull qwen2.5-coder-1.5b` and `... qwen2.5-coder-0.5b`.
# Run it alone on the machine: every number is a wall-clock time. The results folder gets
# summary.md/.csv, manifest.json (settings, machine, versions) and responses.jsonl; an
# interrupted run continues with `specdec bench ... --resume OUT_DIR`.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SPECDEC="${SPECDEC:-$ROOT/.venv/bin/specdec}"
WORKLOAD="${1:?usage: $0 WORKLOAD [OUT_DIR]}"
OUT="${2:-$ROOT/results/$WORKLOAD-$(date -u +%Y%m%dT%H%M%S)}"
QWEN="--model qwen2.5-coder-1.5b --dtype bf16"
DRAFT=qwen2.5-coder-0.5b
CODE_MATH="--data $ROOT/docs/results/2026-11-qwen-coder-draft/questions.jsonl"
COMMON="--max-new-tokens 128 --warmup 1 --no-progress --out $OUT"

case "$WORKLOAD" in
  greedy)
    args="--dtype bf16 --per-category 10 --methods plain,hf-greedy,hf-pld,pld,recycle,logitspec,logitspec:adaptive=false" ;;
  sampling)
    args="--dtype bf16 --per-category 10 --temperature 1.0 --seed 0 --methods plain,pld,logitspec,recycle" ;;
  lookahead-layerskip)
    args="--dtype bf16 --per-category 10 --methods plain,hf-greedy,hf-pld,pld,logitspec,lookahead,layerskip" ;;
  session)
    args="--dtype bf16 --workload session --per-category 10 --methods plain,pld,logitspec,logitspec:session=true,session" ;;
  third)
    args="--dtype bf16 --per-category 5 --methods pld,logitspec,logitspec:third=true" ;;
  qwen-retrieval)
    args="$QWEN --data $ROOT/docs/results/2026-11-qwen-coder-retrieval/questions.jsonl --methods plain,hf-pld,pld,recycle,logitspec" ;;
  qwen-draft)
    args="$QWEN $CODE_MATH --categories coding,math --per-category 10 --methods draft:draft_model=$DRAFT,draft:draft_model=$DRAFT,jump=2,draft:draft_model=$DRAFT,jump=2,fill=6,logitspec" ;;
  qwen-draft-hf)
    args="$QWEN $CODE_MATH --categories coding,math --per-category 10 --draft-model $DRAFT --methods hf-assisted,draft:draft_model=$DRAFT,draft:draft_model=$DRAFT,jump=2,logitspec" ;;
  qwen-draft-mixed)
    args="$QWEN $CODE_MATH --per-category 10 --draft-model $DRAFT --methods plain,hf-greedy,draft:draft_model=$DRAFT,draft:draft_model=$DRAFT,jump=2,logitspec" ;;
  qwen-draft-other)
    args="$QWEN $CODE_MATH --categories translation,summarization,qa,math_reasoning,rag --per-category 2 --draft-model $DRAFT --methods hf-assisted,draft:draft_model=$DRAFT,draft:draft_model=$DRAFT,jump=2,fill=6" ;;
  qwen-draft-sampling)
    args="$QWEN $CODE_MATH --categories coding,math --per-category 5 --temperature 1.0 --seed 0 --methods plain,draft:draft_model=$DRAFT,draft:draft_model=$DRAFT,jump=2" ;;
  qwen-hybrid)
    args="$QWEN $CODE_MATH --categories coding,math --per-category 4 --draft-model $DRAFT --methods plain,hf-assisted,draft:draft_model=$DRAFT,logitspec,hybrid:draft_model=$DRAFT,rate=kind" ;;
  *) echo "unknown workload: $WORKLOAD" >&2; exit 2 ;;
esac
# shellcheck disable=SC2086
"$SPECDEC" bench $args $COMMON
