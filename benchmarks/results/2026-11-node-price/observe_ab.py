"""logitspec's plain (floor-gated) steps with (old) and without (new, the code's) the recycle table's update, arms in
ABBA order in one process, fresh floor an arm, held-out turns (`arms.py`).

    .venv/bin/python benchmarks/results/2026-11-node-price/observe_ab.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from arms import run_arm, setup

from specdec.proposers.logitspec.proposer import MAX_HEAT, LogitSpecProposer, count_sources, learn_step

new_observe = LogitSpecProposer.observe


def old_observe(self, result):  # the update on every step, plain steps included
    step, self._last = self._last, None
    heat, self._heat = self._heat, min(result.num_accepted, MAX_HEAT)
    if self.sources.recycle is not None:
        self.sources.recycle.update(result.tree.tokens, result.target_logits)
    if step is None:
        return
    count_sources(self.source_stats, step.sources, result.path)
    learn_step(self.stats, step, result.tree.token_list[0], result.tokens, heat)


loaded, engine, turns = setup()
for arm in ("old", "new", "new", "old"):
    LogitSpecProposer.observe = old_observe if arm == "old" else new_observe
    print(f"{arm}: {run_arm(loaded, engine, turns, 'logitspec')}", flush=True)
