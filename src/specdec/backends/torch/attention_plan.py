"""Which attention implementation a pass of a given shape runs: the plan the target reads per pass.

Why a module of its own: the target model reads the plan on every pass, and the
code that measures a plan (`attention`) runs a target; keeping the plan apart
lets the target import it without importing the measuring (no import cycle).

Invariants: a plan covers every shape (the nearest measured bucket above, else
the largest); passes larger than the largest measured tree (prefills) use
`prefill`, as do prompt passes: `DEFAULT` (SDPA, which never materializes a
[T, T] score matrix) unless the plan is `invariant()`, where verification
passes of any size run `specdec.backends.torch.invariant`'s attention and prompt passes its
prefill attention (in chunks of `MATERIALIZED_CHUNK` tokens, to bound their
score matrices).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from specdec.backends.torch.invariant import (
    IMPLEMENTATION as INVARIANT,  # registered with transformers on import
)
from specdec.backends.torch.invariant import PREFILL_IMPLEMENTATION as INVARIANT_PREFILL

IMPLEMENTATIONS = ("sdpa", "eager")  # what a measured plan chooses between
DEFAULT = "sdpa"
MATERIALIZED_CHUNK = 1024  # prefill tokens per pass where attention materializes its scores


@dataclass(frozen=True)
class AttentionPlan:
    """choices[i][j]: the implementation for contexts[i] cached tokens and sizes[j] new tokens."""

    contexts: tuple[int, ...]
    sizes: tuple[int, ...]
    choices: tuple[tuple[str, ...], ...]
    prefill: str = DEFAULT  # prompt passes, and passes over more tokens than the largest size

    def __post_init__(self) -> None:
        if len(self.choices) != len(self.contexts) or any(len(row) != len(self.sizes) for row in self.choices):
            raise ValueError("an attention plan needs one choice per (context, size)")
        known = (*IMPLEMENTATIONS, INVARIANT, INVARIANT_PREFILL)
        if any(choice not in known for row in self.choices for choice in (*row, self.prefill)):
            raise ValueError(f"attention implementations must be among {known}")

    @classmethod
    def invariant(cls) -> AttentionPlan:
        """Every pass on `specdec.backends.torch.invariant`'s attention: a node's bits do not depend on the pass."""
        return cls((1,), (1,), ((INVARIANT,),), prefill=INVARIANT_PREFILL)

    @property
    def is_invariant(self) -> bool:
        return self.prefill == INVARIANT_PREFILL

    def choose(self, context: int, num_new: int, prefill: bool = False) -> str:
        """The implementation for a pass of `num_new` tokens after `context` cached ones (a prompt's
        pass when `prefill`)."""
        if prefill or (num_new > self.sizes[-1] and not self.is_invariant):
            return self.prefill
        i = min(bisect_left(self.contexts, context), len(self.contexts) - 1)
        j = min(bisect_left(self.sizes, num_new), len(self.sizes) - 1)
        return self.choices[i][j]
