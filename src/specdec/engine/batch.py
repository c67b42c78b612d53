"""A batch of rows decoded together: admission, chunked prefill, one verification pass per step.

Why a module of its own: `specdec.engine.loop`'s `Engine` owns the model, the target and the floor;
the batch owns what changes step by step (the rows, their proposers' trees, the node budget, the
joining prompts' chunks). `Engine.generate` runs a batch of one row; `generate_batch`, the server
and the list-of-prompts API keep several in flight.

    add(prompt)  --prefill--> a row (its first token emitted at once); while other rows
                 decode, the row waits instead and its prompt is prefilled by the steps
    step():
        a waiting prompt: prefill its next chunk (all of it when no row decodes)
        each row: proposer.propose(ctx) -> DraftTree          (root = last emitted token)
        node budget: one width for the pass, trees cut to it  (only with a cost curve)
        verify(target, trees, draws) -> VerifyResult per row  (one forward pass, paths committed)
        each row: proposer.observe(result), emit tokens (streaming, stop checks)
        rows that finished leave; new rows may be added before the next step

Invariants: see `specdec.engine.loop` (the loop's, which this module keeps); rows[b] sits in slot b
of the batched cache; a proposer that raises ends its own row (`Row.error`), the other rows go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from specdec.backends.contract import PromptFill, Target
from specdec.backends.registry import rows_of, verifiable_tree
from specdec.engine.accept import draw_next
from specdec.engine.costs import CostModel
from specdec.engine.floor import Floor, FloorState
from specdec.engine.generation import (
    Emitter,
    GenerationConfig,
    GenerationOutput,
    GenerationStats,
    ProposalContext,
    Proposer,
    StepStats,
)
from specdec.engine.planner import NarrowBatch, RowRates, cut, plan_width
from specdec.engine.provenance import Piece
from specdec.engine.uniforms import PositionUniforms
from specdec.engine.verify import Draws, VerifyResult, verify
from specdec.sampling import make_generator
from specdec.tree import DraftTree


class Owner(Protocol):
    """What a batch reads of the engine that made it (`specdec.engine.loop.Engine`): named here, not imported,
    so the engine's module depends on this one and not the other way round."""

    target: Target
    tokenizer: object
    eos_token_ids: frozenset[int]
    floor: Floor | None
    context_limit: int | float

    def check_prompt(self, prompt_ids: list[int]) -> None: ...

    def max_depth(self, tokens: list[int], out: Emitter) -> int: ...


# Prompt tokens prefilled per step while other rows decode. A pass's cost grows with its tokens, so
# this bounds how long a joining prompt holds the running rows; a few hundred tokens keep a chunk's
# pass within a few hundred milliseconds on a CPU while its per-pass overhead stays small against
# its work (a constant, not derived from the cost curve, which is measured for a few tree nodes).
DEFAULT_PREFILL_CHUNK = 256


@dataclass(eq=False)
class Row:
    """One sequence in the batch, from admission to its output."""

    prompt_ids: list[int]
    proposer: Proposer
    config: GenerationConfig
    emitter: Emitter
    draws: Draws
    started: float
    tokens: list[int] = field(default_factory=list)
    logits: torch.Tensor | None = None  # [V] the last emitted token was drawn from these
    stats: GenerationStats = field(default_factory=GenerationStats)
    rates: RowRates = field(default_factory=RowRates)
    output: GenerationOutput | None = None
    error: Exception | None = None
    cancelled: bool = False
    draft_s: float = 0.0  # the current step's proposal time
    floor: FloorState | None = None  # under the engine's floor: greedy rows, sampled ones with deterministic drafts
    drafting: bool = True  # the current step asked the proposer for drafts
    fill: PromptFill | None = None  # the prompt's chunked prefill while the row waits for it
    features: torch.Tensor | None = None  # target features the proposer has not read yet (ProposalContext)
    top: list[int] | None = None  # the top ids of `logits` where the step read them back (ProposalContext)

    @property
    def finished(self) -> bool:
        return self.output is not None or self.error is not None or self.cancelled


class Batch:
    """Up to `max_batch` decode loops, one forward pass per step."""

    def __init__(
        self,
        engine: Owner,
        costs: CostModel | None = None,
        max_batch: int = 8,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    ) -> None:
        """costs: pass seconds per token count, to plan one node budget per pass (`specdec.engine.planner`);
        None: every tree is verified whole, as its proposer sized it. prefill_chunk: prompt tokens
        prefilled per step while other rows decode."""
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.engine = engine
        self.costs = costs
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.target = rows_of(engine.target, engine.keep_prompts)
        self._narrow = NarrowBatch()  # a full batch's greedy rows stop proposing what its plan would cut
        self._proposing = True
        self.rows: list[Row] = []  # rows[b] sits in slot b of the batched cache
        self.waiting: list[Row] = []  # admitted rows whose prompts are still being prefilled, in order

    @property
    def active(self) -> list[Row]:
        """Every admitted row that has not finished: the decoding ones, then the waiting ones."""
        return [*self.rows, *self.waiting]

    @property
    def has_room(self) -> bool:
        return len(self.rows) + len(self.waiting) < self.max_batch

    def add(
        self,
        prompt_ids: Sequence[int],
        proposer: Proposer,
        config: GenerationConfig,
        on_text: Callable[[str], None] | None = None,
        on_piece: Callable[[Piece], None] | None = None,
    ) -> Row:
        """Admit a sequence: prefill it alone and emit its first token. A row may finish right here.
        on_piece: also hand on each piece of text with its token's source (`specdec.engine.provenance`).

        While other rows are admitted, the row waits instead (`Row.fill`): `step` prefills it a chunk
        at a time and emits its first token when its last chunk has run."""
        if not self.has_room:
            raise RuntimeError(f"the batch is full ({self.max_batch} rows)")
        engine = self.engine
        prompt_ids = [int(t) for t in prompt_ids]
        engine.check_prompt(prompt_ids)
        generator = make_generator(config.sampling, engine.target.device)
        positions = PositionUniforms(generator, engine.target.device)
        draws = Draws(config.sampling, generator, positions, proposer.multi_draft)
        emitter = Emitter(engine.tokenizer, engine.eos_token_ids, config, on_text, on_piece)
        row = Row(prompt_ids, proposer, config, emitter, draws, time.perf_counter())
        # a sampled row is gated only where its output cannot depend on what was drafted (`floor`)
        if engine.floor is not None and (config.sampling.greedy or getattr(proposer, "deterministic_drafts", False)):
            row.floor = engine.floor.start(proposer, config.sampling.greedy)
        row.stats.num_prompt_tokens = len(prompt_ids)
        try:
            self._capture(proposer.feature_layers)
            proposer.begin(prompt_ids)
            if self.rows or self.waiting:
                row.fill = PromptFill(prompt_ids)
                self.waiting.append(row)
                return row
            done = self._first_token(row, self.target.add(prompt_ids))
        except Exception as err:  # noqa: BLE001 - one request's failure must not end the batch
            row.error = err
            done = True
        if done:
            self._finish(row)
        return row

    def _capture(self, layers: tuple[int, ...]) -> None:
        """Have every pass return the target features at `layers` (one set per batch: one head)."""
        if not layers:
            return
        held = {tuple(r.proposer.feature_layers) for r in self.active if r.proposer.feature_layers}
        if held and held != {tuple(layers)}:
            raise ValueError(f"this batch's passes capture hidden states {min(held)}; a row asks for {layers}")
        self.target.capture = tuple(layers)

    def _first_token(self, row: Row, joined: tuple[int, torch.Tensor, torch.Tensor | None]) -> bool:
        """A prefilled row joins the decoding rows: draw and emit its first token; True when done."""
        _, logits, features = joined
        self.rows.append(row)
        row.fill, row.logits = None, logits
        row.features = features if row.proposer.feature_layers else None
        row.stats.num_forward_passes = 1
        row.tokens = [*row.prompt_ids, draw_next(logits, row.config.sampling, row.draws.positions)]
        row.stats.prefill_s = time.perf_counter() - row.started
        return row.emitter.emit(row.tokens[-1:])

    def _prefill(self) -> list[Row]:
        """Prefill the first waiting prompt's next chunk (all of it when no row decodes); returns it
        when it finished right at its first token (or failed)."""
        row = self.waiting[0]
        size = self.prefill_chunk if self.rows else row.fill.remaining
        try:
            joined = self.target.fill(row.fill, size)
            if joined is None:
                return []
            self.waiting.pop(0)
            done = self._first_token(row, joined)
        except Exception as err:  # noqa: BLE001 - one request's failure must not end the batch
            if row in self.waiting:
                self.waiting.remove(row)
            row.error, done = err, True
        if not done:
            return []
        self._finish(row)
        return [row]

    def cancel(self, row: Row) -> None:
        """Drop a row between steps (a client went away); its output is never made."""
        row.cancelled = True
        if row in self.waiting:
            self.waiting.remove(row)
        self._leave(row)

    def step(self) -> list[Row]:
        """A waiting prompt's next chunk, then one forward pass over every decoding row; returns the rows
        that finished in it."""
        joined = self._prefill() if self.waiting else []
        if not self.rows:
            return joined
        began = time.perf_counter()
        trees = self._propose()
        self._capture_for_next()
        start = time.perf_counter()
        # getattr: a proposer written to the protocol before it named `top_wanted` reads no top ids
        tops = [getattr(row.proposer, "top_wanted", 0) for row in self.rows]
        every = [getattr(row.proposer, "tops_at_every_node", False) for row in self.rows]
        results = verify(self.target, trees, [row.draws for row in self.rows], self.engine.one_transfer, tops, every)
        verify_s = time.perf_counter() - start
        rows = list(self.rows)  # _advance may end rows; the results follow the pass's order
        finished = [row for row, res in zip(rows, results, strict=True) if self._advance(row, res, verify_s)]
        if len(rows) == 1 and rows[0].floor is not None:  # the step was the row's alone: its price
            row, result = rows[0], results[0]
            seconds = self.engine.floor.price(result.tree.num_nodes, time.perf_counter() - began)
            row.floor.observe(row.drafting, len(result.tokens), seconds, result.tree.num_nodes)
        for row in finished:
            self._finish(row)
        return joined + finished

    def run(self) -> None:
        """Step until every row has finished."""
        while self.rows or self.waiting:
            self.step()

    def _propose(self) -> list[DraftTree]:
        trees = []
        self._proposing = self.costs is None or self._narrow.propose(len(self.rows))
        for row in self.rows:
            t0 = time.perf_counter()
            depth = self.engine.max_depth(row.tokens, row.emitter)
            gated = len(self.rows) == 1 and row.floor is not None
            if len(self.rows) > 1:  # the batch's plan prices drafts: a narrow one skips greedy rows' proposals
                row.drafting = self._proposing or not row.config.sampling.greedy
            else:
                row.drafting = row.floor is None or row.floor.drafts()
            # a plain step: the proposer keeps its state, drafts nothing beyond what a lookup alone finds
            depth, lookup = (depth, 0) if row.drafting else (0, depth if gated else 0)
            # a node's price as this row's own steps paid it (solo steps: a batch's plan prices its rows)
            price = row.floor.node_price() if row.floor is not None and len(self.rows) == 1 else None
            ctx = ProposalContext(
                row.tokens, row.logits, len(row.prompt_ids), row.config.sampling, depth, row.features, price, lookup,
                row.top,
            )
            row.features = None
            try:
                tree = row.proposer.propose(ctx)
                row.emitter.drafted(row.proposer, tree)
                if len(row.tokens) + tree.max_depth >= self.engine.context_limit:
                    raise RuntimeError(f"{type(row.proposer).__name__} drafted past the model's context")
                if tree.draft_probs is not None and row.floor is not None and not row.config.sampling.greedy:
                    raise RuntimeError(f"{type(row.proposer).__name__} says deterministic_drafts but drew a tree: "
                                       "a gated sampled row's output would depend on timing")
            except Exception as err:  # noqa: BLE001 - the row ends; verify its root alone this step
                row.error, tree = err, DraftTree.chain(row.tokens[-1])
            tree = verifiable_tree(self.target, tree)  # what this backend's pass can verify of it
            row.draft_s = time.perf_counter() - t0
            trees.append(tree)
        return trees if self.costs is None else self._budget(trees)

    def _capture_for_next(self) -> None:
        """A gated row alone in the pass, whose proposer can miss features (`features_optional`), captures them
        only where its next step may draft: the floor's plain steps then pay a plain pass. Any other batch
        captures what its rows asked (`_capture`)."""
        if len(self.rows) != 1 or self.waiting:
            return
        row = self.rows[0]
        # getattr: a proposer written to the protocol before it named `features_optional` keeps every capture
        optional = getattr(row.proposer, "features_optional", False)
        if not row.proposer.feature_layers or not optional or row.floor is None:
            return
        wanted = row.floor.may_draft_next(row.drafting)
        self.target.capture = tuple(row.proposer.feature_layers) if wanted else ()

    def _budget(self, trees: list[DraftTree]) -> list[DraftTree]:
        """Cut the trees to the pass width that maximises the batch's expected tokens per second. A lone row
        under the floor whose proposer sized its tree by these costs itself (`Proposer.sized_by_costs`) keeps
        it: that planner knows its sources, the batch's plan only depth and rank (docs/results/2026-12-solo-plan)."""
        if self._keeps_trees(self.rows[0]):
            return trees
        if all(tree.num_nodes == 1 for tree in trees):  # nothing to cut (the plan's width would be 1)
            if self._proposing:
                self._narrow.planned(len(self.rows), 1, 1)
            return trees
        probs = [row.rates.node_probs(tree) for row, tree in zip(self.rows, trees, strict=True)]
        fixed = [not row.proposer.prunable for row in self.rows]
        for b, row in enumerate(self.rows):
            if not fixed[b] and not row.config.sampling.greedy and trees[b].draft_probs is not None:
                # Rejection sampling takes one random draw per node, so a sampled row with drafted
                # probabilities is cut by its own plan alone: its seeded output must not depend on what
                # shares the batch. Deterministic drafts draw by output position (specdec.engine.uniforms).
                width = plan_width([probs[b]], [False], self.costs.cost)
                trees[b], probs[b], fixed[b] = cut(trees[b], width), probs[b][:width], True
        width = plan_width(probs, fixed, self.costs.cost)
        if self._proposing:
            self._narrow.planned(len(self.rows), width, max(tree.num_nodes for tree in trees))
        return [tree if keep else cut(tree, width) for tree, keep in zip(trees, fixed, strict=True)]

    def _keeps_trees(self, row: Row) -> bool:
        """Whether the plan leaves `row`'s trees as proposed: a row alone in the pass, under the floor, whose
        proposer sized them by the costs itself (`Proposer.sized_by_costs`)."""
        # getattr: a proposer written to the protocol before it named `sized_by_costs` is planned as pld's is
        return len(self.rows) == 1 and row.floor is not None and getattr(row.proposer, "sized_by_costs", False)

    def _advance(self, row: Row, result: VerifyResult, verify_s: float) -> bool:
        """Observe, emit and record one step of a row; True when the row is done."""
        if row.error is not None:
            return True
        try:
            row.proposer.observe(result)
        except Exception as err:  # noqa: BLE001
            row.error = err
            return True
        # rates only where the plan reads them, and a root alone offered no node to learn from
        if self.costs is not None and result.tree.num_nodes > 1 and not self._keeps_trees(row):
            row.rates.observe(result.tree, result.path)
        row.stats.num_forward_passes += 1
        row.stats.steps.append(StepStats(result.tree.num_nodes, result.num_accepted, row.draft_s, verify_s))
        row.tokens.extend(result.tokens)
        row.logits, row.top = result.next_logits, result.next_top
        if result.features is not None and row.proposer.feature_layers:
            row.features = result.features[result.path]  # the committed nodes' features, root first
        done = row.emitter.emit(result.tokens, step=len(row.stats.steps))
        return done or len(row.tokens) >= self.engine.context_limit

    def _finish(self, row: Row) -> None:
        self._leave(row)
        if row.error is not None or row.cancelled:
            return
        if row.floor is not None:
            self.engine.floor.finish(row.proposer, row.floor, row.config.sampling.greedy)
        row.stats.wall_time_s = time.perf_counter() - row.started
        row.stats.num_new_tokens = len(row.emitter.stream.token_ids)
        text = row.emitter.finish()
        emitter = row.emitter
        row.output = GenerationOutput(emitter.stream.token_ids, text, emitter.finish_reason, row.stats)

    def _leave(self, row: Row) -> None:
        if row not in self.rows:
            return
        slot = self.rows.index(row)
        moved = self.target.remove(slot)
        last = self.rows.pop()
        if moved is not None:
            self.rows[slot] = last
