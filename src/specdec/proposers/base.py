"""`ProposerBase`: the defaults of the proposer protocol (`specdec.engine.generation.Proposer`).

Why: most proposers read no target features, count no sources and keep nothing between prompts, and
each used to say so in the same lines. A proposer states only what differs: `prunable = True` where a
batch's node budget may cut its tree to a prefix of its node order, `feature_layers` where it reads the
target's hidden states, `source_stats` where it counts its draft sources, `multi_draft` where its
`accept` option picks SpecTr's rule for drawn siblings.

The safe defaults: not prunable (a tree whose shape is the algorithm, as lookahead's Jacobi window,
must not be cut), no sources, no features, nothing to reset at a new prompt, nothing learned from a
result.
"""

from __future__ import annotations

from specdec.engine.verify import VerifyResult


class ProposerBase:
    prunable: bool = False
    source_stats: dict[str, dict[str, int]] | None = None
    feature_layers: tuple[int, ...] = ()
    multi_draft: str = "specinfer"  # drawn siblings' rule; methods with an `accept` option set it

    def begin(self, prompt_ids: list[int]) -> None:
        """A new prompt starts (the default keeps nothing per prompt)."""

    def observe(self, result: VerifyResult) -> None:
        """The last tree's verification (the default learns nothing from it)."""
