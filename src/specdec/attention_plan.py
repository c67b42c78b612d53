"""Which attention implementation a pass of a given shape runs: the plan the target reads per pass.

Why a module of its own: the target model reads the plan on every pass, and the
code that measures a plan (`attention`) runs a target; keeping the plan apart
lets the target import it without importing the measuring (no import cycle).

Invariants: a plan covers every shape (the nearest measured bucket above, else
the largest); passes larger than the largest measured tree (prefills) use
`DEFAULT` (SDPA), which never materializes a [T, T] score matrix.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

IMPLEMENTATIONS = ("sdpa", "eager")
DEFAULT = "sdpa"


@dataclass(frozen=True)
class AttentionPlan:
    """choices[i][j]: the implementation for contexts[i] cached tokens and sizes[j] new tokens."""

    contexts: tuple[int, ...]
    sizes: tuple[int, ...]
    choices: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        if len(self.choices) != len(self.contexts) or any(len(row) != len(self.sizes) for row in self.choices):
            raise ValueError("an attention plan needs one choice per (context, size)")
        if any(choice not in IMPLEMENTATIONS for row in self.choices for choice in row):
            raise ValueError(f"attention implementations must be among {IMPLEMENTATIONS}")

    def choose(self, context: int, num_new: int) -> str:
        if num_new > self.sizes[-1]:
            return DEFAULT
        i = min(bisect_left(self.contexts, context), len(self.contexts) - 1)
        j = min(bisect_left(self.sizes, num_new), len(self.sizes) - 1)
        return self.choices[i][j]
