"""Self-speculative decoding by layer skipping (Zhang et al., ACL 2024, "Draft & Verify").

Why: a draft model costs memory and must share the tokenizer; the target itself
with some decoder layers skipped is a free draft that always does. The draft is
`SkipLayerModel`, a thin module holding *references* to the target's own
embeddings, kept decoder layers, final norm, rotary embedding and output head:
no weight is copied. It runs those submodules in its own small forward with its
own `DynamicCache`, and drafting is the `draft` method's chain machinery
(`DraftProposer`: own KV cache rolled back each step, adaptive length).

Invariants:
- a decoder layer writes its KV entries at its own `layer_idx` in the cache, so
  the draft cache has the target's layer count with the skipped layers' slots
  left empty; the past length is read from the first kept layer;
- positions and the causal mask are built here (explicit `position_ids`, an
  explicit additive mask for multi-token feeds): a cache with empty slots must
  never be asked for its length by transformers' mask helpers;
- only the last position's logits are computed (the draft needs no others);
- the target's weights and its KV cache are never modified.

The paper skips attention and MLP sublayers separately, chosen by Bayesian
optimisation over hundreds of evaluations on a GPU. Here whole decoder layers
are skipped and the choice is a short deterministic search on this machine
(`calibrate`):
1. generate a greedy continuation of two built-in calibration prompts with the
   full model (the text the draft will be asked to predict);
2. for a skip set S, one teacher-forced pass of the draft over that text gives,
   at every continuation position, whether its argmax equals the target's; from
   that agreement sequence the greedy chain decoding is *simulated exactly* for
   each fixed k, and S is scored by the best tokens-per-cost over k, with cost =
   1 target pass + k draft passes (parameter-count ratio, see
   `draft_module.compute_params`) + k verified tokens;
3. score each layer skipped alone, then skip layers cumulatively from the least
   to the most harmful one and keep the best-scoring prefix of that order;
   when no prefix beats plain decoding the skip set is empty and the method
   decodes plainly (with a warning) rather than run a draft that only costs.
That is about 2 x num_layers draft passes (seconds for SmolLM2-135M in fp32 on
a CPU); the result is cached as JSON under `<cache>/layerskip/` keyed by
the model's name, dtype and layer count.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Literal

import torch
from transformers import DynamicCache

from specdec.backends.registry import sequence_runner, verify_model
from specdec.models import LoadedModel, default_cache_dir
from specdec.proposers.chain_length import SCHEDULES, ChainSettings
from specdec.proposers.draft import VERIFY_COST_PER_TOKEN, DraftProposer
from specdec.proposers.draft_module import LAYER_OVERHEAD_PARAMS, compute_params
from specdec.proposers.plain import PlainProposer
from specdec.proposers.schema import Preparation, method_config, option

CALIBRATION_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number, and explain how it works.",
    "Summarize the main causes of the French Revolution in a short paragraph.",
)
CALIBRATION_TOKENS = 48  # generated per calibration prompt
MAX_K_SIMULATED = 8
PATIENCE = 4  # stop growing the skip set after this many prefixes without a better score


class SkipLayerModel(torch.nn.Module):
    """The target with `skip` decoder layers left out, sharing every weight with it."""

    def __init__(self, model: torch.nn.Module, skip: tuple[int, ...]) -> None:
        super().__init__()
        layers = model.model.layers
        num_layers = model.config.num_hidden_layers
        self.layer_ids = [i for i in range(num_layers) if i not in set(skip)]
        if not self.layer_ids:
            raise ValueError("layerskip: at least one decoder layer must be kept")
        if any(not 0 <= i < num_layers for i in skip):
            raise ValueError(f"layerskip: layer indices must lie in [0, {num_layers})")
        self.config = model.config
        self.embed_tokens = model.model.embed_tokens
        self.layers = torch.nn.ModuleList([layers[i] for i in self.layer_ids])
        self.norm = model.model.norm
        self.rotary_emb = model.model.rotary_emb
        self.lm_head = model.lm_head

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: DynamicCache | None = None,
        use_cache: bool = True,
        all_logits: bool = False,
    ) -> SimpleNamespace:
        """input_ids [1, T] -> logits [1, 1, V] at the last position ([1, T, V] with all_logits)."""
        hidden = self.embed_tokens(input_ids)
        num_new = input_ids.shape[1]
        past = past_key_values.get_seq_length(self.layer_ids[0]) if past_key_values is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + num_new, device=hidden.device).unsqueeze(0)
        if attention_mask is None and num_new > 1:
            attention_mask = self._causal_mask(past, num_new, hidden)
        position_embeddings = self.rotary_emb(hidden, position_ids=position_ids)
        for layer in self.layers:
            hidden = layer(
                hidden,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=past_key_values,
                use_cache=use_cache,
                position_embeddings=position_embeddings,
            )
        if not all_logits:
            hidden = hidden[:, -1:]
        return SimpleNamespace(logits=self.lm_head(self.norm(hidden)))

    def _causal_mask(self, past: int, num_new: int, hidden: torch.Tensor) -> torch.Tensor:
        """[1, 1, T, past + T] additive mask: new token i sees the past and new tokens 0..i."""
        rows = torch.arange(num_new, device=hidden.device).unsqueeze(1)
        cols = torch.arange(past + num_new, device=hidden.device).unsqueeze(0)
        blocked = cols > rows + past
        mask = torch.zeros(num_new, past + num_new, dtype=hidden.dtype, device=hidden.device)
        return mask.masked_fill_(blocked, torch.finfo(hidden.dtype).min)[None, None]


def parse_skip(text: str) -> tuple[int, ...]:
    """"3,5,7" or "3+5+7" (method strings split on commas) -> (3, 5, 7); "" -> () (calibrate)."""
    parts = text.replace("+", ",").replace(";", ",").split(",")
    try:
        return tuple(sorted({int(part) for part in parts if part.strip()}))
    except ValueError:
        raise ValueError(f"layerskip: skip must be comma-separated layer indices, got {text!r}") from None


@method_config("layerskip")
class LayerSkipConfig:
    """Self-speculation: the target with some decoder layers skipped drafts for itself."""

    skip: str = ""  # layer indices, "4,6,8" or "4+6+8" (in method strings); "" = calibrate (cached)
    k: Annotated[int, option(ge=1, request_max=16)] = 3
    adaptive: Annotated[bool, option(request=True)] = True
    # see specdec.proposers.chain_length
    schedule: Annotated[Literal[SCHEDULES], option(request=True)] = "timed"
    max_k: Annotated[int, option(ge=1, request_max=16)] = 8
    verify_cost: Annotated[float, option(ge=0.0)] = VERIFY_COST_PER_TOKEN
    cache_dir: str = ""  # where calibration results are kept ("" = ~/.cache/specdec)

    def __post_init__(self) -> None:
        parse_skip(self.skip)
        ChainSettings(self.k, self.max_k, self.adaptive, self.schedule)  # k <= max_k

    def preparation(self) -> Preparation | None:
        """The calibrated skip set, when none is given."""
        if self.skip:
            return None

        def assemble(loaded: LoadedModel, skip: tuple[int, ...]) -> DraftProposer | PlainProposer:
            # Without a skip set (nothing paid off in the calibration) `build` reads the cached
            # calibration and decodes plainly.
            config = dataclasses.replace(self, skip="+".join(str(layer) for layer in skip)) if skip else self
            return config.build(loaded)

        return Preparation(
            ("calibration", self.cache_dir, self.verify_cost),
            lambda loaded: calibrated_skip(loaded, self.verify_cost, self.cache_dir or None),
            assemble,
            "layerskip needs a calibrated skip set, which this server did not prepare at startup "
            "(operator: specdec serve --method-config layerskip, or --method-config layerskip:skip=4+6+8)",
        )

    def build(self, loaded: LoadedModel) -> DraftProposer | PlainProposer:
        skip = parse_skip(self.skip)
        if not skip:
            skip = calibrated_skip(loaded, self.verify_cost, self.cache_dir or None)
        if not skip:
            # A draft that is nearly the whole model costs more than it saves (skipping SmolLM2-135M's
            # least harmful layer ran slower than plain decoding).
            warnings.warn(
                f"layerskip: no skip set pays off for {loaded.name} ({loaded.dtype}) per the calibration; "
                "decoding plainly (give skip=... to force one)",
                stacklevel=2,
            )
            return PlainProposer()
        view = SkipLayerModel(verify_model(loaded), skip)  # packed layers where the engine's are
        cost = cost_ratio(loaded.model, len(view.layer_ids)) + self.verify_cost
        settings = ChainSettings(self.k, self.max_k, self.adaptive, self.schedule, cost, self.verify_cost)
        proposer = DraftProposer(view, settings, loaded.model.config.vocab_size)
        proposer.draft_source = "layerskip"  # the target itself with layers skipped, not a draft model
        return proposer


def cost_ratio(model: torch.nn.Module, num_kept: int) -> float:
    """One draft pass over one target pass, from parameter counts (see draft_module.compute_params)."""
    skipped = model.config.num_hidden_layers - num_kept
    per_layer = sum(p.numel() for p in model.model.layers[0].parameters()) + LAYER_OVERHEAD_PARAMS
    full = compute_params(model)
    return (full - skipped * per_layer) / full


# ----------------------------------------------------------------- calibration
def _calibration_text(loaded: LoadedModel) -> list[tuple[list[int], int]]:
    """(prompt + greedy continuation of the full model, prompt length) per calibration prompt."""
    from specdec.prompts import encode_prompt

    chat = bool(getattr(loaded.tokenizer, "chat_template", None))
    target = sequence_runner(verify_model(loaded))  # the text the engine's own target would write
    texts = []
    for prompt in CALIBRATION_PROMPTS:
        ids = encode_prompt(loaded.tokenizer, prompt, chat=chat)
        tokens = list(ids)
        logits = target.prefill(ids)
        for _ in range(CALIBRATION_TOKENS):
            tokens.append(int(logits.argmax()))
            logits = target.append([tokens[-1]])[-1]
        texts.append((tokens, len(ids)))
    return texts


@torch.inference_mode()
def _agreement(model: torch.nn.Module, skip: tuple[int, ...], texts: list[tuple[list[int], int]]) -> list[bool]:
    """Per continuation position: does the draft's argmax equal the target's (the next token)?"""
    view = SkipLayerModel(model, skip)
    device = next(model.parameters()).device
    agree: list[bool] = []
    for tokens, start in texts:
        ids = torch.tensor([tokens], device=device)
        logits = view(ids, past_key_values=None, use_cache=False, all_logits=True).logits[0]
        guess = logits[start - 1 : -1].argmax(-1).tolist()
        agree.extend(g == t for g, t in zip(guess, tokens[start:], strict=True))
    return agree


def simulated_speedup(agree: list[bool], cost_per_draft: float, max_k: int = MAX_K_SIMULATED) -> float:
    """Tokens per unit cost of greedy chain decoding with the best fixed k (plain decoding = 1.0).

    agree[i]: the draft's guess for position i equals the target's. With a chain of k
    drafts from position i, the run of agreements (at most k) is accepted plus one target
    token; each step costs 1 (target pass) + k * cost_per_draft.
    """
    best = 1.0
    for k in range(1, max_k + 1):
        pos, steps = 0, 0
        while pos < len(agree):
            run = 0
            while run < k and pos + run < len(agree) and agree[pos + run]:
                run += 1
            pos += run + 1
            steps += 1
        best = max(best, len(agree) / (steps * (1 + k * cost_per_draft)))
    return best


def calibrate(loaded: LoadedModel, verify_cost: float = VERIFY_COST_PER_TOKEN) -> dict:
    """Search a skip set (see module docstring); returns {"skip": [...], "speedup": float, ...}."""
    model = loaded.model
    num_layers = model.config.num_hidden_layers
    texts = _calibration_text(loaded)

    def score(skip: tuple[int, ...]) -> float:
        cost = cost_ratio(model, num_layers - len(skip)) + verify_cost
        return simulated_speedup(_agreement(model, skip, texts), cost)

    harm = {layer: sum(_agreement(model, (layer,), texts)) for layer in range(num_layers)}
    order = sorted(range(num_layers), key=lambda layer: (-harm[layer], layer))
    best_skip: tuple[int, ...] = ()
    best_score, since_best = 1.0, 0
    for count in range(1, num_layers):
        skip = tuple(sorted(order[:count]))
        value = score(skip)
        if value > best_score:
            best_skip, best_score, since_best = skip, value, 0
        else:
            since_best += 1
            if since_best >= PATIENCE:
                break
    # Nothing pays off: an empty skip set, and the method decodes plainly (see LayerSkipConfig.build).
    return {"skip": list(best_skip), "speedup": best_score, "num_layers": num_layers}


def calibration_path(loaded: LoadedModel, cache_dir: str | Path | None) -> Path:
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in loaded.name)
    dtype = str(loaded.dtype).removeprefix("torch.")
    return root / "layerskip" / f"{safe}-{dtype}-{loaded.model.config.num_hidden_layers}.json"


def calibrated_skip(loaded: LoadedModel, verify_cost: float, cache_dir: str | Path | None) -> tuple[int, ...]:
    """The cached calibration result for this model, calibrating (and caching) first if there is none."""
    path = calibration_path(loaded, cache_dir)
    if path.is_file():
        try:
            saved = json.loads(path.read_text())
            # Older calibrations kept one layer even where nothing paid off (speedup 1.0).
            return tuple(saved["skip"]) if saved["speedup"] > 1.0 else ()
        except (ValueError, KeyError, TypeError):
            pass  # a damaged cache entry: calibrate again
    result = calibrate(loaded, verify_cost)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps(result))
    temp.replace(path)
    return tuple(result["skip"])
