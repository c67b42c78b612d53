"""The KV cache's bookkeeping a SmolLM2 pass pays, 30 layers' claim and trim, this tree's `PreallocatedLayer`
against BEFORE's (a worktree of the commit before), in one process, three rounds. Usage: claims.py BEFORE."""
import importlib.util
import sys
import time

import torch


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m
new = load("src/specdec/backends/torch/kv_cache.py", "kv_new")
old = load(sys.argv[1] + "/src/specdec/backends/torch/kv_cache.py", "kv_old")
for _rnd in range(3):
    for name, mod in (("before", old), ("after", new)):
        layers = [mod.PreallocatedLayer(1024) for _ in range(30)]
        for layer in layers:
            layer.claim(1, 3, 64, torch.bfloat16, 512)
        t = time.perf_counter()
        for _ in range(2000):
            for layer in layers:
                layer.claim(1, 3, 64, torch.bfloat16, 1)
            for layer in layers:
                layer.truncate(512)
        print(f"{name}: {(time.perf_counter() - t) / 2000 * 1e6:.0f} us a pass (30 claims and 30 trims)")
