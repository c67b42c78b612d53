"""The one decode loop, for every method and every caller: a batch of rows, one row the common case.

`Engine` holds the model, its verification target and the floor; a step of the loop is
`specdec.engine.batch.Batch.step` (admission, chunked prefill, proposals, one pass, emission).

`Engine.generate` is a batch of one row run to its end; `generate_batch`, the
server and the list-of-prompts API keep several rows in flight (continuous
batching). Each row keeps its own proposer, sampling generator, emitter and
statistics, so a row's output depends only on its own prompt, settings and
seed: in fp32 greedy it equals that prompt decoded alone, and a seeded sampled
row draws the same random numbers whatever else shares the pass.

Invariants:
- output never overshoots (`specdec.engine.generation.Emitter`); MAT counts decode
  steps only, so plain decoding has MAT = 1.00 exactly and a proposer whose every
  draft of depth d is accepted has MAT = d + 1 exactly; `num_forward_passes` =
  decode steps + 1 (the prefill);
- acceptance happens in `specdec.engine.verify` only;
- randomness comes only from each row's `torch.Generator`, seeded from its
  sampling params; the t-th sampled token is drawn with the t-th uniform
  (`specdec.engine.uniforms`);
- a proposer that raises ends its own row with the error (`Row.error`); the other
  rows go on; `Engine.generate` raises it;
- a long prompt delays the decoding rows by at most one chunk's pass per step
  (`prefill_chunk` tokens): prompts that join a running batch are prefilled a
  chunk per step, first come first served, and a cancelled one stops between
  chunks. A prompt that finds no row decoding is prefilled in one piece (chunks
  only pay when others wait), so `Engine.generate` always prefills in one piece.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from specdec.backends.registry import AttentionPlan, verifier
from specdec.engine.batch import DEFAULT_PREFILL_CHUNK, Batch, Row
from specdec.engine.costs import CostModel, load_or_measure
from specdec.engine.floor import Floor
from specdec.engine.generation import Emitter, GenerationConfig, GenerationOutput, Proposer
from specdec.models import LoadedModel


class Engine:
    """One loaded target model and its limits; decodes through `Batch`es of rows."""

    def __init__(
        self,
        loaded: LoadedModel,
        attention: str | AttentionPlan = "auto",
        floor: Floor | None = None,
        one_transfer: bool | None = None,
        keep_prompts: bool = True,
    ) -> None:
        """attention: "auto" (the plan measured once per machine, see `specdec.backends.torch.attention`), an
        implementation name for every pass ("sdpa", "eager"), or an `AttentionPlan`. Verification
        runs on `specdec.backends.registry.verifier(loaded)`: the transformers model (prepacked Linear weights as
        `loaded.pack` says) or llama.cpp's engine (`loaded.backend`). floor: a row drafts only while its
        drafting steps out-earn plain ones (`specdec.engine.floor`); None: every step drafts as its
        proposer chose (what the user-facing entry points turn on, the tests of a method's own trees off).
        one_transfer: a step's decisions, and the top ids its proposers read, come back in one transfer
        (`specdec.engine.verify`); None: on an accelerator, where each read waits on the device. keep_prompts:
        a prompt prefilled whole is kept, and the same prompt again joins without its prefill
        (`specdec.backends.torch.prompt_cache`); off where every request must pay its own (the bench, whose
        methods take turns on each prompt)."""
        self.loaded = loaded
        self.floor = floor
        self.one_transfer = one_transfer
        self.keep_prompts = keep_prompts
        self.tokenizer = loaded.tokenizer
        self.target = verifier(loaded, attention)
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        # Most tokens a sequence may hold: the model's `max_position_embeddings`; 0 there means unbounded.
        # Read once: the loop asks every step, and a transformers config's attribute read is not free.
        self.context_limit: int | float = self.target.max_length or math.inf
        self._solo: Batch | None = None  # generate()'s batch of one, its cache buffers reused
        self._costs: CostModel | None = None  # this machine's pass costs, read or measured on first use

    def batch(
        self, costs: CostModel | None = None, max_batch: int = 8, prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    ) -> Batch:
        """An empty batch on this engine (its own KV cache); see `Batch`."""
        return Batch(self, costs, max_batch, prefill_chunk)

    def generate(
        self,
        prompt_ids: list[int],
        proposer: Proposer,
        config: GenerationConfig,
        on_text: Callable[[str], None] | None = None,
    ) -> GenerationOutput:
        """Decode one prompt to its end: a batch of one row. Under a floor (what the API, CLI, server and bench
        decode with) it plans with this machine's pass costs as any batch does: a lone row's trees are cut to
        the width its own acceptance pays for unless its proposer sized them by those costs itself
        (`Batch._budget`). Without a floor (what the tests of a method's own trees see) every tree is verified
        as its proposer sized it."""
        if self._solo is None or self._solo.active:  # a call interrupted mid-way leaves rows behind
            self._solo = self.batch(costs=self.pass_costs() if self.floor is not None else None, max_batch=1)
        row = self._solo.add(prompt_ids, proposer, config, on_text)
        self._solo.run()
        if row.error is not None:
            raise row.error
        return row.output

    def pass_costs(self) -> CostModel:
        """This machine's pass cost curve for the model (`load_or_measure`: cached per machine, measured once)."""
        if self._costs is None:
            self._costs = load_or_measure(self.loaded)
        return self._costs

    def max_depth(self, tokens: list[int], out: Emitter) -> int:
        """Deepest draft that can still be emitted: within max_new_tokens, and with every tree node and
        the bonus token after the deepest one at a position below the context limit."""
        room = self.context_limit - len(tokens) - 1
        return int(max(0, min(out.remaining - 1, room)))

    def check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise ValueError("the prompt is empty: give at least one token")
        limit = self.target.max_length
        if limit and len(prompt_ids) >= limit:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the model's context is {limit}")
        vocab = self.target.config.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise ValueError(f"prompt token ids must lie in [0, {vocab})")


def generate_batch(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    proposers: Sequence[Proposer] | Callable[[], Proposer],
    config: GenerationConfig | Sequence[GenerationConfig],
    costs: CostModel | None = None,
    max_batch: int = 8,
    on_done: Callable[[int, Row], None] | None = None,
    raise_errors: bool = True,
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
) -> list[GenerationOutput | None]:
    """Generate for every prompt, up to `max_batch` at a time (rows join as others finish).

    proposers: one per prompt, or a factory called at most `max_batch` times (a finished row's proposer
    serves the next prompt: `begin` resets it). config: one for all, or one per prompt. on_done(i, row)
    is called as prompt i finishes. prefill_chunk: see `Batch`. Raises the first failed row's error
    once all are done (with raise_errors; else a failed prompt's output is None).
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
    batch = engine.batch(costs, max_batch, prefill_chunk)
    rows: list[Row] = []
    waiting = list(range(len(prompts)))

    def settle(row: Row) -> None:
        if make is not None:
            idle.append(row.proposer)
        if on_done is not None:
            on_done(rows.index(row), row)

    while waiting or batch.active:
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
