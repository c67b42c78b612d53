"""The same method over the same held-out turns, arm after arm in one process (fresh floor an arm): how far one
sitting moves (`arms.py`).

    ARMS=4 .venv/bin/python benchmarks/results/2026-11-node-price/drift.py METHOD
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from arms import run_arm, setup

method = sys.argv[1]
loaded, engine, turns = setup()
for arm in range(int(os.environ.get("ARMS", "4"))):
    print(f"arm {arm}: {run_arm(loaded, engine, turns, method)}", flush=True)
