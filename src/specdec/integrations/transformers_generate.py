"""`model.generate(**inputs, custom_generate=specdec.decoder("logitspec"))`: specdec behind transformers' API.

Why this module exists: transformers 5's `GenerationMixin.generate` prepares the
inputs, the generation config, the logits processors, the stopping criteria and
the streamer, then hands its decoding loop to a `custom_generate` callable. A
transformers user who changes that one argument gets specdec's engine (every
method, rows of a left-padded batch decoded in one batch) and keeps the rest of
their call: the return value (a token tensor, or a `GenerateDecoderOnlyOutput`
with `return_dict_in_generate=True`, here with `stats` added), `max_new_tokens`,
`eos_token_id`, stopping criteria and `streamer=`.

Invariants:
- stopping is transformers': the engine runs with its own EOS check off and
  stops only at the token budget; every emitted token is handed, in order, to
  the prepared stopping criteria (with `scores=None`), and a row ends at the
  first token they flag. So `eos_token_id=`, `stop_strings=`, `max_time=` and
  user criteria act exactly as in plain generate, and finished rows are padded
  with the pad token as transformers pads them;
- a streamer sees what plain generate shows it: the prompt once, then every
  kept token in order, then `end()`. transformers 5 does not hand `streamer=`
  to a custom_generate callable (only the callable's own new arguments reach
  it), so the streamer is given to `specdec.decoder(..., streamer=s)` (and not
  to generate as well: generate puts the prompt into its own `streamer=`; a
  skip_prompt streamer that already saw it, `next_tokens_are_prompt` False, is
  not given it twice, but a streamer that prints prompts would print it twice);
- the only logits processors accepted are temperature, top-k and top-p (the
  acceptance rule samples from exactly that distribution); any other one is
  refused by name before anything runs, since acceptance against an unmodified
  target distribution would silently change the output;
- randomness comes from one `torch.Generator` per row, seeded by `seed=` (an
  int, the same for every row, as in `specdec.generate`), or from `generator=`
  (a `torch.Generator` the row seeds are drawn from), or else from torch's
  default RNG (so `torch.manual_seed` / `transformers.set_seed` before the call
  makes it reproducible): specdec never draws from a hidden global source;
- the model is wrapped as it is (`specdec.models.wrap`); its weights, dtype and
  device are never changed, and one decoder keeps one engine per model object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation import GenerateDecoderOnlyOutput
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specdec.engine.batch import Batch, Row
from specdec.engine.floor_store import remembered_floor
from specdec.engine.generation import GenerationConfig, GenerationStats
from specdec.engine.loop import Engine
from specdec.models import ModelLoadError, load_model
from specdec.proposers import make_config, parse_method
from specdec.sampling import SamplingParams

UNSUPPORTED_OUTPUTS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
SEED_LIMIT = 2**62


@dataclass
class SpecdecDecoderOnlyOutput(GenerateDecoderOnlyOutput):
    """transformers' output for `return_dict_in_generate=True`, with specdec's per-row statistics."""

    stats: list[GenerationStats] | None = None


@dataclass
class _Track:
    """What one row has handed to the caller: tokens kept after the stopping criteria, and whether it ended."""

    prompt: torch.Tensor  # [L] the row's (padded) input ids, as the stopping criteria see them
    kept: list[int]
    done: bool = False


def sampling_from(processors: LogitsProcessorList, do_sample: bool) -> tuple[float, int, float]:
    """(temperature, top_k, top_p) carried by the prepared processors; any other processor is refused."""
    temperature, top_k, top_p = 1.0, 0, 1.0
    refused = []
    for processor in processors:
        if isinstance(processor, TemperatureLogitsWarper):
            temperature *= float(processor.temperature)
        elif isinstance(processor, TopKLogitsWarper):
            top_k = int(processor.top_k)
        elif isinstance(processor, TopPLogitsWarper):
            top_p = float(processor.top_p)
        else:
            refused.append(type(processor).__name__)
    if refused:
        raise ValueError(
            "specdec's acceptance rule samples from the target distribution after temperature, top-k and "
            f"top-p only; these logits processors change it in a way it cannot carry: {', '.join(refused)}"
        )
    return (temperature if do_sample else 0.0), top_k, top_p


def row_seeds(num_rows: int, seed: int | None, generator: torch.Generator | None) -> list[int | None]:
    """One seed per row: `seed` for every row, else drawn from `generator`, else None (torch's default RNG)."""
    if seed is not None:
        return [int(seed)] * num_rows
    if generator is None:
        return [None] * num_rows
    draws = torch.randint(0, SEED_LIMIT, (num_rows,), generator=generator, device=generator.device)
    return [int(d) for d in draws.tolist()]


class SpecdecDecoder:
    """A `custom_generate` callable running one specdec method; make it with `specdec.decoder`."""

    def __init__(
        self,
        method: str = "logitspec",
        tokenizer: PreTrainedTokenizerBase | None = None,
        attention: str = "auto",
        pack: str = "auto",
        exact: str = "auto",
        streamer: Any = None,
        floor: bool = True,
        **options: Any,
    ) -> None:
        self.method_config = make_config(method, options) if options else parse_method(method)
        self.tokenizer = tokenizer
        self.attention = attention
        self.pack = pack
        self.exact = exact
        self.streamer = streamer
        self.floor = floor
        self._engine: Engine | None = None

    def engine_for(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> Engine:
        """The engine on `model` (made once per model object): the model wrapped as it is."""
        if self._engine is not None and self._engine.loaded.model is model:
            return self._engine
        tokenizer = tokenizer or self.tokenizer or _tokenizer_of(model)
        loaded = load_model(model, tokenizer=tokenizer, pack=self.pack, exact=self.exact)
        self._engine = Engine(loaded, attention=self.attention, floor=remembered_floor(loaded) if self.floor else None)
        return self._engine

    def __call__(
        self,
        model: PreTrainedModel,
        input_ids: torch.LongTensor,
        logits_processor: LogitsProcessorList,
        stopping_criteria: Any,
        generation_config: Any,
        synced_gpus: bool = False,
        streamer: Any = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        **model_kwargs: Any,
    ) -> torch.LongTensor | SpecdecDecoderOnlyOutput:
        """transformers' decoding-method contract (`GenerationMixin._sample`'s arguments), plus seed / generator."""
        streamer = streamer if streamer is not None else self.streamer
        _check_request(generation_config, input_ids, streamer)
        if streamer is not None and getattr(streamer, "next_tokens_are_prompt", True):
            streamer.put(input_ids.cpu())  # what generate puts first, unless it already did
        temperature, top_k, top_p = sampling_from(logits_processor, bool(generation_config.do_sample))
        engine = self.engine_for(model, getattr(streamer, "tokenizer", None))
        max_new_tokens = int(generation_config.max_length) - int(input_ids.shape[1])
        if max_new_tokens <= 0:
            return _result(generation_config, input_ids, [], [])
        prompts = _unpadded(input_ids, model_kwargs.get("attention_mask"))
        seeds = row_seeds(len(prompts), seed, generator)
        configs = [
            GenerationConfig(
                max_new_tokens=max_new_tokens,
                sampling=SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=row_seed),
                ignore_eos=True,  # EOS is a stopping criterion, checked below as transformers checks it
            )
            for row_seed in seeds
        ]
        tracks, rows = self._decode(engine, input_ids, prompts, configs, stopping_criteria, streamer)
        if streamer is not None:
            streamer.end()
        return _result(generation_config, input_ids, [t.kept for t in tracks], [r.stats for r in rows])

    def _decode(
        self,
        engine: Engine,
        input_ids: torch.Tensor,
        prompts: list[list[int]],
        configs: list[GenerationConfig],
        criteria: Any,
        streamer: Any,
    ) -> tuple[list[_Track], list[Row]]:
        """Every row in one batch, stepped until each has ended by its budget or the stopping criteria."""
        batch = engine.batch(costs=None, max_batch=len(prompts))
        rows = [batch.add(p, self.method_config.build(engine.loaded), c) for p, c in zip(prompts, configs, strict=True)]
        tracks = [_Track(prompt=input_ids[b], kept=[]) for b in range(len(rows))]
        while True:
            for row, track in zip(rows, tracks, strict=True):
                _settle(batch, row, track, criteria, streamer)
            if not batch.active:
                return tracks, rows
            batch.step()


def _settle(batch: Batch, row: Row, track: _Track, criteria: Any, streamer: Any) -> None:
    """Hand a row's newly emitted tokens to the stopping criteria (and the streamer); end it where they say."""
    if row.error is not None:
        raise row.error
    if track.done:
        return
    new = row.emitter.stream.token_ids[len(track.kept):]
    handed = []
    for token in new:
        track.kept.append(int(token))
        handed.append(int(token))
        kept = torch.tensor(track.kept, dtype=torch.long, device=track.prompt.device)
        ids = torch.cat([track.prompt, kept]).unsqueeze(0)
        if bool(criteria(ids, None)[0]):
            track.done = True
            break
    if handed and streamer is not None:
        streamer.put(torch.tensor(handed, dtype=torch.long))
    if track.done and not row.finished:
        batch.cancel(row)
    track.done = track.done or row.finished


def _check_request(generation_config: Any, input_ids: torch.Tensor, streamer: Any) -> None:
    """Refuse what this decoding loop does not produce, by name."""
    asked = [name for name in UNSUPPORTED_OUTPUTS if getattr(generation_config, name, False)]
    if asked:
        raise ValueError(f"specdec's custom_generate does not return {', '.join(asked)}; leave them off")
    if int(getattr(generation_config, "num_beams", 1) or 1) > 1:
        raise ValueError("specdec's custom_generate decodes without beam search (num_beams=1)")
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise ValueError("specdec's custom_generate needs input_ids of shape [batch, length > 0] (no inputs_embeds)")
    if streamer is not None and input_ids.shape[0] > 1:
        raise ValueError("streamer= streams one sequence; pass a batch of one")


def _unpadded(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[int]]:
    """Each row's own tokens: left padding (where the attention mask is 0) removed."""
    if attention_mask is None:
        return [row.tolist() for row in input_ids]
    return [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask, strict=True)]


def _result(
    generation_config: Any, input_ids: torch.Tensor, new: list[list[int]], stats: list[GenerationStats]
) -> torch.LongTensor | SpecdecDecoderOnlyOutput:
    """The prompt with each row's new tokens, shorter rows padded as transformers pads finished rows."""
    width = max((len(tokens) for tokens in new), default=0)
    pad = getattr(generation_config, "_pad_token_tensor", None)
    pad_id = int(pad.flatten()[0]) if pad is not None else 0
    tail = torch.full((input_ids.shape[0], width), pad_id, dtype=torch.long)
    for b, tokens in enumerate(new):
        tail[b, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    sequences = torch.cat([input_ids, tail.to(input_ids.device)], dim=1)
    if getattr(generation_config, "return_dict_in_generate", False):
        return SpecdecDecoderOnlyOutput(sequences=sequences, stats=stats)
    return sequences


def _tokenizer_of(model: PreTrainedModel) -> PreTrainedTokenizerBase:
    """The tokenizer saved beside the model, for callers who gave none (`specdec.decoder(..., tokenizer=tok)`)."""
    source = getattr(model, "name_or_path", "")
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise ModelLoadError(
            f"no tokenizer found beside the model ({source!r}): pass it as specdec.decoder(method, tokenizer=tok)"
        ) from error


def decoder(method: str = "logitspec", **options: Any) -> SpecdecDecoder:
    """A `custom_generate` callable for `model.generate` running `method` (e.g. "logitspec", "pld:...").

    options: the method's options, plus `tokenizer=` (the model's tokenizer; else the one saved
    beside the model, or the streamer's), `streamer=` (a TextStreamer or TextIteratorStreamer: transformers
    does not pass generate's own `streamer=` to a custom_generate callable), `attention=`, `pack=`,
    `exact=` (as in `load_model`), `floor=` (True: a greedy request drafts only while drafting pays here,
    `specdec.engine.floor`; False: every step drafts as the method chose).
    """
    return SpecdecDecoder(method, **options)


__all__ = ["SpecdecDecoder", "SpecdecDecoderOnlyOutput", "decoder", "sampling_from"]
