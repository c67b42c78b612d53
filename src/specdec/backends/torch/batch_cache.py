"""A KV cache for B sequences of different lengths, written in place at per-row offsets.

Why this exists: batched speculation is the "ragged tensor" problem. Rows accept
different numbers of draft tokens, so after one step their committed lengths
differ, and the next pass must append each row's tree right after *its own*
prefix. transformers' caches append one block at the same offset for every row
(left padding keeps rows aligned only while they grow in lockstep). Here every
layer keeps one buffer `[rows, kv_heads, capacity, head_dim]`; a pass writes
row b's new entries at `starts[b]...`, and attention sees the prefix up to the
longest row, with the caller's 4-D mask hiding what a row must not see (other
rows' lengths are garbage to it). Rows are padded to the pass's longest tree;
the padding's entries land after the row's own and are overwritten later.

It plugs in through transformers' public cache API (`Cache(layers=...)`), like
`specdec.backends.torch.kv_cache`: no model file forked, nothing patched.

Invariants:
- `layout.starts` [B] (the rows' committed lengths) and `layout.context`
  (their maximum) are set by the caller before every pass; a pass of T tokens writes row b at positions
  `starts[b] .. starts[b] + T - 1` of every layer and returns views of length
  `max(starts) + T`;
- the buffers only grow (doubling, prefix copied); rows are slots `0..B-1`,
  kept contiguous by the caller (`move_row` fills a hole with the last row);
- nothing past a row's committed length is ever read unmasked.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from specdec.kernels import q4_kernel

DEFAULT_CAPACITY = 256  # tokens per row before the first doubling


class BatchLayout:
    """What every layer of one batched pass needs to know: the rows' write offsets."""

    def __init__(self) -> None:
        self.starts = torch.zeros(0, dtype=torch.int64)  # [B] committed length per row
        self.context = 0  # max(starts): the cache length transformers sees before the pass
        # A compiled pass's (`specdec.backends.compiled`): the key positions 0..L-1 it attends to, L = max(starts)
        # + T. Every layer returns its buffers' first L entries, L read from this tensor's shape, so no
        # Python number of a pass reaches the compiled graph (there L is symbolic); None otherwise.
        self.window: torch.Tensor | None = None


class BatchedLayer(DynamicLayer):
    """One full-attention layer's keys and values for B rows, each at its own length."""

    def __init__(self, layout: BatchLayout, capacity: int = DEFAULT_CAPACITY) -> None:
        super().__init__()
        self.layout = layout
        self.initial_capacity = capacity
        self._keys: torch.Tensor | None = None  # [rows, kv_heads, capacity, head_dim]
        self._values: torch.Tensor | None = None
        self.length = 0  # entries visible to the last pass: max(starts) + T

    @property
    def row_capacity(self) -> int:
        return 0 if self._keys is None else self._keys.shape[0]

    @property
    def capacity(self) -> int:
        return 0 if self._keys is None else self._keys.shape[2]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        shape = (key_states.shape[0], key_states.shape[1], self.initial_capacity, key_states.shape[3])
        self._keys = torch.zeros(shape, dtype=key_states.dtype, device=key_states.device)
        self._values = torch.zeros(shape, dtype=value_states.dtype, device=value_states.device)
        self.is_initialized = True

    def ensure(self, rows: int, tokens: int) -> None:
        """Make room for `rows` rows of `tokens` entries each (doubling, contents kept)."""
        keys = self._keys  # every layer, every pass: the common case returns at once
        if keys is None or (rows <= keys.shape[0] and tokens <= keys.shape[2]):
            return
        new_rows, new_cap = max(self.row_capacity, 1), max(self.capacity, 1)
        while new_rows < rows:
            new_rows *= 2
        while new_cap < tokens:
            new_cap *= 2
        if (new_rows, new_cap) == (self.row_capacity, self.capacity):
            return
        for name in ("_keys", "_values"):
            old = getattr(self, name)
            new = old.new_zeros(new_rows, old.shape[1], new_cap, old.shape[3])
            new[: old.shape[0], :, : old.shape[2]] = old
            setattr(self, name, new)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """key_states, value_states: [B, kv_heads, T, head_dim]; returns views [B, kv_heads, max(starts) + T, D]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        rows, tokens = key_states.shape[0], key_states.shape[2]
        if self.layout.window is not None:  # the caller made room (`ensure`) before the pass
            self._write(key_states, value_states)
            end = self.layout.window.shape[0]
            return self._keys[:rows, :, :end], self._values[:rows, :, :end]
        end = self.layout.context + tokens  # context = max(starts), set once per pass by the caller
        self.ensure(rows, end)
        if rows == 1:  # one sequence: a plain slice write, as a one-sequence cache does
            self._keys[:1, :, end - tokens : end] = key_states
            self._values[:1, :, end - tokens : end] = value_states
        else:
            self._write(key_states, value_states)
        self.length = end
        self.keys = self._keys[:rows, :, :end]
        self.values = self._values[:rows, :, :end]
        return self.keys, self.values

    def claim(self, batch: int, kv_heads: int, head_dim: int, dtype: torch.dtype, tokens: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`update` for a caller that writes the entries itself (`specdec.backends.torch.fused`): room for
        `tokens` more per row, counted in; returns the key and value buffers [rows, kv_heads, capacity,
        head_dim] and where row b's new entries go: slots write[b] .. write[b] + tokens - 1 (the layout's starts).
        `keys` and `values` are not refreshed (None after a claim): the fused pass reads the buffers, and two
        views a layer are a measurable share of a small model's one-token pass (docs/benchmarks.md)."""
        if not self.is_initialized:
            like = torch.empty(batch, kv_heads, 0, head_dim, dtype=dtype)
            self.lazy_initialization(like, like)
        end = self.layout.context + tokens
        self.ensure(batch, end)
        self.length = end
        self.keys = self.values = None
        return self._keys, self._values, self.layout.starts

    def _write(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Write row b's T new entries at starts[b] .. starts[b] + T - 1."""
        rows, tokens = key_states.shape[0], key_states.shape[2]
        starts = self.layout.starts.to(key_states.device)
        positions = starts[:, None] + torch.arange(tokens, device=starts.device)  # [B, T]
        row_index = torch.arange(rows, device=starts.device)[:, None]  # [B, 1]
        # Advanced indices around a slice put their dims first: the target is [B, T, kv_heads, D].
        self._keys[row_index, :, positions] = key_states.transpose(1, 2)
        self._values[row_index, :, positions] = value_states.transpose(1, 2)

    def get_seq_length(self) -> int:
        """The cache length before the running pass (transformers reads it to place a causal pass)."""
        return self.layout.context

    def keep_paths(self, row_index: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy entries src -> dst per row: row_index [R, 1], src/dst [R, P] absolute positions."""
        for buffer in (self._keys, self._values):
            # The right side is gathered (a copy) before the write, so overlaps are safe.
            buffer[row_index, :, dst] = buffer[row_index, :, src]

    @property
    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value buffers [rows, kv_heads, capacity, head_dim] (after the layer's first write)."""
        return self._keys, self._values

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy row src's first `length` entries into row dst (to keep the rows contiguous)."""
        for buffer in (self._keys, self._values):
            buffer[dst, :, :length] = buffer[src, :, :length]

    def write_row(self, row: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Put a sequence's entries, keys/values [kv_heads, L, head_dim], at the start of `row`."""
        if not self.is_initialized:
            self.lazy_initialization(keys[None], values[None])
        self.ensure(row + 1, keys.shape[1])
        self._keys[row, :, : keys.shape[1]] = keys
        self._values[row, :, : values.shape[1]] = values

    def reset(self) -> None:
        self.length = 0

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a batched cache is trimmed per row by its owner, not cropped")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("rows are managed by the batched target (slots), not by transformers")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("rows are managed by the batched target (slots), not by transformers")


def keep_paths(layers: list[BatchedLayer], rows: list[int], src: list[list[int]], dst: list[list[int]]) -> None:
    """Every layer's `keep_paths`: rows [R], src/dst [R][P] absolute positions. On the CPU, with specdec's
    extension loaded, one C++ call for all layers (`csrc/kv_paths.cpp`): the indexed copies cost ~4 tensor ops a
    layer and buffer from Python, a share of the step around a few-millisecond pass."""
    buffers = [buffer for layer in layers for buffer in layer.buffers]
    if buffers[0].device.type == "cpu" and q4_kernel.is_loaded():
        torch.ops.specdec_cache.keep_paths(buffers, rows, [s for row in src for s in row], [d for row in dst for d in row])
        return
    device = buffers[0].device
    row_index = torch.tensor(rows, device=device)[:, None]
    src_index, dst_index = torch.tensor(src, device=device), torch.tensor(dst, device=device)
    for layer in layers:
        layer.keep_paths(row_index, src_index, dst_index)


def batched_cache(num_layers: int, layout: BatchLayout, capacity: int = DEFAULT_CAPACITY) -> Cache:
    """A transformers `Cache` of `num_layers` `BatchedLayer`s sharing one `layout`."""
    return Cache(layers=[BatchedLayer(layout, capacity) for _ in range(num_layers)])
