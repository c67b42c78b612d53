"""LogitSpec and prompt lookup as vLLM speculative proposers (`"method": "custom_class"`).

Why: vLLM serves at scale (continuous batching, paged KV cache, tensor and
pipeline parallelism) but has no LogitSpec. vLLM 0.32 loads a user class named
in `speculative_config`:

    --speculative-config '{"method": "custom_class",
                           "model": "specdec.integrations.vllm.LogitSpecProposer",
                           "num_speculative_tokens": 5}'

builds it as `Class(vllm_config)`, calls `load_model(target_model)` once, then
after every step `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
slot_mappings)`, which returns one draft chain per batch row ([] for none).
vLLM verifies chains (not trees) and keeps the output lossless whatever is proposed.

- `PromptLookupProposer`: specdec's prompt lookup (transformers' semantics), to
  compare with vLLM's own `ngram`.
- `LogitSpecProposer`: LogitSpec in chain mode. Per request, the retrieval of
  `specdec.proposers.logitspec.retrieve` (the root's continuation and, for each
  top-k candidate of the logits the root was drawn from, the candidate and its
  continuation), of which the single most promising branch prefix is kept
  (`logitspec.chain.retrieve_chain`: candidates that cannot win are not looked up). The
  logits come from the target itself: `load_model` wraps its
  `compute_logits` (`vllm_runner.LogitsTap`), and each request's row is found
  from vLLM's layout (`vllm_runner.root_rows`). For greedy requests the token
  vLLM emitted must be a maximum of its row: `counters["layout_mismatched"]` counts
  rows where it was not (the tests require zero). A draft token is kept while
  its chance of acceptance beats its price, which `step_cost.StepCost` measures
  from the engine's own decode steps (seconds per carried token, at the current
  tokens per second): on a CPU one request's step carries five drafts almost for
  free, a full batch's does not, so chains grow or shrink with the batch.

Options: `vllm_options` (SPECDEC_VLLM_* variables or a JSON file in
SPECDEC_VLLM_CONFIG); the draft length is vLLM's `num_speculative_tokens`.

Invariants: one n-gram index per request, keyed by vLLM's request id (by batch
row, checked against the row's tokens, if the runner cannot be found), extended
only by the tokens added since the previous step and dropped when the request
leaves; `propose` never raises (an internal error is logged once, counted in
`counters["errors"]`, and gives [] for the whole step); empty contexts, contexts
of one token, partial prefills and requests at the length limit get [];
drafts never run past `max_model_len` and are cut after an end-of-sequence token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specdec.engine.costs import AcceptanceStats
from specdec.integrations.step_cost import StepCost
from specdec.integrations.vllm_options import LogitSpecOptions, PromptLookupOptions, read_options
from specdec.integrations.vllm_runner import LogitsTap, RunnerView, root_rows
from specdec.proposers.logitspec.chain import retrieve_chain
from specdec.proposers.logitspec.learn import MAX_HEAT, learn_retrieval, uninformative_prior
from specdec.proposers.logitspec.retrieval import Retrieval
from specdec.proposers.ngram_index import NGramIndex
from specdec.proposers.pld import cut_after_eos

__all__ = ["LogitSpecProposer", "PromptLookupProposer"]

logger = logging.getLogger(__name__)
NO_LOGITS = torch.empty(0)  # [0]: retrieval without candidates


@dataclass
class RequestState:
    """One request's drafting state: its n-gram index, and LogitSpec's last retrieval to learn from."""

    index: NGramIndex
    retrieval: Retrieval | None = None
    heat: int = 0  # drafts accepted at the previous step, capped at MAX_HEAT (keys the root rates)


def eos_token_ids(model_config: Any) -> frozenset[int]:
    """End-of-sequence ids of vLLM's model config and generation config (empty if neither says)."""
    sources = [getattr(getattr(model_config, "hf_config", None), "eos_token_id", None)]
    try:
        sources.append(model_config.try_get_generation_config().get("eos_token_id"))
    except Exception:  # an optional file: no generation config means no extra ids
        pass
    ids: set[int] = set()
    for source in sources:
        if source is not None:
            ids.update(int(t) for t in ([source] if isinstance(source, int) else source))
    return frozenset(ids)


class _SpecdecProposer:
    """What both proposers share: per-request indices, the runner view, counters, the never-raise guard."""

    def __init__(self, vllm_config: Any, max_ngram: int, prefer: str) -> None:
        self.max_drafts = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.eos_token_ids = eos_token_ids(vllm_config.model_config)
        self.max_ngram, self.prefer = max_ngram, prefer
        self.runner: RunnerView | None = None
        self.requests: dict[Hashable, RequestState] = {}
        # propose_s: wall seconds inside `propose`, to tell our per-step cost from vLLM's own
        self.counters = {"steps": 0, "drafted": 0, "accepted": 0, "errors": 0, "propose_s": 0.0}
        self._warned: set[str] = set()
        self._last_end: float | None = None  # when `propose` last returned: the time since is the engine's step

    def load_model(self, target_model: torch.nn.Module) -> None:
        self.runner = RunnerView.find(self)
        if self.runner is None:
            self._warn("runner", "vLLM's model runner not found: per-request state is keyed by batch row")

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: np.ndarray,  # [max_num_reqs] int32: tokens per row, this step's included
        token_ids_cpu: np.ndarray,  # [max_num_reqs, max_model_len] int32: each row's tokens
        slot_mappings: Any = None,  # unused: drafting reads tokens only
    ) -> list[list[int]]:
        """One draft chain per batch row ([] for none); never raises."""
        start = time.perf_counter()
        try:
            return self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        except Exception:
            self.counters["errors"] += 1
            if "error" not in self._warned:
                self._warned.add("error")
                logger.exception("specdec proposer failed; no drafts this step (logged once)")
            return [[] for _ in sampled_token_ids]
        finally:
            self._last_end = time.perf_counter()
            self.counters["propose_s"] += self._last_end - start

    def _propose(
        self, sampled: Sequence[Sequence[int]], num_tokens: np.ndarray, token_ids: np.ndarray
    ) -> list[list[int]]:
        num_rows = len(sampled)
        keys: list[Hashable] = list(self.runner.req_ids(num_rows)) if self.runner else list(range(num_rows))
        self._forget(keys, num_rows)
        self._begin_step(sampled, keys)
        self.counters["steps"] += 1
        drafts: list[list[int]] = []
        for row in range(num_rows):
            emitted, total = list(sampled[row]), int(num_tokens[row])
            room = min(self.max_drafts, self.max_model_len - total)
            if not emitted or total < 2 or room <= 0:
                drafts.append([])
                continue
            state = self._synced(keys[row], token_ids[row], total)
            draft = cut_after_eos(self._draft(state, row, emitted, room), self.eos_token_ids)
            self.counters["accepted"] += len(emitted) - 1
            self.counters["drafted"] += len(draft)
            drafts.append(draft)
        return drafts

    def _forget(self, keys: list[Hashable], num_rows: int) -> None:
        """Drop the state of requests that left (by row: of rows past the batch)."""
        live: set[Hashable] = set(self.runner.live()) if self.runner else set(range(num_rows))
        live.update(keys)
        for key in [key for key in self.requests if key not in live]:
            del self.requests[key]

    def _synced(self, key: Hashable, row_tokens: np.ndarray, total: int) -> RequestState:
        """The request's state, its index extended by the tokens it has not seen (a fresh one for a new sequence)."""
        state = self.requests.get(key)
        if state is not None:
            seen = len(state.index)
            tokens = state.index.tokens
            if seen > total or (seen and (tokens[0] != row_tokens[0] or tokens[seen - 1] != row_tokens[seen - 1])):
                state = None
        if state is None:
            state = self.requests[key] = RequestState(NGramIndex(self.max_ngram, self.prefer))
        seen = len(state.index)
        if seen < total:
            state.index.extend(row_tokens[seen:total].tolist())
        return state

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("%s (logged once)", message)

    def _begin_step(self, sampled: Sequence[Sequence[int]], keys: list[Hashable]) -> None:
        """Per-step preparation before the rows are drafted (LogitSpec: the step's price, the logits rows)."""

    def _draft(self, state: RequestState, row: int, emitted: list[int], room: int) -> list[int]:
        raise NotImplementedError


class PromptLookupProposer(_SpecdecProposer):
    """Prompt lookup: the continuation of the longest earlier match of the context's last n-gram."""

    def __init__(self, vllm_config: Any) -> None:
        self.options: PromptLookupOptions = read_options(PromptLookupOptions)
        super().__init__(vllm_config, self.options.max_ngram, self.options.prefer)

    def _draft(self, state: RequestState, row: int, emitted: list[int], room: int) -> list[int]:
        return state.index.lookup(state.index.tokens, room, self.options.min_ngram)


class LogitSpecProposer(_SpecdecProposer):
    """LogitSpec in chain mode: the most promising of the root's and the next-next candidates' branches."""

    def __init__(self, vllm_config: Any) -> None:
        self.options: LogitSpecOptions = read_options(LogitSpecOptions)
        super().__init__(vllm_config, self.options.max_ngram, self.options.prefer)
        self.stats = AcceptanceStats(uninformative_prior(self.options.k))
        self.tap: LogitsTap | None = None
        self.counters.update(layout_checked=0, layout_mismatched=0, layout_missing=0)
        self.counters.update(cost_steps=0, priced_steps=0, price_sum=0.0)  # price_sum / priced_steps: mean price
        self._rows: dict[int, torch.Tensor] = {}  # batch row -> [V] logits its last token was drawn from
        self.cost = StepCost()
        self._node_cost = self.options.node_cost  # this step's price of a draft token

    def load_model(self, target_model: torch.nn.Module) -> None:
        super().load_model(target_model)
        if self.runner is not None and self.options.k > 0:
            self.tap = LogitsTap(target_model)

    def _begin_step(self, sampled: Sequence[Sequence[int]], keys: list[Hashable]) -> None:
        self._rows = {}
        num_rows = len(sampled)
        num_drafts = self.runner.scheduled_drafts(num_rows) if self.runner else []
        self._price_step(sampled, keys, num_drafts)
        if self.tap is None or self.runner is None:
            return
        logits = self.tap.take(sum(num_drafts) + num_rows)  # [rows, V]
        if logits is None:
            self.counters["layout_missing"] += 1
            self._warn("missing", "no logits with vLLM's row layout this step: LogitSpec drafts without candidates")
            return
        rows = root_rows(num_drafts, [len(tokens) for tokens in sampled])
        batch_rows = [i for i, r in enumerate(rows) if r >= 0]
        if not batch_rows:
            return
        if logits.device.type == "cpu" and logits.dtype == torch.float32:
            picked = [logits[rows[i]] for i in batch_rows]  # views: copying [V] rows cost more than using them
        else:
            index = torch.tensor([rows[i] for i in batch_rows], device=logits.device)
            picked = list(logits.index_select(0, index).float().cpu())  # one copy off the accelerator
        self._rows = dict(zip(batch_rows, picked, strict=True))
        self._check_layout(batch_rows, picked, sampled)

    def _price_step(self, sampled: Sequence[Sequence[int]], keys: list[Hashable], num_drafts: list[int]) -> None:
        """Time the step just run into `self.cost` (pure decode steps only) and set this step's draft price."""
        decode_only = all(sampled) and all(key in self.requests for key in keys)  # no prefill, no new request
        if self.runner is not None and self._last_end is not None and decode_only:
            seconds = time.perf_counter() - self._last_end
            self.cost.observe(sum(num_drafts) + len(keys), seconds, sum(len(tokens) for tokens in sampled))
            self.counters["cost_steps"] = self.cost.steps
        price = self.cost.price() if self.options.measure_cost else None
        self._node_cost = self.options.node_cost if price is None else price
        if price is not None:
            self.counters["priced_steps"] += 1
            self.counters["price_sum"] += price

    def _check_layout(
        self, batch_rows: list[int], picked: list[torch.Tensor], sampled: Sequence[Sequence[int]]
    ) -> None:
        """For greedy requests, the token vLLM emitted must be a maximum of the row; count rows where it is not.

        (A maximum, not the argmax: ties are the argmax's to break; and a max costs several times less.)
        """
        greedy = self.runner.greedy() if self.runner else set()
        req_ids = self.runner.req_ids(len(sampled)) if self.runner else []
        for row, logits in zip(batch_rows, picked, strict=True):
            if req_ids[row] in greedy:
                self.counters["layout_checked"] += 1
                if logits[sampled[row][-1]] < logits.max():
                    self.counters["layout_mismatched"] += 1
                    self._warn("layout", "a greedy request's logits row disagrees with its token: vLLM's layout changed?")

    def _draft(self, state: RequestState, row: int, emitted: list[int], room: int) -> list[int]:
        if state.retrieval is not None and emitted:
            learn_retrieval(self.stats, state.retrieval, state.heat, emitted)
        heat = min(len(emitted) - 1, MAX_HEAT)
        logits = self._rows.get(row)
        k = self.options.k if logits is not None else 0
        retrieval, chain = retrieve_chain(
            state.index, NO_LOGITS if logits is None else logits, k, room, self.stats, heat, self._node_cost
        )
        state.retrieval, state.heat = retrieval, heat
        return chain
