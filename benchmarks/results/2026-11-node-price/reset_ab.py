"""A new row's try schedule from the start (on: the carried state's gap and step count reset, its rates kept) or
carried whole (off, the code's), arms in ABBA order in one process, fresh floor an arm, held-out turns (`arms.py`).

    .venv/bin/python benchmarks/results/2026-11-node-price/reset_ab.py [METHOD]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from arms import run_arm, setup

from specdec.engine import floor

method = sys.argv[1] if len(sys.argv) > 1 else "logitspec"
carried = floor.Floor.start


def fresh_start(self, proposer, greedy=True):
    state = carried(self, proposer, greedy)
    if state.leader is not None:
        state.since, state.gap = 0, floor.PLAIN_TRY_GAP if state.leader else floor.EXPLORE[0]
    return state


loaded, engine, turns = setup()
for arm in os.environ.get("ORDER", "off,on,on,off").split(","):
    floor.Floor.start = fresh_start if arm == "on" else carried
    print(f"{arm}: {run_arm(loaded, engine, turns, method)}", flush=True)
