"""The draft module as it runs: its pass cost in parameters, an int8 copy, a last-row head, a head over fewer
token ids, the tokenizer check.

Why a module of its own: these decide what a draft *is* (which module runs, what
it costs, whether it may draft for this target at all), apart from how the
draft proposer builds and schedules its chains (`specdec.proposers.draft`); the
layer-skipping draft and the server's draft preparation use them too.

Invariants: nothing here changes the caller's module (the int8 copy is a deep
copy, the cut head's view a copy sharing its tensors); a draft never needs more
than its last position's logits.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from specdec.backends.registry import block_head_rows, separable_head

AUTO_INT8_PARAMS = 300e6  # `compute_params` from which `quantize=auto` picks int8 on CPU
# A transformers decoder layer costs some fixed Python/dispatch time on top of its
# matmuls; on a CPU (fp32, 1 token) that is about as much as 2M parameters' worth.
LAYER_OVERHEAD_PARAMS = 2_000_000
SAMPLE_SIZE = 512  # token -> id pairs compared between tokenizers


class TokenizerMismatchError(ValueError):
    """The draft model's tokenizer does not map tokens to the same ids as the target's."""


def compute_params(model: torch.nn.Module, num_layers: int | None = None) -> float:
    """Cost of one 1-token pass in parameter units: matmul weights plus a per-layer overhead.

    The input embedding is a lookup, not a matmul, so it counts only when it is tied to
    the output head (then it *is* the head). `num_layers` defaults to the config's.
    """
    total = sum(p.numel() for p in model.parameters())  # shared (tied) tensors count once
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None or head.weight is not embedding:
        total -= embedding.numel()
    layers = model.config.num_hidden_layers if num_layers is None else num_layers
    return float(total + LAYER_OVERHEAD_PARAMS * layers)


def check_same_tokenizer(draft_tokenizer, target_tokenizer, draft_name: str = "the draft") -> None:
    """Raise TokenizerMismatchError unless both tokenizers have the same size and token -> id map.

    Compares the sizes and an evenly spaced sample of SAMPLE_SIZE vocabulary entries
    (plus the special tokens), which catches a different tokenizer in practice while
    staying cheap for 150k-entry vocabularies.
    """
    draft_size, target_size = len(draft_tokenizer), len(target_tokenizer)
    if draft_size != target_size:
        raise TokenizerMismatchError(
            f"{draft_name} has a tokenizer of {draft_size} tokens but the target's has {target_size}: "
            "a draft model must share the target's tokenizer"
        )
    draft_vocab, target_vocab = draft_tokenizer.get_vocab(), target_tokenizer.get_vocab()
    entries = sorted(target_vocab.items(), key=lambda item: item[1])
    step = max(1, len(entries) // SAMPLE_SIZE)
    sample = entries[::step] + [(t, target_vocab[t]) for t in target_tokenizer.all_special_tokens]
    for token, token_id in sample:
        if draft_vocab.get(token) != token_id:
            raise TokenizerMismatchError(
                f"{draft_name}'s tokenizer maps {token!r} to {draft_vocab.get(token)} but the target's "
                f"maps it to {token_id}: a draft model must share the target's tokenizer"
            )


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """A float32 copy of `model` with dynamic int8 Linear layers (weights int8, activations quantized per pass).

    Only ever applied to a *draft*: its guesses get a little worse, the output stays
    lossless because the target verifies every token. CPU only (fbgemm / onednn kernels).
    The dynamic int8 kernels take float32 activations only, so a bf16 draft (the target's
    dtype) is copied to float32 first; the rest of the draft (embeddings, norms,
    attention) then runs in float32 too; even so, an int8 draft pass of Qwen2.5-Coder-0.5B
    costs about a third of its bf16 pass on a CPU.
    """
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("quantize=int8 runs on CPU only")
    model = copy.deepcopy(model).float()  # the caller's module (maybe the target itself) stays as it was
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)


def with_head_rows(model: torch.nn.Module, rows: int) -> torch.nn.Module:
    """A copy of `model` (its tensors shared) whose head scores the first `rows` token ids only.

    Why: a draft's pass reads its whole head, and a large vocabulary's head is a large part of a
    small draft (Qwen2.5-Coder-0.5B: 152k x 896 of its ~0.5B weights). Byte-level BPE numbers its
    tokens in merge order, the commonest first, so the first ids hold most of what a draft is asked
    to guess (FR-Spec, Zhao et al. 2025, ranks by counted frequency instead). Lossless whatever is cut:
    the target verifies every token; a token the draft cannot score is one it does not propose.
    Takes a head of 8-bit blocks (`Q8Linear`, `Q6Linear`: their rows as they are, rounded up to a whole group
    of `q4_i8.GROUP`, so a Q8_0 head's rows keep their bits: `block_head_rows`) or a `torch.nn.Linear`.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise ValueError("vocab: the draft has no output head to cut")
    if not 0 < rows <= head.out_features:
        raise ValueError(f"vocab: {rows} token ids, the draft's head scores {head.out_features}")
    if hasattr(head, "blocks"):  # 8-bit blocks: whole groups of rows keep the 8-bit activations' form
        cut = block_head_rows(head, rows)
    elif type(head) is torch.nn.Linear:
        bias = None if head.bias is None else head.bias[:rows]
        cut = torch.nn.Linear(head.in_features, rows, bias is not None, device=head.weight.device,
                              dtype=head.weight.dtype)
        cut.weight = torch.nn.Parameter(head.weight[:rows], requires_grad=False)
        if bias is not None:
            cut.bias = torch.nn.Parameter(bias, requires_grad=False)
    else:
        raise ValueError(f"vocab: a draft head of type {type(head).__name__} cannot be cut (8-bit blocks or a "
                         "Linear can); leave vocab out")
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    view = copy.deepcopy(model, tensors)  # modules copied, tensors shared: the caller's model keeps its head
    view.set_output_embeddings(cut)
    return view


def wants_int8(quantize: str, draft_model: torch.nn.Module, min_params: float = AUTO_INT8_PARAMS) -> bool:
    """Whether the draft runs with int8 Linear layers: asked for, or `auto` with a large draft on CPU."""
    if quantize != "auto":
        return quantize == "int8"
    on_cpu = next(draft_model.parameters()).device.type == "cpu"
    return on_cpu and compute_params(draft_model) >= min_params


def last_row_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(decoder, output head) when the last position's logits may be computed as head(decoder(...)[:, -1:]).

    Why not transformers' own `logits_to_keep=1`: see `last_logits`.
    """
    if not hasattr(model, "get_decoder"):
        return None
    head = separable_head(model)  # a Linear or packed head applied to the decoder's last hidden state
    return None if head is None else (model.get_decoder(), head)


def last_logits(head: torch.nn.Module, hidden: torch.Tensor, rows: int = 1) -> torch.Tensor:
    """hidden [B, T, H] -> the last `rows` positions' logits [B, rows, V], the head over at least two rows.

    Why two: in bf16 on an AVX-512 CPU, the head's product over a single row of a multi-token pass
    took tens of times longer than over two rows (Qwen2.5-Coder-0.5B, a 152k vocabulary);
    transformers' `logits_to_keep=1` takes the one-row path, so every draft catch-up and draft
    prompt paid it (the target's own prefill measured no different, so it keeps transformers' path).
    Used for drafts only: the kept row may differ from a one-row product in its last bits, and
    drafts are guesses that verification keeps lossless.
    """
    return head(hidden[:, -max(rows, 2) :])[:, -rows:]


class LastLogitsOnly(torch.nn.Module):
    """A causal LM that returns only its last position's logits (a draft never needs the others).

    Saves the output head over every prompt position when the draft reads the prompt. Where the
    model allows it, the head runs on the decoder's last rows itself (`last_logits`:
    transformers' `logits_to_keep=1` is the slow one-row product in bf16).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.config = model.config
        self._last_row = last_row_head(model)
        self.rows = 1  # last positions whose logits a pass returns (`keeping`)

    @contextmanager
    def keeping(self, rows: int) -> Iterator[None]:
        """Passes inside return their last `rows` positions' logits (a draft checking a copied span)."""
        self.rows = rows
        try:
            yield
        finally:
            self.rows = 1

    def forward(self, **kwargs):
        kwargs.pop("logits_to_keep", None)
        if self._last_row is None:
            return self.model(**kwargs, logits_to_keep=self.rows)
        decoder, head = self._last_row
        return CausalLMOutputWithPast(logits=last_logits(head, decoder(**kwargs).last_hidden_state, self.rows))
