#!/usr/bin/env bash
# The KV cache's filled-prefix views made when read instead of at every claim and trim: SmolLM2's one- and
# eight-node pass (step_cost.py) and decode tokens/s on held-out turns (questions 11-12 of every category,
# `plain` and `logitspec`, ../2026-11-one-call-pass/ab.py), this tree against BEFORE (a worktree of the commit
# before, its own XDG cache BEFORE_CACHE) in alternating processes, alone. Writes ab-views.txt.
set -u
cd "$(dirname "$0")/../../.."
out=docs/results/2026-11-q6k-layers
py=$PWD/.venv/bin/python; ab=$PWD/benchmarks/results/2026-11-one-call-pass/ab.py
before=${BEFORE:-/tmp/wt-before}; before_cache=${BEFORE_CACHE:-/tmp/xdg-before}
steps() { $py benchmarks/step_cost.py --dtype bf16 --backend torch-int4-exact --contexts 512 --sizes 1,8 --no-profile \
  --repeats 21 2>/dev/null | grep '^| torch' | awk -F'|' '{printf "%s ", $6} END {print ""}'; }
turns() { $py $ab smollm2-135m plain,logitspec 11 12 2>/dev/null | tail -1; }
uptime >> $out/machine.txt
for order in "after before" "before after"; do
  for which in $order; do
    if [ $which = after ]; then
      echo "after   pass ms 1, 8: $(steps)  turns: $(SRC=$PWD/src turns)" >> $out/ab-views.txt
    else
      echo "before  pass ms 1, 8: $(cd $before && XDG_CACHE_HOME=$before_cache steps)  turns: $(SRC=$before/src XDG_CACHE_HOME=$before_cache turns)" >> $out/ab-views.txt
    fi
  done
done
