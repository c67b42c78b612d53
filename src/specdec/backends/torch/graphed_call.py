"""A small fixed-shape computation replayed as a CUDA graph (`GraphedCall`): a trained head's drafting step.

Why: a Medusa or Hydra head drafts with a few small products, a log-softmax and a
top-k per step (or per tree level). On a GPU each of those is a kernel launch of
several microseconds of host time around a few microseconds of work, so an eager
head costs its launches, not its math, beside a verification pass that replays as
one graph (`graphs.GraphedPass`). A captured graph replays the head's kernels from
one launch.

How: `GraphedCall(fn)` runs `fn(key, *tensors)` eagerly the first time it sees a
call's signature (the inputs' shapes, dtypes and devices, and a hashable `key` for
what else shapes the work, e.g. a head's depth); on CUDA it captures that
call (inputs copied into its own static tensors, a warm-up on a side stream, one
memory pool for every graph) and later calls with the signature copy their inputs
in and replay.

Invariants:
- `fn` is a pure function of its key and tensor inputs, with fixed output shapes,
  and reads nothing back to the host (a graph records device work only);
- an output is the graph's own tensor, overwritten by the next replay of the same
  signature: callers read it (e.g. `.tolist()`) before calling again;
- without CUDA the call runs eagerly (`mode` says which); a failed capture is
  reported once as a warning and every later call runs eagerly, with the same
  results, since a graph replays exactly the kernels eager ran.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from specdec.models.base import one_line

WARMUP = 2  # eager runs on a side stream before a capture (cuBLAS and the allocator settle)

Outputs = torch.Tensor | tuple[torch.Tensor, ...]


@dataclass
class _Graph:
    inputs: tuple[torch.Tensor, ...]
    outputs: Outputs
    graph: torch.cuda.CUDAGraph


class GraphedCall:
    """`fn(key, *tensors)` replayed as one CUDA graph per signature on a GPU; eager elsewhere."""

    def __init__(self, fn: Callable[..., Outputs], use_graphs: bool | None = None) -> None:
        """use_graphs: None: graphs for calls whose inputs are on CUDA; False: always eager (what the CPU runs)."""
        self.fn = fn
        self.use_graphs = use_graphs
        if use_graphs and not torch.cuda.is_available():
            raise ValueError("CUDA graphs need a CUDA device")
        self.failure: str | None = None  # why a capture failed, once one has
        self._graphs: dict[tuple, _Graph] = {}
        self._pool = None
        self.replays = 0
        self.eager_calls = 0

    @property
    def mode(self) -> str:
        """"cuda-graphs" where calls on CUDA inputs replay graphs, else "eager" (no CUDA, turned off, or a
        capture failed)."""
        eager = self.use_graphs is False or self.failure is not None or not torch.cuda.is_available()
        return "eager" if eager else "cuda-graphs"

    @property
    def captured(self) -> int:
        """Graphs captured and kept (one a signature)."""
        return len(self._graphs)

    def graphs_for(self, *inputs: torch.Tensor) -> bool:
        """Whether a call on `inputs` replays a graph (captures run, and every input is on CUDA)."""
        return self.mode == "cuda-graphs" and all(tensor.device.type == "cuda" for tensor in inputs)

    def __call__(self, *inputs: torch.Tensor, key: Hashable = None) -> Outputs:
        if not self.graphs_for(*inputs):
            self.eager_calls += 1
            return self.fn(key, *inputs)
        signature = (key, *((tuple(t.shape), t.dtype, t.device) for t in inputs))
        graph = self._graphs.get(signature)
        if graph is None:
            return self._capture(signature, key, inputs)
        for static, tensor in zip(graph.inputs, inputs, strict=True):
            static.copy_(tensor, non_blocking=True)
        graph.graph.replay()
        self.replays += 1
        return graph.outputs

    def _capture(self, signature: tuple, key: Hashable, inputs: tuple[torch.Tensor, ...]) -> Outputs:
        """Record the call as the signature's graph and return its first replay's outputs (eager ones if the
        capture fails)."""
        static = tuple(tensor.clone() for tensor in inputs)
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP):
                    self.fn(key, *static)
            torch.cuda.current_stream().wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = self.fn(key, *static)
            graph.replay()
        except Exception as error:  # noqa: BLE001 - any capture failure: the eager call stays
            self.failure = one_line(error)
            warnings.warn(f"capturing a head's step as a CUDA graph failed, running it eagerly: {self.failure}",
                          RuntimeWarning, stacklevel=3)
            self._graphs.clear()
            self._pool = None
            self.eager_calls += 1
            return self.fn(key, *inputs)
        self._graphs[signature] = _Graph(static, outputs, graph)
        self.replays += 1
        return outputs
