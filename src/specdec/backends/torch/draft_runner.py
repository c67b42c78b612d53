"""A draft model's own sequence whose passes replay as CUDA graphs (`GraphedSequence`).

Why: a draft model drafts a chain one token at a time, so each drafted token is a
pass of its own. On a GPU an eager pass is launch-bound: a small model's costs
about what a large one's does (docs/results/2026-11-gpu-h200), so an eager draft
of a few tokens cost more than the target's graphed verification it was meant to
save. Here the draft's appends run on the target's machinery for graphs: a one-row
batch (`rows.BatchedTarget`) whose passes are padded to a bucket and replayed
(`graphs.GraphedPass`).

What it offers is `TargetModel`'s runner interface as a draft proposer uses it
(`reset`, `append`, `trim`, `num_cached`, `model`, `device`, `runs_fused`), so the
proposer does not know which one it drives (`registry.draft_runner` chooses by
device).

Invariants:
- the row holds exactly the appended tokens, in order; `trim` keeps a prefix, and
  the entries past it stay where no pass reads them (every pass masks its row's
  slots past its committed length, and writes its own there);
- the first append of a sequence is its prompt: it is prefilled eagerly, and only
  its last position's logits come back (a draft reads no other; a prompt's every
  row over a large vocabulary would be most of the GPU's memory traffic). Later
  appends return every fed position's logits; one longer than a bucket
  (`graphs.MAX_NODES`) runs eagerly;
- the module must return every position's logits (not a last-row view), since a
  graphed pass serves chains of any bucket;
- `greedy_chain` drafts on the device: each pass's token is the argmax of the one
  before, copied into the graph's input there, so a chain waits once, not a token;
- `reset` keeps the buffers and the graphs captured on them, so a proposer reused
  across requests (the server's pool) captures each bucket once; proposers built one
  a request (the API's) lease their sequence from the draft model's `SequencePool`,
  so they replay the graphs an earlier request captured.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

import torch

from specdec.backends.torch.graphs import GraphedPass, GraphedTarget
from specdec.backends.torch.rows import BatchedTarget
from specdec.tree import DraftTree


class GraphedSequence:
    """One sequence of `model` with a draft's runner interface, its appends verified as graphed chains."""

    runs_fused = False  # transformers' modules run the pass (a fused pass's prompt chunks do not apply)

    def __init__(self, model: torch.nn.Module, use_graphs: bool | None = None) -> None:
        """use_graphs: None: CUDA graphs where the model is on CUDA; False: the same padded passes eagerly
        (what the CPU tests run)."""
        target = GraphedTarget(model, use_graphs=use_graphs)
        self.rows = BatchedTarget(target, graphed=target.graphed, prompt_bytes=0)
        self.model = model
        self.device = target.device

    @property
    def graphed(self) -> GraphedPass:
        """The pass its appends run on: its `mode`, replays and eager passes."""
        return self.rows.graphed

    @property
    def num_cached(self) -> int:
        return self.rows.lengths[0] if self.rows.lengths else 0

    def reset(self) -> None:
        """Forget the sequence; the buffers (and the graphs captured on them) stay for the next one."""
        self.rows.release()

    @torch.inference_mode()
    def append(self, token_ids: Sequence[int] | torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Feed tokens after the sequence and keep them all; their logits [T, V] (the last position's,
        [1, V], with last_only, or for a sequence's first append: its prompt)."""
        ids = token_ids.tolist() if isinstance(token_ids, torch.Tensor) else list(token_ids)
        if not ids:
            raise ValueError("cannot append an empty token sequence")
        if not self.rows.lengths:
            return self.rows.add(ids)[1][None]
        tree = DraftTree.chain(ids[0], ids[1:])
        logits = self.rows.verify_trees([tree])[0][0]
        self.rows.commit([list(range(len(ids)))])
        return logits[-1:] if last_only else logits

    @torch.inference_mode()
    def greedy_chain(self, logits: torch.Tensor, count: int, vocab: int) -> torch.Tensor:
        """Draft `count` tokens greedily on the device, each the argmax of the logits before it over the first
        `vocab` ids (`logits` [V]: after the sequence's last token), feeding and keeping all but the last. No
        value is read, so the passes queue behind each other. Returns the tokens [count] on the device."""
        tokens = []
        for i in range(count):
            tokens.append(logits[:vocab].argmax(-1, keepdim=True))
            if i + 1 < count:
                logits = self.rows.verify_token(tokens[-1])
                self.rows.commit([[0]])
        return torch.cat(tokens)

    def trim(self, length: int) -> None:
        """Keep the sequence's first `length` tokens (none: the next append is a prompt again)."""
        if length == 0:
            self.rows.release()
        elif length != self.num_cached:
            self.rows.truncate(0, length)


class SequencePool:
    """Graphed sequences of one draft module, each lent to one proposer at a time.

    Why: a sequence's graphs are captured on its own buffers, one a bucket, and the API builds a proposer a
    call: with a sequence of its own, each call captured its graphs again. A proposer leases a sequence when
    it is built; the sequence comes back, reset, when the proposer is collected (`weakref.finalize`), and the
    next proposer replays its graphs. Proposers alive together hold sequences of their own.
    """

    def __init__(self, model: torch.nn.Module, use_graphs: bool | None = None) -> None:
        self.model, self.use_graphs = model, use_graphs
        self._free: list[GraphedSequence] = []
        self._lock = threading.Lock()
        self.made = 0  # sequences made, over the pool's life: its peak of proposers alive together

    def lease(self, owner: object) -> GraphedSequence:
        """A sequence for `owner` alone, given back to the pool when `owner` is collected."""
        with self._lock:
            sequence = self._free.pop() if self._free else None
            self.made += sequence is None
        if sequence is None:
            sequence = GraphedSequence(self.model, self.use_graphs)
        weakref.finalize(owner, self._give_back, sequence)
        return sequence

    def _give_back(self, sequence: GraphedSequence) -> None:
        sequence.reset()
        with self._lock:
            self._free.append(sequence)
