"""The verification pass compiled by inductor (`backend="compiled"`): fewer, fused operators per step.

Why: an eager decode step of SmolLM2-135M is ~450 small operators, and their
per-call overhead, not arithmetic or memory traffic, sets its cost. Inductor
fuses the norms, rotary, residuals, the attention's softmax and the MLP's
activation into a few generated C++ loops and runs them from a C++ wrapper.

Why it is built this way (what made an earlier whole-model compile gain nothing,
measured with `torch._dynamo.explain` and the profiler: one graph, no breaks):
- transformers' `StaticCache` attends over its whole capacity, and PyTorch's
  fused CPU attention (`_scaled_dot_product_flash_attention_for_cpu`) over all
  those slots took half the compiled step.
  Here the model runs under transformers' "eager" attention (plain products and
  a softmax, which inductor fuses) over the batched cache's buffer;
- the weights must be read prepacked (`specdec.backends.torch.packed`); inductor packs only
  weights frozen into the graph, and a frozen graph is never cached on disk
  (a minute of compiling in every process). The packed products are one opaque
  op instead (`torch.ops.specdec.packed_product`, defined in `specdec.backends.torch.packed`),
  so the graph caches and a process that finds it compiles in seconds;
- dynamo's guards check every module attribute on every call (a measurable part
  of a small model's step, a third of it with `skip_guard_on_all_nn_modules_unsafe`). They stay: without
  them a graph compiled for one model would run for another model of the same
  cache shapes (another loaded model, a test's tiny one) with the wrong sizes.

Shapes: a compiled pass takes its node count from the input tensors and its key
count from the layout's window (`BatchLayout.window`), both marked symbolic from
the first compile, so no Python number of a pass (the rows' lengths) reaches the
graph and one graph serves every tree and context. It recompiles when the cache's
buffer first grows (it doubles; its size then becomes symbolic too) and for
another batch size or another set of captured layers.

Invariants:
- the same inputs give the eager pass's logits up to float summation order
  (fused loops sum in another order); every method and plain decoding on this
  backend run the same compiled pass, so greedy text stays token-identical to
  plain decoding on it (tests/test_compiled.py);
- a compilation that fails (no C++ compiler, an inductor error, more than
  RECOMPILE_LIMIT graphs) is reported once as a warning and the pass runs eagerly
  from then on, with the same inputs.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence

import torch

from specdec.backends.torch.target import TargetModel
from specdec.models.base import one_line

ATTENTION = "eager"  # transformers' attention that inductor fuses (see the module docstring)
# Graphs dynamo keeps for `TargetModel.forward_pass`, shared by every compiled target of the process
# (a graph per batch size, set of captured layers, grown cache, model). Its default of 8 is reached by a
# server batching 8 rows; past it dynamo would run new shapes eagerly without a word, so reaching
# this limit fails loudly instead (the pass falls back to eager, with a warning).
RECOMPILE_LIMIT = 64


@contextlib.contextmanager
def graph_limit() -> Iterator[None]:
    """RECOMPILE_LIMIT, failing when reached, for the call inside only. Set and restored by hand:
    `torch._dynamo.config.patch` costs several times more a step."""
    config = torch._dynamo.config
    before = config.recompile_limit, config.fail_on_recompile_limit_hit
    config.recompile_limit, config.fail_on_recompile_limit_hit = RECOMPILE_LIMIT, True
    try:
        yield
    finally:
        config.recompile_limit, config.fail_on_recompile_limit_hit = before


def _options() -> dict:
    # The kernels called from C++, not from a Python wrapper: a Python call less per kernel.
    return {"cpp_wrapper": True}


class CompiledPass:
    """`TargetModel.forward_pass` compiled, with the eager pass as fallback."""

    def __init__(self, single: TargetModel) -> None:
        self.single = single
        self._compiled = torch.compile(single.forward_pass, options=_options())
        self.failure: str | None = None  # why compiling failed, once it has

    @staticmethod
    def mark(inputs: dict, window: torch.Tensor) -> None:
        """Make the pass's node count and key count symbolic from its first compile: every pass runs
        the same graph, whatever its tree and context.

        Why: a graph specialized to one count fuses and vectorizes its loops for that count, so its
        rows can round differently from another count's (measured: a 1-node graph and the general
        one gave different greedy text in bf16). Passes have at least 2 nodes (a one-token step gets
        a padding node, as the invariant path does), since a dimension of size 1 is always specialized.
        """
        # maybe_: the graph ties these sizes together (the mask's columns are the window's keys), which
        # a strict mark would report as a violated constraint.
        for tensor, dim in ((inputs["input_ids"], 1), (inputs["position_ids"], 1), (inputs["attention_mask"], 2),
                            (inputs["attention_mask"], 3), (window, 0)):
            torch._dynamo.maybe_mark_dynamic(tensor, dim)

    def __call__(
        self, inputs: dict, capture: Sequence[int], window: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits [B, T, V], features or None) of one pass; `inputs` as `forward_pass` takes them, with
        `position_ids` and a 4-D `attention_mask` over the keys `window` (`BatchLayout.window`) names,
        2 or more nodes."""
        self.mark(inputs, window)
        with self.single.attention_as(ATTENTION):
            if self.failure is None:
                try:
                    with graph_limit():
                        return self._compiled(inputs, False, tuple(capture))
                except Exception as error:  # noqa: BLE001 - any compiler failure: the eager pass stays
                    self.failure = one_line(error)
                    warnings.warn(f"compiling the verification pass failed, running it eagerly: {self.failure}",
                                  RuntimeWarning, stacklevel=2)
            return self.single.forward_pass(inputs, False, capture)


class CompiledTarget(TargetModel):
    """A `TargetModel` whose batch rows (`verifier.rows_of`) verify on its compiled pass; prefill stays
    eager (long, few, and of every length: compiling each would cost more than it saves)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.compiled = CompiledPass(self)
