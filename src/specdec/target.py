"""The target model and its KV cache, seen as a machine that verifies token trees.

Why this exists: speculative decoding needs three things transformers does not
offer as one call: a forward pass over a *tree* of tokens below the cached
prefix, keeping the KV entries of the one accepted root-to-node path, and
dropping the rest. We get them from public transformers APIs only: an explicit
4-D additive attention mask (ancestor-or-self), explicit `position_ids`
(past length + depth), and a `DynamicCache` whose per-layer key/value tensors we
compact in place. No model file is forked and nothing is monkeypatched.

Invariants:
- the cache holds exactly the committed tokens: after `forward_tree` the tree's
  N entries sit after them until `commit` (or `trim`) settles which stay;
- `commit(path)` leaves the KV entries of `path` (root first) at contiguous
  positions, exactly as if those tokens had been fed one after another;
- only caches made purely of `DynamicLayer`s (full attention) are accepted: a
  sliding-window or linear-attention layer cannot be compacted this way, so such
  models are refused up front with `UnsupportedModelError`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from specdec.models import UnsupportedModelError
from specdec.tree import ancestry


def _as_ids(token_ids: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    ids = torch.as_tensor(token_ids, dtype=torch.int64, device=device)
    return ids.reshape(-1)


class TargetModel:
    """A causal LM plus the KV cache of one sequence (batch size 1)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.config = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self._check_cache_is_compactable()
        self.cache: DynamicCache | None = None
        self._num_committed = 0  # tokens whose KV entries are settled
        self._num_pending = 0  # tree entries after them, awaiting commit

    def _check_cache_is_compactable(self) -> None:
        probe = DynamicCache(config=self.config)
        kinds = {type(layer).__name__ for layer in probe.layers}
        if any(type(layer) is not DynamicLayer for layer in probe.layers):
            raise UnsupportedModelError(
                f"{self.config.model_type}: cache layers {sorted(kinds)} cannot be compacted after tree "
                "verification (sliding-window or linear attention); only full-attention models are supported"
            )

    @property
    def num_cached(self) -> int:
        """Committed tokens in the KV cache."""
        return self._num_committed

    @property
    def max_length(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 0) or 0)

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.config)
        self._num_committed = 0
        self._num_pending = 0

    @torch.inference_mode()
    def prefill(self, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Start a new sequence: run the prompt, return the last position's logits [V]."""
        ids = _as_ids(token_ids, self.device)
        if ids.numel() == 0:
            raise ValueError("cannot prefill an empty token sequence")
        self.reset()
        return self.append(ids)[-1]

    @torch.inference_mode()
    def append(self, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Feed tokens after the cache and commit them all; returns their logits [T, V]."""
        ids = _as_ids(token_ids, self.device)
        logits = self._forward(ids, position_ids=None, attention_mask=None)
        self._num_committed += ids.numel()
        self._num_pending = 0
        return logits

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
        self, ids: torch.Tensor, position_ids: torch.Tensor | None, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        out = self.model(
            input_ids=ids.unsqueeze(0),
            position_ids=position_ids,
            attention_mask=attention_mask,
            past_key_values=self.cache,
            use_cache=True,
        )
        return out.logits[0]

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
            if layer.is_initialized and layer.keys.shape[-2] > length:
                layer.keys = layer.keys[..., :length, :]
                layer.values = layer.values[..., :length, :]
