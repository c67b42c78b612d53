#!/bin/bash
# ABBA of two checkouts on the compiled backend, 30 prompts (5 per category): OLD, a checkout of the
# commit before the per-step overhead cuts (`git worktree add OLD 5b4e51e`), against NEW, this one.
# Both run with NEW's environment; each bench imports its own checkout's src/.
NEW="$(cd "$(dirname "$0")/../../../.." && pwd)"
OLD="${OLD:?set OLD to the older checkout}"
OUT="$NEW/docs/results/2026-11-compiled-overhead/ab"
uptime > $OUT/load-start.txt
for tag in old new new2 old2; do
  case $tag in old*) tree=$OLD ;; new*) tree=$NEW ;; esac
  $NEW/.venv/bin/python $tree/benchmarks/llamacpp_bench.py --per-category 5 --backends compiled \
    --methods plain,logitspec --spec-types "" --out $OUT/$tag.jsonl > $OUT/$tag.txt 2> /dev/null
done
uptime > $OUT/load-end.txt
