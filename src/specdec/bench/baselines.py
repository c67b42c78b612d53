"""Reference baselines from transformers itself: greedy, prompt lookup and assisted `generate`.

Why: a speedup is only as honest as its baseline. Besides our own plain
decoding, the benchmark times transformers' `model.generate` on the very same
prompt ids: plain greedy (`hf-greedy`), prompt lookup decoding (`hf-pld`,
`prompt_lookup_num_tokens`) and assisted generation with a draft model
(`hf-assisted`). Greedy plain decoding of ours must be token-identical to
`hf-greedy` in fp32; the benchmark measures that instead of assuming it.

Invariants:
- the same EOS set as our engine (`LoadedModel.eos_token_ids`), the same
  max_new_tokens, greedy (`do_sample=False`) at temperature 0; at temperature
  > 0 transformers samples at that temperature with top-k and top-p off (as
  ours do), seeded with `torch.manual_seed(seed)` before each call;
- every generation setting that could change the output (repetition penalty,
  min length, top-k, ...) is pinned explicitly, so a model's own
  generation_config cannot make `hf-greedy` decode differently from ours;
- target forward passes are counted with a forward pre-hook on the target
  module, registered just before the timed call and removed just after: one
  Python call per forward pass (microseconds against tens of milliseconds).
  The assistant's own forward passes are not counted (MAT is tokens per
  *target* decoding pass, the prefill left out as in our engine). Step-level details (accepted lengths, draft / verify time)
  are not visible from outside `generate`: they are None.
- `hf-assisted` keeps transformers' own adaptive state on the assistant
  (confidence threshold) across calls, as transformers does for any user.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import GenerationConfig

from specdec.bench.config import HfBaseline
from specdec.bench.records import RunResult, cut_at_eos
from specdec.models import LoadedModel

# Pinned so that the model's generation_config (filled in for unset fields) cannot change greedy output.
_NEUTRAL = {
    "num_beams": 1,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "min_new_tokens": 0,
    "length_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_eos_token_id": None,
    "forced_bos_token_id": None,
    "stop_strings": None,
}


class ForwardCounter:
    """Counts forward calls of one module while active (a pre-hook, registered only inside `counting`)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.count = 0

    def _hook(self, module: torch.nn.Module, args: Any) -> None:
        self.count += 1

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.count = 0
        handle = self.module.register_forward_pre_hook(self._hook)
        try:
            yield
        finally:
            handle.remove()


def generation_config(
    baseline: HfBaseline, loaded: LoadedModel, max_new_tokens: int, temperature: float
) -> GenerationConfig:
    eos = list(loaded.eos_token_ids)
    pad = loaded.tokenizer.pad_token_id
    settings: dict[str, Any] = dict(_NEUTRAL)
    settings.update(
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=pad if pad is not None else (eos[0] if eos else None),
        do_sample=temperature > 0,
    )
    if temperature > 0:
        settings.update(temperature=temperature, top_k=0, top_p=1.0)
    if baseline.name == "hf-pld":
        settings.update(prompt_lookup_num_tokens=baseline.num_tokens, max_matching_ngram_size=baseline.max_ngram)
    if baseline.name == "hf-assisted":
        settings.update(num_assistant_tokens=baseline.num_tokens, num_assistant_tokens_schedule="constant")
    return GenerationConfig(**settings)


class HfContender:
    """Runs one transformers baseline on prompt ids; `run` returns a RunResult."""

    def __init__(
        self,
        baseline: HfBaseline,
        loaded: LoadedModel,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        assistant: LoadedModel | None = None,
    ) -> None:
        if baseline.name == "hf-assisted" and assistant is None:
            raise ValueError("hf-assisted needs an assistant model")
        if assistant is not None and len(assistant.tokenizer) != len(loaded.tokenizer):
            raise ValueError(
                f"the draft model {assistant.name!r} has a different tokenizer ({len(assistant.tokenizer)} "
                f"tokens) than the target ({len(loaded.tokenizer)}): hf-assisted needs a shared vocabulary"
            )
        self.baseline = baseline
        self.loaded = loaded
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.seed = seed
        self.assistant = assistant if baseline.name == "hf-assisted" else None
        self.config = generation_config(baseline, loaded, max_new_tokens, temperature)
        self.counter = ForwardCounter(loaded.model)

    def run(self, prompt_ids: list[int]) -> RunResult:
        model = self.loaded.model
        input_ids = torch.tensor([prompt_ids], dtype=torch.int64, device=model.device)
        attention_mask = torch.ones_like(input_ids)
        extra = {"assistant_model": self.assistant.model} if self.assistant is not None else {}
        if self.temperature > 0:
            torch.manual_seed(self.seed)
        with self.counter.counting(), torch.inference_mode():
            start = time.perf_counter()
            output = model.generate(
                input_ids=input_ids, attention_mask=attention_mask, generation_config=self.config, **extra
            )
            wall = time.perf_counter() - start
        new_ids, hit_eos = cut_at_eos(output[0, len(prompt_ids) :].tolist(), self.loaded.eos_token_ids,
                                      self.max_new_tokens)
        text = self.loaded.tokenizer.decode(new_ids, skip_special_tokens=True)
        return RunResult(
            token_ids=new_ids,
            text=text,
            num_prompt_tokens=len(prompt_ids),
            wall_time_s=wall,
            finish_reason="stop" if hit_eos else "length",
            num_forward_passes=self.counter.count,
        )
