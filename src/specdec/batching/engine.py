"""The decode loop over many sequences at once: one forward pass verifies every row's tree.

    add(prompt)  --prefill alone--> a row (its first token emitted at once)
    step():
        each row: proposer.propose(ctx) -> DraftTree
        planner: one width for the pass (expected gain per cost), trees cut to it
        BatchedTarget.verify_trees(trees) -> logits per row    (one forward pass)
        each row: accept -> commit its path -> proposer.observe -> emit tokens
        rows that finished leave; new rows may be added before the next step

Rows join and leave between steps (continuous batching). Each row keeps its own
proposer, sampling generator, emitter (stop strings, EOS, max_new_tokens) and
statistics, so a row's output depends only on its own prompt, settings and
seed: in fp32 greedy it equals `Engine.generate` on that prompt alone, and a
seeded sampled row draws the same random numbers whatever else shares the pass
(with deterministic drafts, the tokens plain sampling draws with that seed).

Invariants (as `specdec.engine`, per row): output never overshoots; MAT counts
decode steps only; a row's proposer is used by that row alone while it runs. A
proposer that raises ends its own row with the error (`Row.error`); the other
rows go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specdec.batching.planner import RowRates, cut, plan_width
from specdec.batching.target import BatchedTarget
from specdec.engine import (
    Emitter,
    Engine,
    GenerationConfig,
    GenerationOutput,
    GenerationStats,
    ProposalContext,
    Proposer,
    StepStats,
)
from specdec.proposers.budget import CostModel
from specdec.sampling import accept, draw_next, make_generator
from specdec.tree import DraftTree
from specdec.uniforms import PositionUniforms
from specdec.verify import VerifyResult


@dataclass(eq=False)
class Row:
    """One sequence in the batch, from admission to its output."""

    prompt_ids: list[int]
    proposer: Proposer
    config: GenerationConfig
    emitter: Emitter
    generator: torch.Generator | None
    positions: PositionUniforms  # token t of the row is drawn with the t-th uniform (see specdec.uniforms)
    started: float
    tokens: list[int] = field(default_factory=list)
    logits: torch.Tensor | None = None  # [V] the last emitted token was drawn from these
    stats: GenerationStats = field(default_factory=GenerationStats)
    rates: RowRates = field(default_factory=RowRates)
    output: GenerationOutput | None = None
    error: Exception | None = None
    cancelled: bool = False
    draft_s: float = 0.0  # the current step's proposal time

    @property
    def finished(self) -> bool:
        return self.output is not None or self.error is not None or self.cancelled


class BatchEngine:
    """Runs up to `max_batch` decode loops in one forward pass per step."""

    def __init__(self, engine: Engine, costs: CostModel | None = None, max_batch: int = 8) -> None:
        """engine: the one-sequence engine (model, tokenizer, limits); costs: pass seconds per token
        count (None: widths are not planned, every tree is verified whole)."""
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.engine = engine
        self.costs = costs
        self.max_batch = max_batch
        self.target = BatchedTarget(engine.target)
        self.rows: list[Row] = []  # rows[b] sits in slot b of the batched cache

    @property
    def has_room(self) -> bool:
        return len(self.rows) < self.max_batch

    def add(
        self,
        prompt_ids: Sequence[int],
        proposer: Proposer,
        config: GenerationConfig,
        on_text: Callable[[str], None] | None = None,
    ) -> Row:
        """Admit a sequence: prefill it alone and emit its first token. A row may finish right here."""
        if not self.has_room:
            raise RuntimeError(f"the batch is full ({self.max_batch} rows)")
        prompt_ids = [int(t) for t in prompt_ids]
        self.engine.check_prompt(prompt_ids)
        generator = make_generator(config.sampling, self.engine.target.device)
        row = Row(
            prompt_ids,
            proposer,
            config,
            Emitter(self.engine, config, on_text),
            generator,
            PositionUniforms(generator, self.engine.target.device),
            time.perf_counter(),
        )
        row.stats.num_prompt_tokens = len(prompt_ids)
        try:
            proposer.begin(prompt_ids)
            slot, row.logits = self.target.add(prompt_ids)
            self.rows.append(row)
            row.stats.num_forward_passes = 1
            row.tokens = [*prompt_ids, draw_next(row.logits, config.sampling, row.positions)]
            row.stats.prefill_s = time.perf_counter() - row.started
            done = row.emitter.emit(row.tokens[-1:])
        except Exception as err:  # noqa: BLE001 - one request's failure must not end the batch
            row.error = err
            done = True
        if done:
            self._finish(row)
        return row

    def cancel(self, row: Row) -> None:
        """Drop a row between steps (a client went away); its output is never made."""
        row.cancelled = True
        self._leave(row)

    def step(self) -> list[Row]:
        """One forward pass over every row; returns the rows that finished in it."""
        if not self.rows:
            return []
        trees = self._propose()
        start = time.perf_counter()
        logits = self.target.verify_trees(trees)
        results = [
            self._accept(row, tree, rows) for row, tree, rows in zip(self.rows, trees, logits, strict=True)
        ]
        self.target.commit([result.path for result in results])
        verify_s = time.perf_counter() - start
        finished = []
        for row, result in zip(list(self.rows), results, strict=True):
            if self._advance(row, result, verify_s):
                finished.append(row)
        for row in finished:
            self._finish(row)
        return finished

    def run(self) -> None:
        """Step until every row has finished."""
        while self.rows:
            self.step()

    def _propose(self) -> list[DraftTree]:
        trees = []
        for row in self.rows:
            t0 = time.perf_counter()
            ctx = ProposalContext(
                row.tokens,
                row.logits,
                len(row.prompt_ids),
                row.config.sampling,
                self.engine.max_depth(row.tokens, row.emitter),
            )
            try:
                tree = row.proposer.propose(ctx)
                if len(row.tokens) + tree.max_depth >= self.engine.context_limit:
                    raise RuntimeError(f"{type(row.proposer).__name__} drafted past the model's context")
            except Exception as err:  # noqa: BLE001 - the row ends; verify its root alone this step
                row.error, tree = err, DraftTree.chain(row.tokens[-1])
            row.draft_s = time.perf_counter() - t0
            trees.append(tree)
        if self.costs is None:
            return trees
        probs = [row.rates.node_probs(tree) for row, tree in zip(self.rows, trees, strict=True)]
        fixed = [not getattr(row.proposer, "prunable", True) for row in self.rows]
        for b, row in enumerate(self.rows):
            if not fixed[b] and not row.config.sampling.greedy and trees[b].draft_probs is not None:
                # Rejection sampling takes one random draw per node, so a sampled row with drafted
                # probabilities is cut by its own plan alone: its seeded output must not depend on what
                # shares the batch. Deterministic drafts draw by output position (specdec.uniforms).
                width = plan_width([probs[b]], [False], self.costs.cost)
                trees[b], probs[b], fixed[b] = cut(trees[b], width), probs[b][:width], True
        width = plan_width(probs, fixed, self.costs.cost)
        return [tree if keep else cut(tree, width) for tree, keep in zip(trees, fixed, strict=True)]

    def _accept(self, row: Row, tree: DraftTree, logits: torch.Tensor) -> VerifyResult:
        """logits [n, V] for the row's tree -> its result (the row's own generator draws)."""
        acceptance = accept(tree, logits, row.config.sampling, row.generator, row.positions)
        return VerifyResult(acceptance.tokens, acceptance.path, logits, tree)

    def _advance(self, row: Row, result: VerifyResult, verify_s: float) -> bool:
        """Observe, emit and record one step of a row; True when the row is done."""
        if row.error is not None:
            return True
        try:
            row.proposer.observe(result)
        except Exception as err:  # noqa: BLE001
            row.error = err
            return True
        row.rates.observe(result.tree, result.path)
        row.stats.num_forward_passes += 1
        row.stats.steps.append(StepStats(result.tree.num_nodes, result.num_accepted, row.draft_s, verify_s))
        row.tokens.extend(result.tokens)
        row.logits = result.next_logits
        done = row.emitter.emit(result.tokens)
        return done or len(row.tokens) >= self.engine.context_limit

    def _finish(self, row: Row) -> None:
        self._leave(row)
        if row.error is not None or row.cancelled:
            return
        row.stats.wall_time_s = time.perf_counter() - row.started
        row.stats.num_new_tokens = len(row.emitter.stream.token_ids)
        text = row.emitter.finish()
        row.output = GenerationOutput(
            row.emitter.stream.token_ids, text, row.emitter.finish_reason, row.stats
        )

    def _leave(self, row: Row) -> None:
        if row not in self.rows:
            return
        slot = self.rows.index(row)
        moved = self.target.remove(slot)
        last = self.rows.pop()
        if moved is not None:
            self.rows[slot] = last


def generate_batch(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    proposers: Sequence[Proposer] | Callable[[], Proposer],
    config: GenerationConfig | Sequence[GenerationConfig],
    costs: CostModel | None = None,
    max_batch: int = 8,
    on_done: Callable[[int, Row], None] | None = None,
    raise_errors: bool = True,
) -> list[GenerationOutput | None]:
    """Generate for every prompt, up to `max_batch` at a time (rows join as others finish).

    proposers: one per prompt, or a factory called at most `max_batch` times (a finished row's proposer
    serves the next prompt: `begin` resets it). config: one for all, or one per prompt. on_done(i, row)
    is called as prompt i finishes. Raises the first failed row's error once all are done (with
    raise_errors; else a failed prompt's output is None).
    """
    configs = [config] * len(prompts) if isinstance(config, GenerationConfig) else list(config)
    if callable(proposers):
        make, idle = proposers, []
    else:
        make, idle = None, list(reversed(proposers))
        if len(idle) != len(prompts):
            raise ValueError("need one proposer per prompt")
    if len(configs) != len(prompts):
        raise ValueError("need one config per prompt")
    batch = BatchEngine(engine, costs, max_batch)
    rows: list[Row] = []
    waiting = list(range(len(prompts)))

    def settle(row: Row) -> None:
        if make is not None:
            idle.append(row.proposer)
        if on_done is not None:
            on_done(rows.index(row), row)

    while waiting or batch.rows:
        while waiting and batch.has_room:
            i = waiting.pop(0)
            proposer = idle.pop() if idle else make()
            rows.append(batch.add(prompts[i], proposer, configs[i]))
            if rows[-1].finished:
                settle(rows[-1])
        for row in batch.step():
            settle(row)
    for row in rows:
        if row.error is not None and raise_errors:
            raise row.error
    return [row.output for row in rows]
