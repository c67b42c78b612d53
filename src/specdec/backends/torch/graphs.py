"""Verification passes replayed as CUDA graphs: one graph per (rows, nodes) bucket.

Why: on a GPU an eager pass is launch-bound. Python and one kernel launch per
operation per layer cost about the same whatever the model's size, several times
a 7B model's weight-read floor (docs/results/2026-11-gpu-h200), so a tree pass
costs what a one-node pass does and both cost far more than the GPU's work. A
captured graph replays every kernel of the pass from one launch.

How: a graph needs fixed shapes and fixed addresses. A pass of B rows whose
largest tree has T nodes runs padded to its bucket (B', T') (powers of two up
to `MAX_ROWS` x `MAX_NODES`; larger passes run eagerly). Every row attends over
the batched cache's whole capacity, with the additive mask hiding what it must
not see, so the key count is the buffer's, not the context's. The pass's
tokens, positions, trees' ancestry [B', T', T'] and write offsets are copied
into the graph's own input tensors before each replay; the additive mask over
the cache's capacity [B', 1, T', K] is made from them inside the graph
(`capacity_mask`), so the host neither builds nor copies it every step (at 8
rows of 16 nodes over 4096 slots it is 2 MiB in fp32). The logits come out of
the graph's own output tensor.
With `inductor` (the "compiled" backend on a GPU) the pass is compiled first, its
sizes dynamic (or once a bucket: "static"), so a graph replays inductor's fused
kernels instead of ~40 small ones a layer.

Invariants:
- a real node's logits are the unpadded pass's (up to the summation order of
  the kernels a shape picks): padded nodes see only themselves, padded rows are
  batch slots past the live ones, and their cache entries land past every row's
  committed length, where nothing reads them unmasked before they are overwritten;
- a graph holds the cache buffers it was captured on: when the cache grows
  (it doubles) every graph is dropped and recaptured on its next use;
- without CUDA (or after a capture failed, reported once as a warning) the same
  padded pass runs eagerly: `mode` says which, and the CPU tests check the
  padding through it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache

from specdec.backends.compiled import graph_limit
from specdec.backends.torch.batch_cache import BatchLayout
from specdec.backends.torch.target import TargetModel
from specdec.models.base import one_line
from specdec.tree import DraftTree

MAX_NODES = 128  # the largest tree a graph verifies; the paper's trees fit
MAX_ROWS = 16
INDUCTOR = (None, "dynamic", "static")  # how the pass is compiled before its capture, if at all
WARMUP = 2  # eager runs before a capture (cuBLAS and allocator state settle; the writes are the pass's own)


def graph_attention(dtype: torch.dtype) -> str:
    """The attention implementation every graph runs, whatever the plan says for eager passes: transformers'
    "eager" one (products and a softmax) in fp32, where SDPA's one fp32 kernel (memory-efficient attention)
    walks the cache's whole capacity with one block of queries per head, most of an fp32 pass's GPU time
    on a small model; "sdpa" (flash kernels) in half precision."""
    return "eager" if dtype == torch.float32 else "sdpa"


def capacity_mask(ancestry: torch.Tensor, starts: torch.Tensor, window: torch.Tensor, dtype: torch.dtype
                  ) -> torch.Tensor:
    """The additive mask [B, 1, T, K] of a padded pass over the cache's K slots, from ancestry [B, T, T] (bool:
    node j is node i or its ancestor; a padding node is its own only), starts [B] (each row's committed
    length: its nodes sit at slots start .. start + T - 1) and window [K] (0 .. K - 1): a node sees its row's
    committed slots and its own line. Fixed-shape tensor ops only, so a CUDA graph records them."""
    nodes = ancestry.shape[-1]
    offset = window[None, None, :] - starts[:, None, None]  # [B, 1, K]: a slot's place in the row's tree
    in_tree = (offset >= 0) & (offset < nodes)
    index = offset.clamp(0, nodes - 1).expand(-1, nodes, -1)
    allowed = (offset < 0) | (ancestry.gather(2, index) & in_tree)  # [B, T, K]
    blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, blocked)[:, None]


def padded_ancestry(trees: Sequence[DraftTree], width: int) -> torch.Tensor:
    """[B, width, width] bool: each tree's `ancestor_mask` in its top-left corner, a padding node its own
    ancestor only (`capacity_mask`'s input, made on the CPU: B x width^2 bytes)."""
    ancestry = torch.eye(width, dtype=torch.bool).repeat(len(trees), 1, 1)
    for b, tree in enumerate(trees):
        n = tree.num_nodes
        ancestry[b, :n, :n] = tree.ancestor_mask
    return ancestry


def bucket(count: int) -> int:
    """The smallest power of two >= count."""
    if count < 1:
        raise ValueError(f"a pass needs at least one row and one node, got {count}")
    return 1 << (count - 1).bit_length()


def bucket_sizes(sizes: Sequence[int]) -> tuple[int, ...]:
    """The buckets (up to `MAX_NODES`) that passes of `sizes` nodes are padded to, ascending: where a cost
    curve of graphed passes is timed (a pass between two buckets costs the larger)."""
    return tuple(sorted({bucket(n) for n in sizes if bucket(n) <= MAX_NODES}))


@dataclass
class _Graph:
    """One captured pass: its input tensors, its outputs and the graph that reads and writes them."""

    inputs: dict[str, torch.Tensor]  # tokens, positions, ancestry, starts, window
    logits: torch.Tensor
    features: torch.Tensor | None
    graph: torch.cuda.CUDAGraph | None


class GraphedPass:
    """The batched cache's verification pass at bucketed static shapes, replayed as CUDA graphs on a GPU."""

    def __init__(self, single: TargetModel, use_graphs: bool | None = None, inductor: str | None = None,
                 attention: str | None = None) -> None:
        """use_graphs: None: where the model is on CUDA; False: the padded pass eagerly (what the CPU runs).
        inductor: the pass's kernels fused by inductor first (`torch.compile`; what the "compiled" backend asks
        on a GPU), then captured: fewer, larger kernels in each graph; "dynamic": one compilation whose rows,
        nodes and keys are symbolic, "static": one per bucket, its kernels specialised to its sizes (more
        compiling, kernels tuned to known sizes); None: not compiled. attention: the implementation the
        passes run (None: `graph_attention` of the model's dtype)."""
        if inductor not in INDUCTOR:
            raise ValueError(f"inductor must be one of {INDUCTOR}, got {inductor!r}")
        self.single = single
        self.attention = attention or graph_attention(single.dtype)
        self.inductor = inductor
        self._compiled = None if inductor is None else torch.compile(single.forward_pass, dynamic=inductor == "dynamic")
        self.compile_failure: str | None = None
        cuda = single.device.type == "cuda"
        if use_graphs and not cuda:
            raise ValueError("CUDA graphs need a model on a CUDA device")
        self.use_graphs = cuda if use_graphs is None else use_graphs
        self.failure: str | None = None  # why a capture failed, once one has
        self._graphs: dict[tuple, _Graph] = {}
        self._pool = None  # one memory pool for every graph: they never run at the same time
        self.replays = 0  # passes a graph ran (a capture's first replay counted)
        self.eager_passes = 0  # padded passes run eagerly (no CUDA, or after a failed capture)

    @property
    def mode(self) -> str:
        """What runs the passes: "cuda-graphs" or "eager" (no CUDA, turned off, or a capture failed), with
        "+inductor" ("+inductor-static") while the compiled pass runs."""
        runs = "cuda-graphs" if self.use_graphs and self.failure is None else "eager"
        if self._compiled is None:
            return runs
        return runs + ("+inductor" if self.inductor == "dynamic" else "+inductor-static")

    @staticmethod
    def fits(rows: int, nodes: int) -> bool:
        """Whether a pass of `rows` rows and at most `nodes` nodes a row has a bucket."""
        return rows <= MAX_ROWS and nodes <= MAX_NODES

    @staticmethod
    def shape(rows: int, nodes: int) -> tuple[int, int]:
        """The bucket (rows, nodes) a pass is padded to."""
        return bucket(rows), bucket(nodes)

    def run(
        self,
        inputs: dict[str, torch.Tensor],
        cache: Cache,
        layout: BatchLayout,
        capture: Sequence[int],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits [B', T', V], features or None) of one padded pass; the outputs are the graph's own
        tensors, overwritten by its next replay. inputs: tokens [B', T'], positions [B', T'], ancestry
        [B', T', T'] (`padded_ancestry`) and starts [B'] (where each row's entries go); the pass attends over
        the cache's whole capacity."""
        layer = cache.layers[0]
        key = (*inputs["tokens"].shape, layer.capacity, tuple(capture), layer._keys.data_ptr())
        graph = self._graphs.get(key)
        if graph is None:
            if self._graphs and next(iter(self._graphs))[-1] != key[-1]:
                self._drop()  # the cache grew: its old buffers are gone
            graph = self._capture(inputs, cache, layout, tuple(capture))
            if graph.graph is not None:
                self._graphs[key] = graph
                self.replays += 1
            else:
                self.eager_passes += 1
            return graph.logits, graph.features
        for name, tensor in inputs.items():
            graph.inputs[name].copy_(tensor, non_blocking=True)
        graph.graph.replay()
        self.replays += 1
        return graph.logits, graph.features

    def _drop(self) -> None:
        """Forget every graph, and their memory pool with them: a pool whose graphs are all gone cannot
        take another capture (PyTorch's allocator asserts; seen on an H200 after the cache grew)."""
        self._graphs.clear()
        self._pool = None

    def _forward(self, inputs: dict[str, torch.Tensor], cache: Cache, layout: BatchLayout,
                 capture: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The padded pass itself, on `inputs`' own tensors (what a graph records)."""
        layout.starts = inputs["starts"]
        layout.window = inputs["window"]
        try:
            mask = capacity_mask(inputs["ancestry"], inputs["starts"], inputs["window"], self.single.dtype)
            model_inputs = dict(input_ids=inputs["tokens"], position_ids=inputs["positions"],
                                attention_mask=mask, past_key_values=cache, use_cache=True)
            with self.single.attention_as(self.attention):
                return self._pass(model_inputs, inputs, capture)
        finally:
            layout.window = None

    def _pass(self, model_inputs: dict, inputs: dict[str, torch.Tensor], capture: tuple[int, ...]
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`TargetModel.forward_pass`, compiled where asked: its rows, nodes and keys marked dynamic, so one
        graph of kernels serves every bucket (a bucket of one row or one node gets its own: dynamo
        specializes sizes of 1), or each bucket its own ("static"). A compilation that fails is reported
        once; the pass then runs eagerly."""
        if self._compiled is not None and self.inductor == "dynamic":
            for tensor, dims in ((inputs["tokens"], (0, 1)), (inputs["positions"], (0, 1)),
                                 (model_inputs["attention_mask"], (0, 2, 3)), (inputs["starts"], (0,)),
                                 (inputs["window"], (0,))):
                for dim in dims:
                    torch._dynamo.maybe_mark_dynamic(tensor, dim)
        if self._compiled is not None:
            try:
                with graph_limit():
                    return self._compiled(model_inputs, False, capture)
            except Exception as error:  # noqa: BLE001 - any compiler failure: the uncompiled pass stays
                self._compiled, self.compile_failure = None, one_line(error)
                warnings.warn(f"compiling the padded verification pass failed, running it uncompiled: "
                              f"{self.compile_failure}", RuntimeWarning, stacklevel=4)
        return self.single.forward_pass(model_inputs, False, capture)

    def _capture(self, inputs: dict[str, torch.Tensor], cache: Cache, layout: BatchLayout,
                 capture: tuple[int, ...]) -> _Graph:
        """Run the pass; on CUDA, also record it as the graph of its bucket (None where it runs eagerly)."""
        device = self.single.device
        # the graph's own copies: an input already on the device (a draft's token picked there, `verify_token`)
        # would otherwise be the graph's buffer, and each replay's copy would overwrite the caller's tensor
        static = {name: tensor.to(device, copy=True) for name, tensor in inputs.items()}
        static["window"] = torch.arange(cache.layers[0].capacity, device=device)
        if self.mode != "cuda-graphs":
            logits, features = self._forward(static, cache, layout, capture)
            return _Graph(static, logits, features, None)
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP):  # the real pass, run again: each run writes the same entries
                    self._forward(static, cache, layout, capture)
            torch.cuda.current_stream().wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                logits, features = self._forward(static, cache, layout, capture)
            graph.replay()
            return _Graph(static, logits, features, graph)
        except Exception as error:  # noqa: BLE001 - any capture failure: the eager padded pass stays
            self.failure = one_line(error)
            warnings.warn(f"capturing the verification pass as a CUDA graph failed, running it eagerly: "
                          f"{self.failure}", RuntimeWarning, stacklevel=3)
            self._drop()
            logits, features = self._forward(static, cache, layout, capture)
            return _Graph(static, logits, features, None)


class GraphedTarget(TargetModel):
    """A `TargetModel` whose batch rows (`registry.rows_of`) verify on `GraphedPass`; prefill and passes
    without a bucket stay eager."""

    def __init__(self, model: torch.nn.Module, use_graphs: bool | None = None, inductor: str | None = None,
                 attention: str | None = None) -> None:
        super().__init__(model)
        self.graphed = GraphedPass(self, use_graphs, inductor, attention)
