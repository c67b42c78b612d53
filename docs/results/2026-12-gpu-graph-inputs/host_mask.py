"""Host time to build a graphed pass's mask input: before (the additive mask over the cache's capacity, `BatchedTarget._mask`) and after (the trees' ancestry, `graphs.padded_ancestry`; the mask is made in the graph). Run from the repository root: .venv/bin/python docs/results/2026-12-gpu-graph-inputs/host_mask.py"""
import time, torch
from specdec.tree import DraftTree
from specdec.backends.torch.rows import BatchedTarget
from specdec.backends.torch.graphs import padded_ancestry
class F: pass
def tree(n): return DraftTree.of_lists(list(range(n)), [-1] + [(i - 1) // 2 for i in range(1, n)])
def clock(f, reps=300):
    for _ in range(30): f()
    t = time.perf_counter()
    for _ in range(reps): f()
    return (time.perf_counter() - t) / reps * 1e6
me = F(); me.dtype = torch.float32; me.device = torch.device("cpu")
for rows, width, nodes, keys in ((1, 1, 1, 1024), (1, 64, 40, 2048), (1, 128, 100, 2048), (8, 16, 12, 4096)):
    trees = [tree(nodes) for _ in range(rows)]; starts = [500] * rows; me.lengths = starts
    before = clock(lambda: BatchedTarget._mask(me, trees, width, keys, starts))
    after = clock(lambda: padded_ancestry(trees, width))
    print(f"rows {rows} width {width} nodes {nodes} keys {keys}: mask {before:.1f} us ({rows*width*keys*4/1024:.0f} KiB) -> ancestry {after:.1f} us ({rows*width*width/1024:.1f} KiB)")
