"""The server runs its model on one thread: the decode worker's.

Why: PyTorch's CPU kernels, ours included (`at::parallel_for`), run on OpenMP, and libgomp keeps a
pool of worker threads for every thread that has started a parallel region, for as long as that
thread lives. Once two live threads hold pools, libgomp's threads outnumber the cores and its
workers stop spinning between regions (its "throttled" wait): every fork and join then wakes a
sleeping thread. A pass of a small model is hundreds of short regions, so the decode worker ran
about half as fast as the same decoding on the main thread, because the main thread had loaded
the model and so held a pool (measured: docs/results/2026-11-server-threads,
`benchmarks/thread_pools.py`). The main thread serves HTTP for the whole life of the process, so it
must never start a parallel region: the model is loaded, measured and warmed on a thread that ends
(its pool goes with it), and after that only the decode worker runs the model.

Invariant: after `off_main_thread` returns, the thread that ran `build` has ended.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def off_main_thread(build: Callable[[], T]) -> T:
    """build() on a thread of its own, which has ended when this returns (its error is raised here)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdec-startup") as pool:
        return pool.submit(build).result()
