"""Sampling parameters and logits -> probabilities: what a user sets, and the distribution it makes.

`SamplingParams` (temperature, top-k, top-p, seed) is what a request asks for;
`make_generator` seeds its random numbers; `logits_to_probs` turns target (or
draft) logits into the distribution plain sampling draws from, which is what
every acceptance rule must reproduce and what drafters that draw use too. The
lossless acceptance rules themselves live beside verification, in
`specdec.engine.accept`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy (argmax); top_k / top_p are then moot
    top_k: int = 0  # keep the k most likely tokens (ties at the k-th logit kept); 0 = off
    top_p: float = 1.0  # keep the smallest most-likely set with mass >= top_p; 1.0 = off
    seed: int | None = None  # None: seeded from torch's default RNG

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 turns it off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 turns it off), got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def make_generator(params: SamplingParams, device: torch.device | str) -> torch.Generator:
    """A generator on `device` seeded from `params.seed`, or from torch's default RNG when it is None.

    Drawing the seed from the default RNG keeps `torch.manual_seed(...)` reproducible
    for callers who set no seed of their own.
    """
    generator = torch.Generator(device=device)
    seed = params.seed
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,), dtype=torch.int64).item())
    generator.manual_seed(seed)
    return generator


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Target (or draft) logits -> float32 probabilities after temperature, top-k, top-p.

    logits: [..., V]. Returns [..., V] float32, rows summing to 1. Greedy params give
    the one-hot of the argmax. Order as in Hugging Face: temperature, then top-k (ties
    with the k-th logit kept), then top-p on what is left. The most likely token
    always survives both filters.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    scaled = logits / params.temperature  # [..., V]
    if 0 < params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = scaled.softmax(-1)  # [..., V]
    if params.top_p < 1.0:
        probs = _nucleus(probs, params.top_p)
    return probs


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest most-likely set of each row with mass >= top_p; renormalise.

    probs: [..., V]. A token is dropped when the more likely tokens before it already
    reach top_p (the first never is). Only each row's head is sorted: topk of a
    width that grows x4 until every row's nucleus fits (a full sort costs ~4 ms per
    49152-wide row on one core; a language model's nucleus is usually far narrower).
    Tokens tied with the least likely kept one are all kept (Hugging Face's sort
    splits such ties arbitrarily), so the result never depends on sort order.
    """
    vocab_size = probs.shape[-1]
    width = min(vocab_size, 64)
    while True:
        head = torch.topk(probs, width, dim=-1).values  # [..., width] descending
        mass = head.cumsum(-1, dtype=torch.float64)  # [..., width]: a wide nucleus sums many tiny terms
        if width == vocab_size or bool((mass[..., -1] >= top_p).all()):
            break
        width = 4 * width if 32 * width < vocab_size else vocab_size  # a wide nucleus: sort it all
    num_kept = (mass - head < top_p).sum(-1, keepdim=True)  # [..., 1], >= 1
    cutoff = head.gather(-1, num_kept - 1)  # [..., 1] least likely kept probability
    probs = probs.masked_fill(probs < cutoff, 0.0)
    return probs / probs.sum(-1, keepdim=True)
