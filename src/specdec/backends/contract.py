"""What every verification backend gives the engine: `Target` (one model, verifying) and `Rows` (its batch rows).

Why: the engine (`specdec.engine.batch.Batch`) and the cost curves that size the drafts
(`specdec.engine.costs`) drive every backend through these calls and nothing else, so a new engine is
a module that implements them plus one entry in `specdec.backends.registry`.

Invariants every implementation keeps (tested for each registered backend in tests/test_backends.py):
- rows are slots 0..B-1 in admission order, kept contiguous: `remove` moves the last row into the
  freed slot and returns the slot it came from (None when the last row itself went);
- between passes a row's cache holds exactly its committed tokens; `verify_trees` scores every node
  of every row's tree in one pass, then exactly one of `commit` (keep each row's accepted path),
  `rollback` (the pass is dropped; nothing changes) follows before the next pass;
- a row's logits depend only on its own tokens (up to the backend's float summation order; with
  `invariant` true, bit for bit), never on the rows beside it;
- `release` frees what the rows hold; the object is then empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from specdec.tree import DraftTree


class PromptFill:
    """A prompt being prefilled a chunk at a time (`Rows.fill`): its ids and how many ran."""

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        self.ids = torch.as_tensor(list(prompt_ids), dtype=torch.int64)  # [L]
        self.done = 0
        self.features: list[torch.Tensor] = []  # each chunk's captured features [n, F], while filling

    @property
    def remaining(self) -> int:
        return self.ids.numel() - self.done


# (slot, the last position's logits [V], its captured features [n, F] or None)
Joined = tuple[int, torch.Tensor, torch.Tensor | None]


@runtime_checkable
class Target(Protocol):
    """One model as a backend verifies it (`registry.verifier`): what an engine needs to know of it."""

    @property
    def config(self) -> object: ...  # the transformers config (vocab_size, num_hidden_layers, ...)

    @property
    def max_length(self) -> int | None: ...  # the longest sequence a row may hold; None: no limit

    @property
    def device(self) -> torch.device: ...


@runtime_checkable
class Rows(Protocol):
    """B sequences verified together on one `Target` (`registry.rows_of`): what `engine.Batch` drives."""

    device: torch.device
    invariant: bool  # a row's logits are bit-identical whatever shares its pass

    @property
    def num_rows(self) -> int: ...

    # hidden-state indices every pass returns as features (what draft heads read); a backend without
    # hidden states refuses any but ()
    capture: tuple[int, ...]

    def add(self, prompt_ids: Sequence[int]) -> Joined:
        """Prefill a new row in one piece."""

    def fill(self, prompt: PromptFill, max_tokens: int) -> Joined | None:
        """Prefill up to `max_tokens` more of `prompt`; on its last chunk it becomes a row (else None)."""

    def remove(self, row: int) -> int | None:
        """Drop row `row`; the last row takes its slot: returns that row's old slot (None if none moved)."""

    def verify_trees(self, trees: Sequence[DraftTree]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """One pass over every row's tree: per row (logits [N, V], features [N, F] or None)."""

    def commit(self, paths: Sequence[Sequence[int]]) -> None:
        """Keep each row's accepted path (node indices from its root) of the last `verify_trees`."""

    def rollback(self) -> None:
        """Drop the last `verify_trees`: the rows are as before it."""

    def release(self) -> None:
        """Free every row."""
