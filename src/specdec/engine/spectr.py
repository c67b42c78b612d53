"""SpecTr's k-sequential selection (Sun et al., NeurIPS 2023, arXiv 2310.15141): several i.i.d. drafts, one token.

Why: when k drafts x_1..x_k are drawn i.i.d. from one draft distribution q for the same
position, SpecInfer's recursive rule tries them in turn against a residual that shrinks
after every rejection. SpecTr treats the k drafts as one draw from q^k and solves (up to
a 1 - 1/e factor) the optimal transport to the target distribution p; its
k-sequential selection is that plan in closed form:

- pick rho in [1, k]; for i = 1..k accept x_i with probability min(1, p(x_i) / (rho q(x_i)));
- one draft is accepted with beta(rho) = sum_y min(q(y), p(y) / rho), so token y leaves
  through an acceptance with probability min(q(y), p(y) / rho) (1 - (1 - beta)^k) / beta;
- when all k are rejected (probability (1 - beta)^k) the token is drawn from the residual
  p_res(y) = [p(y) - min(q(y), p(y) / rho) (1 - (1 - beta)^k) / beta] / (1 - beta)^k.

The output is distributed as p exactly when p_res >= 0, which holds iff
1 - (1 - beta(rho))^k <= rho beta(rho). The left side shrinks and the right grows as rho
grows (f below is nondecreasing), and the acceptance 1 - (1 - beta)^k is largest for the
smallest rho, so rho* is the smallest feasible rho, found on a refined grid and taken
from the feasible side. k = 1 gives rho* = 1: plain speculative sampling.

Invariants: p and q are [V] float32 rows (q the drafts' common row, p the target row or
the residual an earlier sibling left); the sums that decide rho are float64 on q's
support; `excess` is the residual before it is normalised (`specdec.engine.accept` normalises
it, with its fallback for a residual of ~0 mass).

What it needs of the drafts: the k drafts must be i.i.d. draws from q (with replacement,
not deduplicated) and k must not depend on their values. `specdec.engine.accept` applies this
only to a run of siblings that share one draft row, and that module's tree invariant
(drafted siblings drawn independently, with replacement, from their own rows) is what
makes such a run i.i.d.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.tree import DraftTree

_ROUNDS, _POINTS = 5, 16  # rho in [1, k] to (k - 1) / 16**5, one [17, V] evaluation per round
# f(rho) >= -_ROUNDING counts as feasible: float32 rows sum to 1 only within ~1e-7, so for q == p
# f(1) = beta - 1 + (1 - beta)^k is a rounding error below 0; the residual's clamp then moves the
# output by less than that in total variation (as `specdec.engine.accept.RESIDUAL_EPS` for residuals)
_ROUNDING = 1e-6


def _beta(target: torch.Tensor, draft: torch.Tensor, rho: float) -> float:
    """sum_y min(q(y), p(y) / rho) over q's support (float64 sum)."""
    return float(torch.minimum(draft, target / rho).sum(dtype=torch.float64))


def _feasible(target: torch.Tensor, draft: torch.Tensor, rhos: torch.Tensor, k: int) -> torch.Tensor:
    """[R] bool: f(rho) = rho beta - 1 + (1 - beta)^k >= 0 (the residual is non-negative) per rho [R]."""
    beta = torch.minimum(draft[None], target[None] / rhos[:, None]).sum(-1, dtype=torch.float64)  # [R]
    return rhos * beta - 1.0 + (1.0 - beta) ** k >= -_ROUNDING


def optimal_rho(target_probs: torch.Tensor, draft_probs: torch.Tensor, k: int) -> float:
    """rho* for k i.i.d. drafts from draft_probs [V] against target_probs [V]: the smallest feasible rho.

    f is nondecreasing, so each round finds the first feasible point of a grid over the bracket
    and narrows the bracket to the step before it; f(k) >= 0 always (Bernoulli's inequality).
    """
    if k <= 1:
        return 1.0
    support = draft_probs > 0
    target, draft = target_probs[support].double(), draft_probs[support].double()
    low, high = 1.0, float(k)
    for _ in range(_ROUNDS):
        grid = torch.linspace(low, high, _POINTS + 1, dtype=torch.float64)  # [17], both ends included
        first = int(torch.nonzero(_feasible(target, draft, grid, k))[0])  # the last point is feasible
        if first == 0:
            return low
        low, high = float(grid[first - 1]), float(grid[first])
    return high


@dataclass(frozen=True)
class KSequential:
    """k-sequential selection of k i.i.d. drafts from `draft_probs` [V] against `target_probs` [V]."""

    target_probs: torch.Tensor
    draft_probs: torch.Tensor
    k: int
    rho: float

    @classmethod
    def solve(cls, target_probs: torch.Tensor, draft_probs: torch.Tensor, k: int) -> KSequential:
        return cls(target_probs, draft_probs, k, optimal_rho(target_probs, draft_probs, k))

    def odds(self, token: int, draft_at: float) -> tuple[float, float]:
        """(p(x), rho q(x)) for draft `token` (draft_at = q(x)): accepted with probability min(1, their ratio)."""
        return float(self.target_probs[token]), self.rho * draft_at

    def acceptance(self) -> float:
        """Probability that one of the k drafts is accepted: 1 - (1 - beta(rho))^k."""
        beta = _beta(self.target_probs, self.draft_probs, self.rho)
        return 1.0 - (1.0 - beta) ** self.k

    def excess(self) -> torch.Tensor:
        """[V] float32, unnormalised: p minus what the k acceptances take; normalised, the residual."""
        target, draft = self.target_probs, self.draft_probs
        beta = _beta(target, draft, self.rho)
        if beta <= 0.0:  # disjoint supports: nothing can be accepted, the target row is the residual
            return target.clone()
        taken = torch.minimum(draft, target / self.rho) * ((1.0 - (1.0 - beta) ** self.k) / beta)
        return (target - taken).clamp_(min=0)  # >= 0 up to rounding: rho is feasible


def sibling_groups(tree: DraftTree, siblings: list[int], rule: str) -> list[list[int]]:
    """SpecInfer: one group per sibling. SpecTr: runs of consecutive siblings with one draft row.

    A run sharing a row is k i.i.d. draws from it (the module's tree invariant), which is what
    k-sequential selection needs; a sibling with a row of its own (a retrieval guess's point
    mass, another source's draft) is a group of one, verified as SpecInfer would.
    """
    if rule == "specinfer" or len(siblings) < 2:
        return [[c] for c in siblings]
    groups = [[siblings[0]]]
    for child in siblings[1:]:
        if torch.equal(tree.draft_probs[child], tree.draft_probs[groups[-1][0]]):
            groups[-1].append(child)
        else:
            groups.append([child])
    return groups


def expanded_twin(tree: DraftTree, siblings: list[int], child: int) -> int:
    """The sibling with `child`'s token that has children, else `child`: duplicates share a context.

    SpecTr may accept a later duplicate of a rejected draft; a proposer expands only one of a
    token's duplicates (`specdec.proposers.eagle.sampled`). Its subtree was drawn given the
    token alone, not given which twin the rule picked, so descending into it keeps every later
    draw valid.
    """
    token = tree.token_list[child]
    for sibling in siblings:
        if tree.token_list[sibling] == token and tree.children[sibling]:
            return sibling
    return child
