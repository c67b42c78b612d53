"""`ProposerBase`: the defaults of the proposer protocol (`specdec.engine.generation.Proposer`).

Why: most proposers read no target features, count no sources and keep nothing between prompts, and
each used to say so in the same lines. A proposer states only what differs: `prunable = True` where a
batch's node budget may cut its tree to a prefix of its node order, `feature_layers` where it reads the
target's hidden states, `source_stats` where it counts its draft sources, `multi_draft` where its
`accept` option picks SpecTr's rule for drawn siblings, `draft_source` (or `node_sources()`, where a tree
mixes sources) to name where its drafts come from (`specdec.engine.provenance`), `deterministic_drafts` where
its trees never carry draft probabilities, `sized_by_costs` where it sizes its trees by the machine's pass costs,
`top_wanted` where it reads the top target ids of a step's logits.

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
    features_optional: bool = False  # a pass may capture no features for it (`Proposer.features_optional`)
    multi_draft: str = "specinfer"  # drawn siblings' rule; methods with an `accept` option set it
    draft_source: str = "draft"  # what an accepted token of this proposer's trees is tagged with
    # its trees never carry draft_probs: a sampled output is then plain sampling's whatever was drafted
    # (`engine.uniforms`), so the floor may gate its sampled rows by timing too (`engine.floor`)
    deterministic_drafts: bool = False
    # its trees are already sized by this machine's pass costs: a lone gated row keeps them (`Batch._budget`)
    sized_by_costs: bool = False
    top_wanted: int = 0  # top target ids at every node it reads from a step's logits (`Proposer.top_wanted`)

    def node_sources(self) -> list[str] | None:
        """The source of each node of the tree last proposed, root first (None: `draft_source` for all)."""
        return None

    def begin(self, prompt_ids: list[int]) -> None:
        """A new prompt starts (the default keeps nothing per prompt)."""

    def observe(self, result: VerifyResult) -> None:
        """The last tree's verification (the default learns nothing from it)."""
