"""A draft node's price from the engine's own steps (`specdec.engine.node_price`), and its use by the floor,
the engine and LogitSpec's planner: the slope of a step's seconds against its nodes over a plain step's;
no price from trees of one size; a priced table never cheaper than the probe's; a dearer node, a smaller
tree; the text is plain decoding's whatever the price."""

from __future__ import annotations

import dataclasses

import torch
from helpers import build_proposer

from specdec.engine.costs import CostModel
from specdec.engine.floor import Floor, FloorState
from specdec.engine.generation import GenerationConfig, ProposalContext
from specdec.engine.loop import Engine
from specdec.engine.node_price import MAX_PRICE, MIN_WEIGHT, NodePrice, priced_table
from specdec.models.state import ModelState
from specdec.proposers.logitspec.proposer import LogitSpecConfig, LogitSpecProposer
from specdec.sampling import SamplingParams


def test_the_slope_of_seconds_against_nodes_over_a_plain_step():
    prices = NodePrice()
    for step in range(60):
        nodes = 2 + step % 7
        prices.add(nodes, 0.005 + 0.0005 * (nodes - 1))  # a fixed 5 ms (plain step, proposal) + 0.5 ms a node
    assert abs(prices.slope() - 0.0005) < 1e-9
    assert abs(prices.price(0.004) - 0.125) < 1e-6  # the intercept is not the node's: only the slope
    assert prices.price(None) is None and prices.price(0.0) is None
    assert prices.price(0.0001) == MAX_PRICE  # clipped


def test_no_price_from_few_steps_or_trees_of_one_size():
    prices = NodePrice()
    for _ in range(100):
        prices.add(5, 0.007)
    assert prices.slope() is None and prices.price(0.004) is None
    few = NodePrice()
    for step in range(int(MIN_WEIGHT) - 1):
        few.add(2 + 4 * (step % 2), 0.006 + 0.001 * (step % 2))
    assert few.price(0.004) is None


def test_a_priced_table_is_never_cheaper_than_the_probe():
    table = CostModel((1, 4, 16), (1.0, 1.3, 5.0)).table(16)
    assert priced_table(table, None) == table
    priced = priced_table(table, 0.25)
    assert priced[0] == 0.0 and priced[1] == table[1]
    assert all(p >= t for p, t in zip(priced, table, strict=True))
    assert priced[4] == 1.75 and priced[16] == table[16]  # the line where dearer, the curve where it is
    assert all(b >= a for a, b in zip(priced, priced[1:], strict=False))


def test_the_floor_prices_nodes_from_its_drafting_steps():
    state = FloorState()
    assert state.node_price() is None
    for step in range(60):  # runs of plain steps of 4 ms, of drafting steps of 5 ms + 1 ms a node
        drafted = step % 15 < 10
        nodes = 2 + step % 5 if drafted else 1
        state.observe(drafted, 2 if drafted else 1, 0.005 + 0.001 * (nodes - 1) if drafted else 0.004, nodes)
    assert abs(state.node_price() - 0.25) < 1e-6


def test_a_dearer_node_makes_a_smaller_logitspec_tree():
    context = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 4  # repeats: a long root branch and pld chain
    free = CostModel((1, 64), (1.0, 1.0))
    sizes = []
    for price in (None, 0.1, 0.5):
        proposer = LogitSpecProposer(LogitSpecConfig(k=4), free, ())
        proposer.begin(context[:-1])
        ctx = ProposalContext(context, torch.zeros(32), 1, SamplingParams(), 64, None, price)
        sizes.append(proposer.propose(ctx).num_nodes)
    assert sizes[0] > sizes[1] > sizes[2] >= 1, sizes


def test_the_engine_hands_its_rows_price_to_the_proposer(default_model, plain_runs, bench_prompts, request):
    """Under a fixed price of 1 s a step and 0.05 s a node, the proposer is handed 0.05 once the row has
    drafted trees of several sizes and taken settled plain steps; the text is plain decoding's.

    On a model state of its own: the acceptance rates and recycle table that earlier requests left in the
    shared one make lookups reach further, and a plain step that verifies a looked-up chain is not a step of
    the root alone, so whether one came within 48 tokens hung on which tests ran first in the worker."""
    seen = []
    fresh = dataclasses.replace(default_model, state=ModelState())
    proposer = build_proposer(fresh, "logitspec", request)
    propose = proposer.propose

    def spy(ctx: ProposalContext):
        seen.append(ctx.node_price)
        return propose(ctx)

    proposer.propose = spy
    engine = Engine(fresh, floor=Floor(price=lambda nodes, seconds: 1.0 + 0.05 * (nodes - 1)))
    out = engine.generate(bench_prompts["summarization"], proposer, GenerationConfig(max_new_tokens=48))
    assert out.token_ids == plain_runs.tokens("summarization", 48)
    priced = [price for price in seen if price is not None]
    assert seen[0] is None and priced and all(abs(price - 0.05) < 1e-6 for price in priced)
