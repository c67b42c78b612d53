"""The target model and its KV cache, seen as a machine that verifies token trees.

Why this exists: speculative decoding needs three things transformers does not
offer as one call: a forward pass over a *tree* of tokens below the cached
prefix, keeping the KV entries of the one accepted root-to-node path, and
dropping the rest. We get them from public transformers APIs only: an explicit
4-D additive attention mask (ancestor-or-self), explicit `position_ids`
(past length + depth), and a KV cache whose per-layer key/value tensors we
compact in place: a `specdec.backends.torch.kv_cache` cache, preallocated and written in place
(no per-step concatenation), kept across sequences. No model file is forked and
nothing is monkeypatched.

Invariants:
- the cache holds exactly the committed tokens: after `forward_tree` the tree's
  N entries sit after them until `commit` (or `trim`) settles which stay;
- `commit(path)` leaves the KV entries of `path` (root first) at contiguous
  positions, exactly as if those tokens had been fed one after another;
- only models whose transformers cache is made purely of `DynamicLayer`s (full
  attention) are accepted: a
  sliding-window or linear-attention layer cannot be compacted this way, so such
  models are refused up front with `UnsupportedModelError`.

The output head on CPU: for model types whose logits are exactly
`lm_head(final hidden state)` (FAST_HEAD_TYPES), in float32 on CPU, we run the
decoder and apply the head ourselves as `W @ h.T` (see `head_logits`): MKL's
`h @ W.T` packs the whole [V, H] weight for every call with 2+ rows, which made
a 2-to-16-row head cost twice a 1-row one; `W @ h.T` reads W once. The numbers are the same dot products
(summed in another order, so not bit-identical to transformers' own head).
Prefill computes the last position's logits only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from specdec.backends.torch.attention_plan import (
    INVARIANT,
    INVARIANT_PREFILL,
    MATERIALIZED_CHUNK,
    AttentionPlan,
)
from specdec.backends.torch.fused import FusedDecoder, KeySequences
from specdec.backends.torch.invariant import Layout, causal_allowed
from specdec.backends.torch.kv_cache import DEFAULT_CAPACITY, preallocated_cache
from specdec.models import UnsupportedModelError
from specdec.tree import DraftTree, ancestry

# Model types whose causal-LM forward is `logits = lm_head(decoder(...).last_hidden_state)`, with no
# scaling or soft-capping after the head: for these the head may be applied outside the model.
FAST_HEAD_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
TALL_SKINNY_ROWS = 32  # up to this many rows, W @ h.T beats h @ W.T on the CPUs we measured


def head_weight(model: torch.nn.Module) -> torch.Tensor | None:
    """The output head's weight [V, H] when `head_logits` may stand in for the model's head, else None."""
    if not hasattr(model, "get_decoder") or not hasattr(model, "get_output_embeddings"):
        return None  # not a transformers causal LM (e.g. a draft view): use its own forward
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if (
        model.config.model_type not in FAST_HEAD_TYPES
        or not isinstance(head, torch.nn.Linear)
        or head.bias is not None
        or weight.device.type != "cpu"
        or weight.dtype != torch.float32
    ):
        return None
    return weight


def head_logits(weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """weight [V, H], hidden [T, H] -> logits [T, V], computed as (W @ h.T).T for few rows.

    One row is doubled first: MKL's tall-skinny matrix product is faster than its
    matrix-vector one for this shape.
    """
    rows = hidden.shape[0]
    if rows > TALL_SKINNY_ROWS:
        return hidden @ weight.T
    if rows == 1:
        return (weight @ hidden.repeat(2, 1).T).T[:1]
    return (weight @ hidden.T).T


def _features(out: object, capture: Sequence[int]) -> torch.Tensor | None:
    """The captured hidden states of a transformers output, concatenated on the last axis."""
    return torch.cat([out.hidden_states[i] for i in capture], dim=-1) if capture else None


def _as_ids(token_ids: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    ids = torch.as_tensor(token_ids, dtype=torch.int64, device=device)
    return ids.reshape(-1)


class TargetModel:
    """A causal LM plus the KV cache of one sequence (batch size 1)."""

    def __init__(
        self, model: torch.nn.Module, capacity: int = DEFAULT_CAPACITY, attention: AttentionPlan | None = None
    ) -> None:
        """capacity: tokens the cache holds before its first doubling; attention: the implementation
        per pass shape (`specdec.backends.torch.attention`), None to keep the model's own."""
        self.model = model
        self.capacity = capacity
        self.attention = attention
        self.config = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self._check_cache_is_compactable()
        self._head = head_weight(model)
        self._decoder = model.get_decoder() if self._head is not None else None
        # Exact passes on 4-bit weights run their layers in C++ where they can (`fused`: one call a pass).
        self._fused = FusedDecoder.of(model) if attention is not None and attention.is_invariant else None
        self.cache: Cache | None = None
        self._num_committed = 0  # tokens whose KV entries are settled
        self._num_pending = 0  # tree entries after them, awaiting commit
        self._attention_checked: set[str] = set()  # implementations `attention_as` has had transformers check

    def _check_cache_is_compactable(self) -> None:
        probe = DynamicCache(config=self.config)
        kinds = {type(layer).__name__ for layer in probe.layers}
        if any(type(layer) is not DynamicLayer for layer in probe.layers):
            raise UnsupportedModelError(
                f"{self.config.model_type}: cache layers {sorted(kinds)} cannot be compacted after tree "
                "verification (sliding-window or linear attention); only full-attention models are supported"
            )
        self._num_layers = len(probe.layers)

    @property
    def num_layers(self) -> int:
        return self._num_layers

    @property
    def num_cached(self) -> int:
        """Committed tokens in the KV cache."""
        return self._num_committed

    @property
    def max_length(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 0) or 0)

    def reset(self) -> None:
        """Forget the sequence; the cache's buffers stay allocated for the next one."""
        if self.cache is None:
            self.cache = preallocated_cache(self._num_layers, self.capacity)
        else:
            self.cache.reset()
        self._num_committed = 0
        self._num_pending = 0

    @torch.inference_mode()
    def prefill(self, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Start a new sequence: run the prompt, return the last position's logits [V]."""
        ids = _as_ids(token_ids, self.device)
        if ids.numel() == 0:
            raise ValueError("cannot prefill an empty token sequence")
        self.reset()
        # An invariant plan's attention materializes its scores: chunks bound them, at no change of
        # bits (a node's arithmetic does not depend on the pass around it).
        chunk = MATERIALIZED_CHUNK if self.attention is not None and self.attention.is_invariant else ids.numel()
        for start in range(0, ids.numel(), chunk):
            piece = ids[start : start + chunk]
            logits = self._forward(piece, position_ids=None, attention_mask=None, last_only=True)
            self._num_committed += piece.numel()
        return logits[-1]

    @torch.inference_mode()
    def append(self, token_ids: Sequence[int] | torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Feed tokens after the cache and commit them all; returns their logits [T, V] (the last
        position's, [1, V], with last_only)."""
        ids = _as_ids(token_ids, self.device)
        logits = self._forward(ids, position_ids=None, attention_mask=None, last_only=last_only)
        self._num_committed += ids.numel()
        self._num_pending = 0
        return logits

    @property
    def runs_fused(self) -> bool:
        """Whether exact passes run the fused layer (`specdec.backends.torch.fused`): row-independent at any
        row count, so a one-token pass needs no padding row."""
        return self._fused is not None

    @torch.inference_mode()
    def forward_tree(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """One forward pass over a token tree below the cache; logits [N, V].

        tokens: [N] int64, parents: [N] int64 (parents[0] == -1, parents[i] < i).
        Logits at node i predict the token that follows the root-to-i path.
        """
        if self.cache is None:
            raise RuntimeError("prefill() must come before forward_tree()")
        if self._num_pending:
            raise RuntimeError("commit() or trim() the previous tree before verifying another")
        tokens = tokens.to(self.device)
        num_nodes = tokens.shape[0]
        past = self._num_committed
        is_chain = bool((parents == torch.arange(-1, num_nodes - 1)).all())
        if is_chain:
            # A chain is the ordinary causal case: let transformers build its own mask.
            logits = self._forward(tokens, position_ids=None, attention_mask=None)
        elif self._fused is not None:  # the fused pass reads each node's key sequence: no mask needed
            tree = DraftTree(tokens.cpu().long(), parents.cpu().long())
            keys = KeySequences.of_trees([tree], [past], num_nodes)
            position_ids = (past + tree.depths).to(self.device).unsqueeze(0)
            logits = self.run(tokens.unsqueeze(0), position_ids, None, self.cache, past, keys=keys)[0][0]
        else:
            mask, depths = ancestry(parents)
            position_ids = (past + depths).to(self.device).unsqueeze(0)
            logits = self._forward(tokens, position_ids, self._additive_mask(mask.to(self.device), past))
        self._num_pending = num_nodes
        return logits

    def _additive_mask(self, ancestor_mask: torch.Tensor, past: int) -> torch.Tensor:
        """[N, N] bool -> [1, 1, N, past + N] additive mask in the model's dtype."""
        num_nodes = ancestor_mask.shape[0]
        blocked = torch.finfo(self.dtype).min
        mask = torch.zeros(num_nodes, past + num_nodes, dtype=self.dtype, device=self.device)
        mask[:, past:].masked_fill_(~ancestor_mask, blocked)
        return mask[None, None]

    def _forward(
        self,
        ids: torch.Tensor,
        position_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Logits [T, V] for ids [T] (or [1, V] with last_only), appending their KV entries."""
        logits, _ = self.run(ids.unsqueeze(0), position_ids, attention_mask, self.cache, self._num_committed, last_only)
        return logits[0]

    def run(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        cache: Cache,
        context: int,
        last_only: bool = False,
        capture: Sequence[int] = (),
        keys: KeySequences | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward pass of the model over `cache`: (logits [B, T, V] (T = 1 with last_only), features).

        input_ids [B, T] int64; position_ids [B, T] or None; attention_mask None or an additive
        [B, 1, T, K] mask; context: committed tokens before the pass (picks the attention plan).
        capture: hidden-state indices (transformers' `hidden_states[i]`: the input of decoder layer i)
        whose states are returned, concatenated, as features [B, T, len(capture) * H] at every
        position (None when capture is empty): what a draft head reads, from the same pass.
        Also serves batched passes (`specdec.backends.torch.rows`), which bring their own cache.
        keys: where each row reads its keys, from a caller that has the trees (for passes that run fused,
        `runs_fused`, instead of attention_mask; any other pass refuses it).
        """
        if self._fused is not None:  # the layers in C++, the model's attention setting untouched
            choice = self.attention.choose(context, input_ids.numel(), prefill=last_only)
            if choice in (INVARIANT, INVARIANT_PREFILL):
                layout = keys
                if layout is None and attention_mask is not None:
                    layout = self._layout(input_ids.shape, attention_mask, context)
                return self._fused.run(input_ids, position_ids, layout, cache, context, last_only, capture)
        inputs = dict(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            past_key_values=cache,
            use_cache=True,
        )
        with self._attention_for(context, input_ids.numel(), prefill=last_only) as choice:
            if keys is not None:
                raise ValueError(f"key sequences are for fused passes; this one runs {choice!r} attention")
            if choice == INVARIANT:  # where each row reads its keys: once per pass, not per layer
                inputs["specdec_layout"] = self._layout(input_ids.shape, attention_mask, context)
            return self.forward_pass(inputs, last_only, capture)

    def forward_pass(
        self, inputs: dict, last_only: bool = False, capture: Sequence[int] = ()
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The model's forward on transformers keyword `inputs` under the attention set now: `run`'s
        (logits, features). What a compiled pass compiles (`specdec.backends.compiled`)."""
        if capture:  # only then: a draft view's forward (layerskip) takes no such argument
            inputs = {**inputs, "output_hidden_states": True}
        if self._head is None:
            keep = {"logits_to_keep": 1} if last_only else {}
            out = self.model(**inputs, **keep)
            return out.logits, _features(out, capture)
        out = self._decoder(**inputs)
        hidden = out.last_hidden_state  # [B, T, H]
        if last_only:
            hidden = hidden[:, -1:]
        rows, tokens = hidden.shape[:2]
        logits = head_logits(self._head, hidden.reshape(rows * tokens, -1)).reshape(rows, tokens, -1)
        return logits, _features(out, capture)

    def _layout(self, shape: torch.Size, attention_mask: torch.Tensor | None, context: int) -> Layout:
        """The invariant attention's `Layout` for a pass of input_ids `shape` [B, T] after `context`
        cached tokens: from the additive mask, or causal when there is none."""
        batch, num_queries = shape
        if attention_mask is None:
            allowed = causal_allowed(batch, context, num_queries, self.device)
        else:
            allowed = (attention_mask == 0).expand(batch, 1, -1, -1)[:, 0]
        return Layout.of(allowed, self.dtype)

    @contextmanager
    def _attention_for(self, context: int, num_new: int, prefill: bool) -> Iterator[str]:
        """Run the pass with the planned attention implementation (yielded).
        prefill: a prompt's pass (the passes that return the last position's logits only)."""
        own = self.model.config._attn_implementation
        choice = own if self.attention is None else self.attention.choose(context, num_new, prefill)
        with self.attention_as(choice):
            yield choice

    @contextmanager
    def attention_as(self, choice: str) -> Iterator[None]:
        """Run under attention implementation `choice`, then give the model back as it was (others use
        it too: transformers' own `generate` in the benchmarks, draft views)."""
        config = self.model.config
        own = config._attn_implementation
        if choice == own:
            yield
            return
        if choice not in self._attention_checked:  # transformers checks the model supports it, once
            self.model.set_attn_implementation(choice)
            self.model.set_attn_implementation(own)
            self._attention_checked.add(choice)
        # The config's own setter (sub-configs follow): `set_attn_implementation` walks every module on each
        # call, tens of times slower than setting the config (the compiled pass switches every step).
        config._attn_implementation = choice
        try:
            yield
        finally:
            config._attn_implementation = own

    @torch.inference_mode()
    def commit(self, node_indices: Sequence[int]) -> None:
        """Keep the KV entries of the accepted path (root first), contiguously; drop the rest of the tree."""
        if not self._num_pending:
            raise RuntimeError("nothing to commit: call forward_tree() first")
        path = list(node_indices)
        if not path or path[0] != 0 or max(path) >= self._num_pending:
            raise ValueError(f"commit needs a root-first path inside the tree, got {path}")
        past = self._num_committed
        keep = len(path)
        if path != list(range(keep)):
            src = torch.tensor(path, dtype=torch.int64, device=self.device) + past
            for layer in self.cache.layers:
                # Advanced indexing copies first, so overlapping source and destination are safe.
                layer.keys[..., past : past + keep, :] = layer.keys[..., src, :]
                layer.values[..., past : past + keep, :] = layer.values[..., src, :]
        self._num_pending = 0
        self._num_committed = past + keep
        self._crop(self._num_committed)

    @torch.inference_mode()
    def trim(self, length: int) -> None:
        """Roll the cache back to its first `length` committed tokens (dropping any uncommitted tree)."""
        if not 0 <= length <= self._num_committed:
            raise ValueError(f"cannot trim a cache of {self._num_committed} tokens to {length}")
        self._num_pending = 0
        self._num_committed = length
        self._crop(length)

    def _crop(self, length: int) -> None:
        for layer in self.cache.layers:
            if layer.is_initialized and layer.get_seq_length() > length:
                layer.truncate(length)
