"""The looked-up chain of a head's plain steps (`specdec.proposers.plain_lookup`).

A step the floor keeps plain verifies, where it may look up (`lookup_depth`), the continuation of the
context's latest earlier match of two tokens or more, cut to the prefix that pays; the rates learn from it;
nothing else is drafted. On the bundled model, Medusa, Hydra, EAGLE, lookahead and Token Recycling under a
floor that keeps every step plain still produce plain decoding's text, and their plain steps verify looked-up
chains of copied text.
"""

from __future__ import annotations

import pytest
import torch

from specdec.engine.costs import CostModel
from specdec.engine.floor import Floor
from specdec.engine.generation import GenerationConfig, ProposalContext
from specdec.engine.loop import Engine
from specdec.engine.verify import VerifyResult
from specdec.proposers import parse_method
from specdec.proposers.plain_lookup import PlainLookup
from specdec.sampling import SamplingParams

CHEAP = CostModel((1, 16, 32, 64), (0.052, 0.094, 0.127, 0.189)).table(32)  # SmolLM2 fp32, 2-core AVX2 CPU
DEAR = CostModel((1, 2, 64), (1.0, 3.0, 90.0)).table(32)  # a second node costs two steps: no chain pays
# "1 2" matched twice: earliest 9 9 9, latest 8 6 4 (the lookup's); the root 2 closes the context
CONTEXT = [1, 2, 9, 9, 9, 5, 1, 2, 8, 6, 4, 1, 2]


def gated(tokens: list[int], lookup_depth: int) -> ProposalContext:
    return ProposalContext(tokens, torch.zeros(16), 1, SamplingParams(), 0, lookup_depth=lookup_depth)


def test_a_plain_step_verifies_the_latest_matchs_continuation_where_it_pays() -> None:
    lookup = PlainLookup(CHEAP, eos_token_ids=(4,))
    lookup.begin(CONTEXT[:-1])
    assert lookup.propose(gated(CONTEXT, 0)).num_nodes == 1  # no lookup asked: the root alone
    tree = lookup.propose(gated(CONTEXT, 8))
    assert tree.token_list[0] == 2 and tree.parent_list == list(range(-1, tree.num_nodes - 1))
    assert tree.token_list[1:] == [8, 6, 4][: tree.num_nodes - 1] and tree.num_nodes > 1  # cut after the EOS
    before = lookup.stats.rate(("lookup", 2, 0, 1))
    assert lookup.observe(VerifyResult([8, 15], [0, 1], torch.zeros(tree.num_nodes, 16), tree))
    assert lookup.stats.rate(("lookup", 2, 0, 1)) > before  # the first token was right
    assert lookup.stats.rate(("lookup", 2, 0, 2)) < 0.5  # the second was not
    assert not lookup.observe(VerifyResult([3], [0], torch.zeros(1, 16), tree))  # a step it did not propose


def test_no_match_no_room_or_dear_rows_verify_the_root_alone() -> None:
    fresh = PlainLookup(CHEAP)
    fresh.begin(list(range(10)))
    assert fresh.propose(gated([*range(10), 11], 8)).num_nodes == 1  # nothing matched
    one = PlainLookup(CHEAP)
    one.begin([5, 7, 3])
    assert one.propose(gated([5, 7, 3, 5], 8)).num_nodes == 1  # a one-token match is too weak
    dear = PlainLookup(DEAR)
    dear.begin(CONTEXT[:-1])
    assert dear.propose(gated(CONTEXT, 8)).num_nodes == 1  # it does not pay
    unpriced = PlainLookup([])
    unpriced.begin(CONTEXT[:-1])
    assert unpriced.propose(gated(CONTEXT, 8)).num_nodes == 1  # no cost table (adaptive=false): no lookup


def always_plain() -> Floor:
    """Each node beyond the root costs two plain steps: no head's tree pays, the floor keeps steps plain."""
    return Floor(price=lambda nodes, seconds: 2.0 * nodes - 1.0)


LOOKING_UP = ("medusa", "eagle", "lookahead", "recycle", "hydra")  # a proposer of each kind in the fast tier


@pytest.mark.parametrize("method", [m if m in LOOKING_UP[:3] else pytest.param(m, marks=pytest.mark.slow) for m in LOOKING_UP])
def test_plain_steps_verify_looked_up_chains(default_model, plain_runs, bench_prompts, method):
    """Summarization copies its article: the plain steps of a method the floor keeps plain verify looked-up
    chains whose tokens are accepted, and the text stays plain decoding's (lookahead's Jacobi window and the
    recycle table go on through them)."""
    engine = Engine(default_model, floor=always_plain())
    proposer = parse_method(method).build(default_model)
    out = engine.generate(bench_prompts["summarization"], proposer, GenerationConfig(max_new_tokens=64))
    assert out.token_ids == plain_runs.tokens("summarization", 64)
    assert proposer.lookup.accepted > 0 and proposer.lookup.offered >= proposer.lookup.accepted
