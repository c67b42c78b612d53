"""Random numbers by output position: the t-th sampled token of a request is drawn with the t-th uniform.

Why: the acceptance rule for drafts without probabilities (retrieval, lookup,
Token Recycling: `accept.accept_deterministic`) draws the target's own token
at each node and follows the tree while it agrees. When each step took one
uniform per *tree node*, which uniform drew a given output token depended on the
trees, so a seed reproduced an output only with the same drafts. Drafts that
depend on state shared across requests (the recycle table, the session store)
or on what shares a batch then broke seeded reproducibility. Indexing the
uniforms by *output position* instead makes the token at position t the inverse
CDF of the target's distribution there at u_t, exactly what plain sampling with
the same seed emits, whatever was drafted: the tree only decides how many
positions one pass settles.

Invariants: u_0, u_1, ... are independent float64 uniforms in [0, 1) from the
request's generator, each used for one draw only (`advance` moves past every
emitted token, whichever rule emitted it); values are drawn CHUNK at a time, so
a step costs no generator call most of the time. A rule that also needs other
random numbers (rejection tests for drafts with probabilities) draws them from
the same generator, between chunks: all values stay distinct draws.
"""

from __future__ import annotations

import torch

CHUNK = 64  # uniforms drawn per generator call (a 128-token request: two calls)


class PositionUniforms:
    """The uniform for each output position of one request, drawn lazily from its generator."""

    def __init__(self, generator: torch.Generator | None, device: torch.device | str = "cpu") -> None:
        self.generator = generator
        self.device = device
        self.position = 0  # output tokens emitted so far
        self._values: list[float] = []

    def at(self, offset: int) -> float:
        """The uniform for output position `position + offset` (offset >= 0)."""
        index = self.position + offset
        while index >= len(self._values):
            chunk = torch.rand(CHUNK, generator=self.generator, device=self.device, dtype=torch.float64)
            self._values.extend(chunk.tolist())
        return self._values[index]

    def advance(self, count: int) -> None:
        """`count` more tokens were emitted: their uniforms are spent."""
        if count < 0:
            raise ValueError(f"cannot advance by {count} positions")
        self.position += count
