"""The node price on and off (`FloorState.node_price` -> None), arms in ABBA order in one process, fresh floor an
arm, held-out turns (`arms.py`).

    .venv/bin/python benchmarks/results/2026-11-node-price/price_ab.py [METHOD]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from arms import run_arm, setup

from specdec.engine.floor import FloorState

method = sys.argv[1] if len(sys.argv) > 1 else "logitspec"
priced = FloorState.node_price
loaded, engine, turns = setup()
for arm in os.environ.get("ORDER", "off,on,on,off").split(","):
    FloorState.node_price = priced if arm == "on" else (lambda self: None)
    print(f"{arm}: {run_arm(loaded, engine, turns, method)}", flush=True)
