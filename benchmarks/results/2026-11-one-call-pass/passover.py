"""The Python around a verification pass's C++ ops: SmolLM2 at 512 tokens of context, a 6-node tree and a
one-node one, 300 passes (`BatchedTarget.verify_trees`, then rollback) a round, wall clock less the time
inside `decoder_pass` and the head's `q8_linear`, microseconds a pass. SRC picks the source tree."""
import os
import sys
import time

import torch

sys.path.insert(0, os.environ.get("SRC", "src"))
from specdec.backends.registry import verifier
from specdec.backends.torch.rows import BatchedTarget
from specdec.models import load_model
from specdec.tree import DraftTree

loaded = load_model("smollm2-135m")
single = verifier(loaded)
rows = BatchedTarget(single)
g = torch.Generator().manual_seed(0)
rows.add(torch.randint(0, 40000, (512,), generator=g).tolist())
trees = [DraftTree(torch.randint(0, 40000, (6,), generator=g), torch.tensor([-1, 0, 0, 1, 2, 3])),
         DraftTree(torch.randint(0, 40000, (1,), generator=g), torch.tensor([-1]))]
optime = [0.0]
for ns, name in (("specdec_layer", "decoder_pass"), ("specdec_q4", "q8_linear")):
    ops = getattr(torch.ops, ns)
    f = getattr(ops, name)
    class W:
        def __init__(s, f): s.f = f
        def __call__(s, *a):
            t = time.perf_counter()
            r = s.f(*a)
            optime[0] += time.perf_counter() - t
            return r
    setattr(ops, name, W(f))
N = 300
for tree in trees:
    res = []
    for _rnd in range(3):
        optime[0] = 0
        s = time.perf_counter()
        for _ in range(N):
            rows.verify_trees([tree])
            rows.rollback()
        total = time.perf_counter() - s
        res.append(f"{1e6 * (total - optime[0]) / N:.0f}")
    print(f"{tree.num_nodes} nodes: python around the ops {' / '.join(res)} us a pass")
