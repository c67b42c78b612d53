"""Medusa-1 heads: one residual block and one vocabulary head per future position.

Why: the cheapest feature-level drafter there is (Medusa, arXiv 2401.10774).
Head i reads the target's last hidden state at position t (the state the
target's own head turned into token t + 1) and guesses token t + 2 + i; no
attention, no step-by-step drafting: all heads run at once on one row, so
drafting costs a few small products per step. Their guesses are independent of
one another, so the tree verified is a Cartesian product of each head's top-k,
pruned to what pays.

Layout (vLLM's Medusa reader, `MedusaConfig` / `Medusa.load_weights`):
config.json with `architectures: ["MedusaModel"]`, `model_type: "medusa"`,
`hidden_size`, `vocab_size` (the target's), `num_heads`, `num_hidden_layers`
(residual blocks per head), `truncated_vocab_size` (the draft vocabulary) and
`medusa_fc_bias: true`; model.safetensors with `blocks.{i}.layers.{j}.weight`
and `.bias`, `lm_heads.{i}.weight` [V_d, H] and `token_map` [V_d] (the target
id of each draft id).

Invariants: the feature read is transformers' `hidden_states[L]` for a target
of L layers (the final norm's output, the input of its own head), which is
what vLLM hands a Medusa drafter; a block is `x + silu(W x + b)`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from specdec.backends.registry import head_logits, on_blocks
from specdec.proposers.eagle import WEIGHTS_FILE, HeadError, read_head_folder, trained_for

ARCHITECTURE = "MedusaModel"
STEP_DECAY = 0.8  # head i's loss weighs 0.8^i, as in the Medusa paper


class _Block(torch.nn.Module):
    def __init__(self, hidden: int, layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden, bias=True) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + F.silu(layer(x))
        return x


class MedusaHeads(torch.nn.Module):
    """`num_heads` residual blocks, each with its own head over a draft vocabulary (`token_map`)."""

    architecture, model_type = ARCHITECTURE, "medusa"  # what config.json names (Hydra's subclass differs)

    def __init__(
        self, hidden: int, vocab_size: int, draft_vocab: int, num_heads: int, layer_id: int, num_layers: int = 1
    ) -> None:
        super().__init__()
        self.hidden_size, self.vocab_size, self.num_layers = hidden, vocab_size, num_layers
        self.layer_id = layer_id  # the target hidden state read: its layer count (the final norm's output)
        self.blocks = torch.nn.ModuleList(_Block(hidden, num_layers) for _ in range(num_heads))
        self.lm_heads = torch.nn.ModuleList(torch.nn.Linear(hidden, draft_vocab, bias=False) for _ in range(num_heads))
        self.register_buffer("token_map", torch.arange(draft_vocab, dtype=torch.int64))

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def bind(self, target: torch.nn.Module) -> None:
        """Attach what the heads read from the target besides its state (Medusa's: nothing)."""

    @property
    def dtype(self) -> torch.dtype:
        """What the heads compute in: their weights' dtype, fp32 once on 8-bit blocks (`on_blocks`)."""
        head = self.lm_heads[0]  # an isinstance test, not getattr: a Q8Linear's missing attribute raises
        return head.weight.dtype if isinstance(head, torch.nn.Linear) else torch.float32

    def on_blocks(self) -> MedusaHeads:
        """Every product on 8-bit blocks where the backend's kernel runs (`registry.block_linear`), for
        drafting only: the drafts change a little, never the output (verification decides)."""
        return on_blocks(self)

    def logits(self, hidden: torch.Tensor) -> list[torch.Tensor]:
        """hidden [..., H] -> per head, logits over the draft vocabulary [..., V_d]."""
        hidden = hidden.to(self.dtype)
        return [lm(block(hidden)) for block, lm in zip(self.blocks, self.lm_heads, strict=True)]

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """One row's state [H] -> [heads, V_d], as the `medusa` method calls it."""
        hidden = hidden.to(self.dtype)[None]
        return torch.cat([self.head_product(i, block(hidden)) for i, block in enumerate(self.blocks)])

    def head_product(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Head i's vocabulary product of x [rows, H]: few rows of a Linear as W @ x.T (`head_logits`)."""
        lm = self.lm_heads[i]
        return head_logits(lm.weight, x) if isinstance(lm, torch.nn.Linear) else lm(x)

    def config_dict(self) -> dict:
        return {
            "architectures": [self.architecture], "model_type": self.model_type, "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size, "num_heads": self.num_heads, "num_hidden_layers": self.num_layers,
            "truncated_vocab_size": int(self.token_map.numel()), "medusa_fc_bias": True,
        }


def medusa_loss(
    heads: MedusaHeads, labels: torch.Tensor, features: torch.Tensor, valid: torch.Tensor, to_draft: torch.Tensor
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Weighted loss of every head; per head (correct top-1, scored positions).

    labels[t] is the target's greedy token after position t, so head i at t is
    scored against labels[t + 1 + i]: the token after the one the target's own
    head gives at t.
    """
    return heads_loss(heads.logits(features), labels, valid, to_draft)


def heads_loss(
    logits: list[torch.Tensor], labels: torch.Tensor, valid: torch.Tensor, to_draft: torch.Tensor
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """logits[i] [B, T, V_d]: head i at every position, scored against labels[t + 1 + i] (see above)."""
    total, scores = 0.0, []
    for i, head_logits_i in enumerate(logits):
        shift = i + 1
        lab = torch.cat([labels[:, shift:], labels.new_zeros(labels.shape[0], shift)], dim=1)
        ok = torch.cat([valid[:, shift:], valid.new_zeros(valid.shape[0], shift)], dim=1)
        target = to_draft[lab].masked_fill(~ok, -100)  # labels outside the draft vocabulary: ignored
        scored = ok & (target >= 0)
        if scored.any():
            total = total + STEP_DECAY**i * F.cross_entropy(head_logits_i[scored].float(), target[scored])
        scores.append((int((head_logits_i.argmax(-1) == target)[ok].sum()), int(ok.sum())))
    return total, scores


def save_medusa(heads: MedusaHeads, folder: str | Path, dtype: torch.dtype = torch.bfloat16,
                extra: dict | None = None, full_vocab: bool = False) -> Path:
    """Write config.json and model.safetensors (floating tensors in `dtype`) into `folder`.

    full_vocab: write each head over the whole vocabulary (the draft rows in place, zeros elsewhere, no
    `token_map`), for readers that cannot take a reduced one: vLLM 0.32 allocates every Medusa head at
    the full vocabulary whatever `truncated_vocab_size` says. Tokens outside the draft vocabulary then
    get logit 0 rather than none, which changes a guess, never the output.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = heads.state_dict()
    config = heads.config_dict()
    if full_vocab:
        for i in range(heads.num_heads):
            name = f"lm_heads.{i}.weight"
            full = state[name].new_zeros(heads.vocab_size, heads.hidden_size)
            full[heads.token_map] = state[name]
            state[name] = full
        del state["token_map"]
        config["truncated_vocab_size"] = heads.vocab_size
    tensors = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in state.items()}
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    config |= {"torch_dtype": str(dtype).removeprefix("torch.")} | (extra or {})
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return folder


def load_medusa(
    folder: str | Path, target: torch.nn.Module, dtype: torch.dtype | None = None, kind: type = MedusaHeads
) -> MedusaHeads:
    """Read Medusa heads (or `kind`: Hydra's) for `target` (a transformers causal LM); HeadError if they
    cannot serve it."""
    folder = Path(folder)
    raw, weights_file = read_head_folder(folder, f"a {kind.model_type.capitalize()} head")
    if kind.architecture not in (raw.get("architectures") or []) and raw.get("model_type") != kind.model_type:
        raise HeadError(f"{folder}: config.json names {raw.get('architectures')}, not {kind.architecture}")
    tc = target.config
    if raw.get("vocab_size") != tc.vocab_size:
        raise HeadError(f"{folder}: the heads' vocabulary has {raw.get('vocab_size')} tokens, the target's "
                        f"{tc.vocab_size}")
    if raw.get("hidden_size") != tc.hidden_size:
        raise HeadError(f"{folder}: the heads read states of width {raw.get('hidden_size')}, the target's are "
                        f"{tc.hidden_size}")
    mine = raw.get("specdec") or {}
    if mine.get("target_fingerprint") is not None and not trained_for(
        mine["target_fingerprint"], target.get_input_embeddings().weight
    ):
        raise HeadError(f"{folder}: these heads were trained for {mine.get('target', 'another model')}, "
                        "not for the loaded model")
    weights = load_file(str(weights_file))
    draft_vocab = int(raw.get("truncated_vocab_size") or tc.vocab_size)
    if "token_map" not in weights:
        if draft_vocab != tc.vocab_size:
            raise HeadError(f"{folder}: no token_map in {WEIGHTS_FILE}, but its draft vocabulary is reduced")
        weights["token_map"] = torch.arange(draft_vocab)
    num_heads = raw.get("num_heads") or raw.get("medusa_num_heads")  # FasterDecoding's configs name it so
    if not num_heads:
        raise HeadError(f"{folder}: config.json has no num_heads")
    heads = kind(tc.hidden_size, tc.vocab_size, draft_vocab, int(num_heads), tc.num_hidden_layers,
                 int(raw.get("num_hidden_layers", 1)))
    heads.bind(target)
    weights = {_current_name(k): v for k, v in weights.items()}
    missing, unexpected = heads.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise HeadError(f"{folder}: tensors missing {missing}, unexpected {unexpected}")
    heads.token_map = heads.token_map.long()
    return heads.to(dtype or target.dtype).eval().requires_grad_(False)


def _current_name(name: str) -> str:
    """FasterDecoding's original names (`{head}.{layer}.linear.weight`, `{head}.{N}.weight`) as this
    layout's, like vLLM's reader does; other names unchanged."""
    name = name.removeprefix("medusa_heads.")
    parts = name.split(".")
    if len(parts) >= 3 and parts[0].isdigit() and parts[1].isdigit():
        if parts[2] == "linear":
            return f"blocks.{parts[0]}.layers.{parts[1]}.{'.'.join(parts[3:])}"
        return f"lm_heads.{parts[0]}.{'.'.join(parts[2:])}"
    return name
