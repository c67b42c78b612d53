"""The acceptance rules' random numbers: the t-th sampled token of a request is drawn with the t-th uniform.

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

`Chance` is the one door the acceptance rules' randomness goes through: a test
passed with probability a / b, or a token drawn from a row, each with the uniform
of its own key (a node, or an output position). So a rule is a plain function
of its uniforms, and the tests can replace `Chance` by one that enumerates every
choice with its exact probability (tests/exact.py) instead of sampling.
"""

from __future__ import annotations

from collections.abc import Callable

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


def draw(probs: torch.Tensor, uniform: float) -> int:
    """The token whose CDF interval holds uniform * total: inverse-CDF sampling from probs [V].

    probs need not be normalised. The CDF is float64, so tiny probabilities are
    neither lost nor inflated (faster than torch.multinomial over a vocabulary on CPU).
    """
    cdf = probs.cumsum(-1, dtype=torch.float64)  # [V]
    index = int(torch.searchsorted(cdf, cdf[-1:] * uniform, right=True))
    if index >= cdf.shape[0]:  # uniform * total rounded up to total (probability ~2**-53)
        index = int(probs.nonzero()[-1])
    return index


def draw_rows(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """`draw` on every row at once: probs [N, V], uniforms [N] float64 -> [N] int64, on their device.

    Row by row the same arithmetic as `draw` (float64 CDF, searchsorted, the same overflow
    rule), so a row drawn here and on its own with the same uniform gives the same token.
    """
    cdf = probs.cumsum(-1, dtype=torch.float64)  # [N, V]
    index = torch.searchsorted(cdf, cdf[:, -1:] * uniforms[:, None], right=True)[:, 0]  # [N]
    vocab_size = probs.shape[-1]
    last_with_mass = vocab_size - 1 - (probs.flip(-1) > 0).int().argmax(-1)  # [N]
    return torch.where(index < vocab_size, index, last_with_mass)


class Chance:
    """A step's random choices, each made with the uniform of its key (used once per step).

    uniform: key -> float64 uniform in [0, 1). by_position: the deterministic rule keys its
    draws by output offset (the request's `PositionUniforms`), not by tree node.
    """

    def __init__(self, uniform: Callable[[int], float], by_position: bool = False) -> None:
        self.uniform, self.by_position = uniform, by_position

    @classmethod
    def per_node(cls, num_nodes: int, generator: torch.Generator | None, device: torch.device) -> Chance:
        """One uniform per tree node, drawn up front: one generator call and one host transfer a step."""
        values = torch.rand(num_nodes, generator=generator, device=device, dtype=torch.float64).tolist()
        return cls(values.__getitem__)

    @classmethod
    def by_output_position(cls, positions: PositionUniforms) -> Chance:
        """Key d is the step's d-th emitted token: its output position's uniform."""
        return cls(positions.at, by_position=True)

    def below(self, key: int, a: float, b: float) -> bool:
        """True with probability min(1, a / b) (a >= 0, b >= 0): the key's uniform u has u * b < a."""
        return self.uniform(key) * b < a

    def draw(self, key: int, probs: torch.Tensor) -> int:
        """A token from probs [V] (unnormalised), by inverse CDF at the key's uniform."""
        return draw(probs, self.uniform(key))
