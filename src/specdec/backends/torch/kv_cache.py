"""A KV cache that is written in place: no per-step concatenation.

Why this exists: transformers' `DynamicCache` appends each step's keys and
values with `torch.cat`, which copies the whole cache of every layer on every
forward pass: a sixth of a bf16 step at 1,700 tokens of context on a CPU, and it
grows with the context. `StaticCache` avoids the copy
but attends over its full capacity on every step. `PreallocatedLayer` keeps one
buffer per layer, `[batch, kv_heads, capacity, head_dim]`, writes new entries
after the committed ones, and hands attention a view of the filled prefix only.

It plugs into transformers through the public cache API: a `Cache` built from
our layers (`preallocated_cache`), passed as `past_key_values`. Nothing in
transformers is patched, and the model files are untouched.

Invariants:
- `keys` / `values` are always views `buffer[..., :length, :]` of the current
  buffer, so in-place writes through them (the tree commit in `TargetModel`)
  land in the buffer;
- capacity grows by doubling (a copy of the filled prefix) when an update does
  not fit; it never shrinks, so a long sequence pays for growth O(log n) times;
- `truncate(length)` only moves the end: entries past it are garbage that the
  next update overwrites, and nothing ever reads past `length`.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

DEFAULT_CAPACITY = 256  # tokens; doubled as needed


class PreallocatedLayer(DynamicLayer):
    """One full-attention layer's keys and values in a growable preallocated buffer."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._key_buffer: torch.Tensor | None = None  # before the base's __init__, which reads no view
        self._value_buffer: torch.Tensor | None = None
        super().__init__()
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.initial_capacity = capacity
        self.length = 0

    @property
    def capacity(self) -> int:
        return 0 if self._key_buffer is None else self._key_buffer.shape[-2]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self._key_buffer = self._empty(key_states, self.initial_capacity)
        self._value_buffer = self._empty(value_states, self.initial_capacity)
        self.length = 0
        self.is_initialized = True

    @staticmethod
    def _empty(like: torch.Tensor, capacity: int) -> torch.Tensor:
        batch, heads, _, dim = like.shape
        return torch.empty(batch, heads, capacity, dim, dtype=like.dtype, device=like.device)

    # The filled prefixes, made when read: a fused pass claims and trims every layer each step and never
    # reads them, and two views a layer a step were a measurable share of a small model's Python.
    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._key_buffer is None else self._key_buffer[..., : self.length, :]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._refuse(value)

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._value_buffer is None else self._value_buffer[..., : self.length, :]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._refuse(value)

    @staticmethod
    def _refuse(value: torch.Tensor | None) -> None:
        """transformers' base sets None at construction; any other assignment would bypass the buffer."""
        if value is not None:
            raise NotImplementedError("PreallocatedLayer's keys and values are views of its buffers: write "
                                      "through update(), not by assignment")

    def _grow(self, needed: int) -> None:
        capacity = max(self.capacity, 1)
        while capacity < needed:
            capacity *= 2
        for name in ("_key_buffer", "_value_buffer"):
            old = getattr(self, name)
            new = self._empty(old, capacity)
            new[..., : self.length, :] = old[..., : self.length, :]
            setattr(self, name, new)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """key_states, value_states: [batch, kv_heads, new, head_dim]; returns the filled prefix (views)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.capacity:
            self._grow(end)
        self._key_buffer[..., start:end, :] = key_states
        self._value_buffer[..., start:end, :] = value_states
        self.length = end
        return self.keys, self.values

    def claim(self, batch: int, kv_heads: int, head_dim: int, dtype: torch.dtype, tokens: int
              ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """`update` for a caller that writes the entries itself (`specdec.backends.torch.fused`): room for
        `tokens` more, counted in; returns the key and value buffers [batch, kv_heads, capacity, head_dim]
        and where the new entries go: slots start .. start + tokens - 1 (an int: every layer of a pass claims
        the same start, so the caller makes one tensor of it, not one a layer)."""
        if not self.is_initialized:
            like = torch.empty(batch, kv_heads, 0, head_dim, dtype=dtype)
            self.lazy_initialization(like, like)
        start, end = self.length, self.length + tokens
        if end > self.capacity:
            self._grow(end)
        self.length = end
        return self._key_buffer, self._value_buffer, start

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def truncate(self, length: int) -> None:
        """Keep the first `length` entries."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate {self.length} entries to {length}")
        self.length = length

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' convention: a negative count of entries to drop from the end."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of entries to remove")
        if self.is_initialized and tokens_to_remove:
            self.truncate(max(0, self.length + tokens_to_remove))

    def reset(self) -> None:
        """Forget the entries but keep the buffers: the next sequence reuses them."""
        self.length = 0

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("PreallocatedLayer holds one batch layout; build a new cache instead")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("PreallocatedLayer holds one batch layout; build a new cache instead")


def preallocated_cache(num_layers: int, capacity: int = DEFAULT_CAPACITY) -> Cache:
    """A transformers `Cache` of `num_layers` full-attention `PreallocatedLayer`s."""
    return Cache(layers=[PreallocatedLayer(capacity) for _ in range(num_layers)])
