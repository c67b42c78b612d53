"""What a vLLM proposer reads from vLLM's model runner: request ids, the logits row layout, the logits.

Why: vLLM 0.32 calls a `custom_class` proposer as
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)`,
one entry per *batch row*, and passes no request ids and no logits. But rows
move between steps (requests finish, join, are reordered), per-request state
(an n-gram index) must follow the request, and LogitSpec needs, per request, the
logits its last token was drawn from. Both are in the runner that owns the
proposer; every read of vLLM internals is here, so a vLLM upgrade touches one file
and the tests in tests_vllm/ fail loudly when it changes.

Facts relied on (vLLM 0.32, `GPUModelRunner`, which the CPU runner extends):
- the runner holds the proposer as `runner.drafter` and calls
  `drafter.load_model(runner.model)` from its own `load_model`;
- `runner.input_batch.req_ids[i]` is the request in batch row i, and
  `runner.input_batch.spec_token_ids[i]` the drafts scheduled for it this step;
  `runner.input_batch.greedy_reqs` the greedy requests; `runner.requests` the live ones;
- the step's logits come from one `model.compute_logits(hidden)` call whose
  rows are, batch row by batch row, `num_drafts + 1` rows: the logits at each
  draft position, then the bonus position (`_calc_spec_decode_metadata`;
  without drafts one row per request). A request that emitted `a + 1` tokens
  drew its last one from its row `a`.

Invariants: nothing here writes to vLLM's state; the logits tap keeps references
to the last few logits tensors, never copies, and returns the target model's
output unchanged; any lookup that fails returns None, so the caller can fall
back (rows as keys, no candidates) instead of failing a serving step.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Sequence
from typing import Any

import torch

MAX_FRAMES = 12  # how far up the call stack `find` looks for the runner
KEEP_LOGITS = 4  # logits tensors kept between two propose calls (profiling and prompt-logprob calls too)


class RunnerView:
    """Read-only view of the vLLM model runner that owns a proposer."""

    def __init__(self, runner: Any) -> None:
        self._runner = runner

    @staticmethod
    def find(drafter: object) -> RunnerView | None:
        """The runner whose `drafter` is `drafter`, found among the callers of `drafter.load_model`.

        vLLM hands `load_model` only the target model; the runner calling it is the
        frame's `self` a few frames up. None if no caller owns `drafter`.
        """
        frame = sys._getframe(1)
        for _ in range(MAX_FRAMES):
            if frame is None:
                return None
            owner = frame.f_locals.get("self")
            if getattr(owner, "drafter", None) is drafter and hasattr(owner, "input_batch"):
                return RunnerView(owner)
            frame = frame.f_back
        return None

    def req_ids(self, num_rows: int) -> list[str]:
        """The request id in each of the first `num_rows` batch rows."""
        return list(self._runner.input_batch.req_ids[:num_rows])

    def scheduled_drafts(self, num_rows: int) -> list[int]:
        """How many draft tokens each batch row verified this step."""
        return [len(drafts) for drafts in self._runner.input_batch.spec_token_ids[:num_rows]]

    def greedy(self) -> set[str]:
        return set(self._runner.input_batch.greedy_reqs)

    def live(self) -> set[str]:
        """Requests the runner still holds (running or paused); a state of any other can go."""
        return set(self._runner.requests)


class LogitsTap:
    """Wraps a model's `compute_logits` and keeps references to the logits of its last few calls."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._recent: deque[torch.Tensor] = deque(maxlen=KEEP_LOGITS)
        original = model.compute_logits
        recent = self._recent

        def compute_logits(*args: Any, **kwargs: Any) -> Any:
            logits = original(*args, **kwargs)
            if isinstance(logits, torch.Tensor) and logits.dim() == 2:
                recent.append(logits)
            return logits

        model.compute_logits = compute_logits

    def take(self, num_rows: int) -> torch.Tensor | None:
        """[num_rows, V]: the latest logits with exactly `num_rows` rows since the last take, or None.

        The latest: profiling runs come before a step's sampling call; a prompt-logprobs
        call after it would only be taken if it had exactly as many rows.
        """
        found = next((logits for logits in reversed(self._recent) if logits.shape[0] == num_rows), None)
        self._recent.clear()
        return found


def root_rows(num_drafts: Sequence[int], num_emitted: Sequence[int]) -> list[int]:
    """Per batch row, the logits row its last emitted token was drawn from; -1 where it emitted none.

    num_drafts[i]: drafts row i verified this step; num_emitted[i]: tokens it emitted
    (accepted drafts + 1, or 0 for a partial prefill). vLLM's layout: num_drafts[i] + 1 rows each.
    """
    rows, offset = [], 0
    for drafts, emitted in zip(num_drafts, num_emitted, strict=True):
        rows.append(offset + emitted - 1 if 0 < emitted <= drafts + 1 else -1)
        offset += drafts + 1
    return rows
