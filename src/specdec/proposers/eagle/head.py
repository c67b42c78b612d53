"""An EAGLE-3 draft head: one decoder layer that reads the target's own hidden states.

Why: a head that sees the target's features (low, middle and high layers,
fused by one linear layer) predicts the target's next tokens far better than
n-gram retrieval on text that does not copy its context, at the cost of one
small layer per draft step (EAGLE-3, arXiv 2503.01840).

The module is the checkpoint layout vLLM and SGLang read for EAGLE-3 drafters
(`LlamaForCausalLMEagle3`): `fc` [H, 3H_t], `midlayer.{input_layernorm,
hidden_norm, self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.*}`,
`norm`, `lm_head` [V_d, H], `d2t` [V_d] (target id = draft id + d2t[draft id])
and `t2d` [V] (whether a target id is in the draft vocabulary). The token
embedding is the target's own, frozen and not saved.

One step, as vLLM computes it (`eagle3_step`):
    x = cat(input_layernorm(emb(token)), hidden_norm(h));  a = h + attn(x)
    p = a + mlp(post_attention_layernorm(a));  logits = lm_head(norm(p))
where h is fc(target features) for a committed position and the previous
step's p for a drafted one; p is also the next step's h.

Invariants: the aux layer ids index the target's hidden states as vLLM does
(id L = the input of decoder layer L, transformers' `hidden_states[L]`), and
are below the target's layer count; attention takes an explicit boolean mask
over the keys it is given (the head keeps no cache of its own: callers do).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    rotate_half,
)

from specdec.backends.registry import head_logits, on_blocks

ARCHITECTURE = "LlamaForCausalLMEagle3"
WEIGHTS_FILE = "model.safetensors"


class HeadError(ValueError):
    """A draft head that cannot serve this target: missing files, a vocabulary or size mismatch."""


def default_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """Low, middle and high layers, as vLLM picks them for a target without explicit ids."""
    return (2, num_layers // 2, num_layers - 3)


def target_fingerprint(embedding: torch.Tensor) -> float:
    """A number that tells one target's token embedding from another's of the same shape."""
    rows = embedding.detach()[:: max(1, embedding.shape[0] // 64)].float()
    return round(float(rows.abs().sum()), 2)


def trained_for(fingerprint: float, embedding: torch.Tensor) -> bool:
    """Whether a head whose config records `fingerprint` was trained for the model of `embedding`
    (up to the rounding of a bf16 or fp16 copy of the same weights)."""
    return abs(target_fingerprint(embedding) - fingerprint) <= 1e-3 * max(1.0, abs(fingerprint))


def head_config(target: LlamaConfig | object, layer_ids: tuple[int, ...], draft_vocab_size: int) -> LlamaConfig:
    """The draft layer's config: the target's attention and MLP shapes, one layer, a reduced vocabulary."""
    head_dim = getattr(target, "head_dim", None) or target.hidden_size // target.num_attention_heads
    config = LlamaConfig(
        vocab_size=target.vocab_size,
        hidden_size=target.hidden_size,
        intermediate_size=target.intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=target.num_attention_heads,
        num_key_value_heads=target.num_key_value_heads,
        head_dim=head_dim,
        rms_norm_eps=target.rms_norm_eps,
        max_position_embeddings=target.max_position_embeddings,
        hidden_act=getattr(target, "hidden_act", "silu"),
        tie_word_embeddings=False,
    )
    if getattr(target, "rope_parameters", None):
        config.rope_parameters = dict(target.rope_parameters)
    config.architectures = [ARCHITECTURE]
    config.draft_vocab_size = draft_vocab_size
    config.target_hidden_size = target.hidden_size
    config.eagle_config = {"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True}
    return config


class _Attention(torch.nn.Module):
    """Llama attention whose projections read [embedding, hidden] (2H wide), over given keys."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        hidden, heads, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = torch.nn.Linear(2 * hidden, heads * self.head_dim, bias=False)
        self.k_proj = torch.nn.Linear(2 * hidden, kv * self.head_dim, bias=False)
        self.v_proj = torch.nn.Linear(2 * hidden, kv * self.head_dim, bias=False)
        self.o_proj = torch.nn.Linear(heads * self.head_dim, hidden, bias=False)


class Eagle3Head(torch.nn.Module):
    """fc + one decoder layer + norm + draft-vocabulary head; `embed` is the target's (frozen)."""

    def __init__(self, config: LlamaConfig, embed: torch.nn.Embedding) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        layer_ids = config.eagle_config["eagle_aux_hidden_state_layer_ids"]
        self.layer_ids = tuple(int(i) for i in layer_ids)
        self.fc = torch.nn.Linear(len(layer_ids) * config.target_hidden_size, hidden, bias=False)
        self.midlayer = torch.nn.Module()
        self.midlayer.input_layernorm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.midlayer.hidden_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.midlayer.self_attn = _Attention(config)
        self.midlayer.post_attention_layernorm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.midlayer.mlp = LlamaMLP(config)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = torch.nn.Linear(hidden, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(config)
        self.embed = [embed]  # a list: the target owns it, so it is no submodule (not saved, not trained)

    @property
    def draft_ids(self) -> torch.Tensor:
        """[V_d] the target id of each draft id."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def set_vocab(self, target_ids: torch.Tensor) -> None:
        """Make `target_ids` (distinct, [V_d]) the draft vocabulary, in that order."""
        ids = target_ids.to(self.d2t.device, torch.int64)
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    @property
    def dtype(self) -> torch.dtype:
        """What the head computes in: its weights' dtype (its norms keep it on 8-bit blocks, `on_blocks`)."""
        return self.norm.weight.dtype

    def on_blocks(self) -> Eagle3Head:
        """Every product (fc, the layer's projections and MLP, the draft vocabulary's head) on 8-bit blocks
        where the backend's kernel runs (`registry.block_linear`), for drafting only: the drafts change a
        little, never the output (verification decides)."""
        return on_blocks(self)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [..., 3H_t] -> the head's hidden input [..., H]."""
        return self.fc(features.to(self.dtype))

    def qkv(
        self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, queries: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """hidden [B, T, H], tokens and positions [B, T] -> q [B, h, Q, d], k and v [B, kv, T, d] (rotated);
        queries: the last Q positions' queries only (a catch-up over a prompt reads the last one), else all T."""
        layer = self.midlayer
        emb = self.embed[0](tokens).to(hidden.dtype)
        x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(hidden)], dim=-1)
        attn = layer.self_attn
        shape = (*x.shape[:2], -1, attn.head_dim)
        first = 0 if queries is None else x.shape[1] - queries
        q = attn.q_proj(x[:, first:]).view(x.shape[0], x.shape[1] - first, -1, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(shape).transpose(1, 2)
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = (t.unsqueeze(1) for t in self.rotary(x, positions))  # [B, 1, T, d]
        k = k * cos + rotate_half(k) * sin  # transformers' apply_rotary_pos_emb, q on its own rows
        q = q * cos[:, :, first:] + rotate_half(q) * sin[:, :, first:]
        return q, k, v

    def finish(
        self, hidden: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attend q over (keys, values) under mask [B or 1, 1, T, K] (True = may attend), then the MLP:
        returns (logits over the draft vocabulary [B, T, V_d], p [B, T, H], the next step's hidden)."""
        layer = self.midlayer
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        out = out.transpose(1, 2).reshape(*hidden.shape[:2], -1)
        a = hidden + layer.self_attn.o_proj(out)
        p = a + layer.mlp(layer.post_attention_layernorm(a))
        normed = self.norm(p)
        flat = normed.reshape(-1, normed.shape[-1])
        lm = self.lm_head  # a Linear's few rows as W @ h.T (`head_logits`); blocks multiply as they are
        logits = (head_logits(lm.weight, flat) if isinstance(lm, torch.nn.Linear) else lm(flat)).view(*p.shape[:2], -1)
        return logits, p

    def state(self) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors, named as vLLM and SGLang read them."""
        skip = ("rotary.",)
        return {k: v.contiguous() for k, v in self.state_dict().items() if not k.startswith(skip)}


def save_head(
    head: Eagle3Head, folder: str | Path, dtype: torch.dtype = torch.bfloat16, extra: dict | None = None
) -> Path:
    """Write config.json and model.safetensors (floating tensors in `dtype`) into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in head.state().items()}
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    config = head.config.to_dict()
    # Readers that predate `rope_parameters` and `dtype` (speculators' converter) read these two.
    rope_theta = (config.get("rope_parameters") or {}).get("rope_theta")
    if rope_theta is not None:
        config["rope_theta"] = rope_theta
    config["torch_dtype"] = config["dtype"] = str(dtype).removeprefix("torch.")
    config.update(extra or {})
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return folder


def read_head_folder(folder: Path, kind: str) -> tuple[dict, Path]:
    """A head folder's parsed config.json and its weights file; HeadError naming `kind` if one is missing."""
    config_file, weights_file = folder / "config.json", folder / WEIGHTS_FILE
    for need in (config_file, weights_file):
        if not need.is_file():
            raise HeadError(f"{folder}: no {need.name} ({kind} folder holds config.json and {WEIGHTS_FILE})")
    return json.loads(config_file.read_text()), weights_file


def load_head(folder: str | Path, target: torch.nn.Module, dtype: torch.dtype | None = None) -> Eagle3Head:
    """Read a head in the EAGLE-3 layout for `target` (a transformers causal LM); HeadError if it
    cannot serve it."""
    folder = Path(folder)
    raw, weights_file = read_head_folder(folder, "an EAGLE-3 head")
    if ARCHITECTURE not in (raw.get("architectures") or []):
        raise HeadError(f"{folder}: config.json names {raw.get('architectures')}, not {ARCHITECTURE}")
    raw.setdefault("draft_vocab_size", raw.get("vocab_size"))
    raw.setdefault("target_hidden_size", raw.get("hidden_size"))
    eagle = raw.get("eagle_config") or {}
    tc = target.config
    layer_ids = eagle.get("eagle_aux_hidden_state_layer_ids") or raw.get("eagle_aux_hidden_state_layer_ids")
    eagle["eagle_aux_hidden_state_layer_ids"] = list(layer_ids or default_layer_ids(tc.num_hidden_layers))
    raw["eagle_config"] = eagle
    config = LlamaConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type")})
    config.architectures = [ARCHITECTURE]
    _check_fits(folder, config, raw, target)
    weights = load_file(str(weights_file))
    if "d2t" not in weights and config.draft_vocab_size != config.vocab_size:
        raise HeadError(f"{folder}: no d2t in {WEIGHTS_FILE}, but its draft vocabulary is reduced")
    head = Eagle3Head(config, target.get_input_embeddings())
    weights = {k.replace("layers.0.", "midlayer."): v for k, v in weights.items() if not k.startswith("embed_tokens")}
    if "t2d" not in weights:
        weights["t2d"] = torch.zeros(config.vocab_size, dtype=torch.bool)
        weights["t2d"][torch.arange(config.draft_vocab_size) + weights.get("d2t", 0)] = True
    weights.setdefault("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
    missing, unexpected = head.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.startswith("rotary.")]
    if missing or unexpected:
        raise HeadError(f"{folder}: tensors missing {missing}, unexpected {unexpected}")
    head.d2t, head.t2d = head.d2t.long(), head.t2d.bool()
    return head.to(dtype or target.dtype).eval().requires_grad_(False)


def _check_fits(folder: Path, config: LlamaConfig, raw: dict, target: torch.nn.Module) -> None:
    tc = target.config
    if config.vocab_size != tc.vocab_size:
        raise HeadError(f"{folder}: the head's vocabulary has {config.vocab_size} tokens, the target's {tc.vocab_size}")
    if config.target_hidden_size != tc.hidden_size or config.hidden_size != tc.hidden_size:
        raise HeadError(
            f"{folder}: the head reads hidden states of width {config.target_hidden_size}, the target's are "
            f"{tc.hidden_size}"
        )
    layer_ids = config.eagle_config["eagle_aux_hidden_state_layer_ids"]
    if not layer_ids or max(layer_ids) >= tc.num_hidden_layers or min(layer_ids) < 0:
        raise HeadError(f"{folder}: layer ids {layer_ids} do not fit a target of {tc.num_hidden_layers} layers")
    fingerprint = (raw.get("specdec") or {}).get("target_fingerprint")
    if fingerprint is not None:
        if not trained_for(fingerprint, target.get_input_embeddings().weight):
            name = (raw.get("specdec") or {}).get("target", "another model")
            raise HeadError(f"{folder}: this head was trained for {name}, not for the loaded model")
