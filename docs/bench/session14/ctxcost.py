import time, statistics, torch
from specdec.models import load_model
from specdec.engine import Engine
from specdec.tree import DraftTree
from specdec.verify import verify
from specdec.sampling import SamplingParams
loaded = load_model("smollm2-135m", dtype="bf16")
eng = Engine(loaded); tgt = eng.target
g = torch.Generator().manual_seed(0)
for ctx in (128, 384, 1024, 2048):
    ids = torch.randint(100, 40000, (ctx,), generator=g).tolist()
    tgt.reset(); tgt.prefill(ids)
    row = []
    for n in (1, 2, 4, 8, 12, 16):
        tree = DraftTree(torch.randint(100, 40000, (n,), generator=g), torch.tensor([-1] + [0] * (n - 1)))
        ts, tv = [], []
        for r in range(12):
            t0 = time.perf_counter(); tgt.forward_tree(tree.tokens, tree.parents); t1 = time.perf_counter()
            tgt.trim(ctx); ts.append(t1 - t0)
            t0 = time.perf_counter(); verify(tgt, tree, SamplingParams(), None); t1 = time.perf_counter()
            tgt.trim(ctx); tv.append(t1 - t0)
        row.append(f"{n}:{1000*statistics.median(ts):.1f}/{1000*statistics.median(tv):.1f}")
    print(ctx, " ".join(row), flush=True)
