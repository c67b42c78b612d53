"""specdec's tree-attention kernel (`csrc/tree_attention.cpp`): each query row's bits depend only on the
sequence of keys it sees, never on how the cache lays them out or on the rows beside it.

What exact verification needs of it (`specdec.backends.torch.invariant`): a tree node reading its
ancestors from gathered slots gets the bits a one-token pass reading the same keys contiguously gets;
any split of that sequence between the contiguous prefix and the gathered tail gives the same bits;
and the values are softmax attention's (checked against an fp32 reference within bf16's rounding).
The end-to-end checks (trees, batches and chunked prefills against one-token passes, bit for bit,
on the real model) are tests/test_invariant.py's, which run on this kernel where it is available.
"""

from __future__ import annotations

import pytest
import torch

from specdec.backends.torch import invariant
from specdec.kernels import q4_kernel

B, H, KV, SLOTS, PAST, ROWS = 2, 9, 3, 300, 200, 5
SCALE = 64**-0.5


@pytest.fixture(scope="module")
def op():
    if not q4_kernel.load_extension():
        pytest.skip(q4_kernel.unavailable_reason())
    if not torch.ops.specdec_attention.tree_attention_available():
        pytest.skip("the tree-attention kernel needs a CPU with AVX-512 BF16 (the PyTorch path runs elsewhere)")
    return torch.ops.specdec_attention.tree_attention


@pytest.fixture(scope="module", params=[64, 128], ids=["heads of 64", "heads of 128"])
def states(request):
    dim = request.param
    generator = torch.Generator().manual_seed(0)
    key, value = (torch.randn(B, KV, SLOTS, dim, generator=generator).to(torch.bfloat16) for _ in range(2))
    query = torch.randn(B, H, ROWS, dim, generator=generator).to(torch.bfloat16)
    return query, key, value


def tree_layout() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row t reads the cache's PAST slots, then its ancestors: a chain for even t, a gap for odd t."""
    starts = torch.full((B, ROWS), PAST, dtype=torch.int64)
    tail = torch.zeros(B, ROWS, ROWS, dtype=torch.int64)
    counts = torch.zeros(B, ROWS, dtype=torch.int64)
    for b in range(B):
        for t in range(ROWS):
            slots = list(range(PAST, PAST + t + 1)) if t % 2 == 0 else [PAST, PAST + t]
            tail[b, t, : len(slots)] = torch.tensor(slots)
            counts[b, t] = len(slots)
    return starts, tail, counts


def visible(tail: torch.Tensor, counts: torch.Tensor, b: int, t: int) -> list[int]:
    return list(range(PAST)) + tail[b, t, : counts[b, t]].tolist()


def test_values_are_softmax_attention(op, states):
    query, key, value = states
    starts, tail, counts = tree_layout()
    out = op(query, key, value, starts, tail, counts, SCALE)
    assert out.shape == (B, ROWS, H, query.shape[-1]) and out.dtype == torch.bfloat16
    for b in range(B):
        for t in range(ROWS):
            slots = visible(tail, counts, b, t)
            for h in range(H):
                keys, values = key[b, h // (H // KV), slots].float(), value[b, h // (H // KV), slots].float()
                expected = torch.softmax(query[b, h, t].float() @ keys.T * SCALE, -1) @ values
                torch.testing.assert_close(out[b, t, h].float(), expected, atol=2e-2, rtol=2e-2)


def test_a_row_gets_the_bits_of_its_keys_laid_out_any_way(op, states):
    """The same key sequence, contiguous (a one-token pass) or split anywhere between prefix and tail."""
    query, key, value = states
    starts, tail, counts = tree_layout()
    out = op(query, key, value, starts, tail, counts, SCALE)
    for b in range(B):
        for t in range(ROWS):
            slots = visible(tail, counts, b, t)
            alone = query[b : b + 1, :, t : t + 1].contiguous()
            keys, values = key[b : b + 1, :, slots].contiguous(), value[b : b + 1, :, slots].contiguous()
            for cut in (len(slots), len(slots) - 1, len(slots) - 7, 0):
                split_tail = torch.arange(cut, len(slots)).view(1, 1, -1)
                one = op(alone, keys, values, torch.tensor([[cut]]), split_tail, torch.tensor([[len(slots) - cut]]), SCALE)
                assert torch.equal(one[0, 0], out[b, t]), (b, t, cut)


@pytest.mark.parametrize("dim", [64, 128])
def test_query_heads_run_together_or_alone_with_the_same_bits(op, dim):
    """A key head's query heads (4 here: run two at a time in a wide pass, one at a time alone) each get
    the bits they get alone: sharing a value's widening changes no head's steps."""
    generator = torch.Generator().manual_seed(1)
    heads, kv_heads, rows = 8, 2, 6
    key, value = (torch.randn(1, kv_heads, 64, dim, generator=generator).to(torch.bfloat16) for _ in range(2))
    query = torch.randn(1, heads, rows, dim, generator=generator).to(torch.bfloat16)
    starts = torch.full((1, rows), 40, dtype=torch.int64)
    tail = (40 + torch.arange(rows)).expand(1, rows, rows).contiguous()
    counts = (1 + torch.arange(rows)).view(1, rows)
    threads = torch.get_num_threads()
    torch.set_num_threads(8)  # heads run together only where 16 or more items would remain: the pass of 6 rows
    try:
        out = op(query, key, value, starts, tail, counts, dim**-0.5)
        for t in range(rows):  # 8 items: one head at a time
            one = op(query[:, :, t : t + 1].contiguous(), key, value, starts[:, t : t + 1].contiguous(),
                     tail[:, t : t + 1].contiguous(), counts[:, t : t + 1].contiguous(), dim**-0.5)
            assert torch.equal(one[0, 0], out[0, t]), t
    finally:
        torch.set_num_threads(threads)


def test_strided_cache_views_are_read_in_place(op, states):
    """A cache buffer's filled prefix (a strided view) gives what a contiguous copy gives."""
    query, key, value = states
    starts, tail, counts = tree_layout()
    buffer_k, buffer_v = (torch.cat([t, torch.zeros_like(t)], dim=2) for t in (key, value))  # capacity 2 x SLOTS
    view_k, view_v = buffer_k[:, :, :SLOTS], buffer_v[:, :, :SLOTS]
    assert not view_k.is_contiguous()
    assert torch.equal(op(query, view_k, view_v, starts, tail, counts, SCALE),
                       op(query, key, value, starts, tail, counts, SCALE))


def test_a_layout_outside_the_cache_is_refused(op, states):
    query, key, value = states
    starts, tail, counts = tree_layout()
    with pytest.raises(RuntimeError, match="within the cache"):
        op(query, key, value, starts, tail + SLOTS, counts, SCALE)
    with pytest.raises(RuntimeError, match="at least one key"):
        op(query, key, value, torch.zeros_like(starts), tail, torch.zeros_like(counts), SCALE)
    with pytest.raises(RuntimeError, match="bf16"):
        op(query.float(), key, value, starts, tail, counts, SCALE)


def test_exact_attention_uses_the_kernel_for_bf16_heads_of_64_or_128(op, states):
    query, key, _ = states
    assert invariant.uses_kernel(query, key)
    assert not invariant.uses_kernel(query.float(), key)
    assert invariant.uses_kernel(torch.zeros(1, 2, 1, 128, dtype=torch.bfloat16), key)
    assert not invariant.uses_kernel(torch.zeros(1, 2, 1, 96, dtype=torch.bfloat16), key)


@pytest.mark.parametrize("dim", [64, 128])
def test_many_rows_sum_every_score_in_the_one_row_order(op, dim):
    """Eight rows of three query heads a key head, together and one at a time: every score summed in the
    one-row order, whatever form a pass of many rows takes (queries in the lanes, for one, was tried:
    docs/benchmarks.md). Random keys rarely show a changed order (their partial sums are exact in fp32);
    two keys here do: one whose lane sums are 2^24, -2^24 and 0.5 (lanes 0, 8 and 1: 0.5 survives only if
    lanes 0 and 8 meet first) and one whose lane 2 takes 2^24, then 0.5 - 2^24 (0.5 survives only with
    the head's elements in order)."""
    generator = torch.Generator().manual_seed(5)
    heads, kv_heads, rows, past = 9, 3, 8, 40
    query, key, value = order_revealing_states(generator, heads, kv_heads, rows, past + rows, dim)
    starts = torch.full((1, rows), past, dtype=torch.int64)
    tail = (past + torch.arange(rows)).expand(1, rows, rows).contiguous()
    counts = (1 + torch.arange(rows)).view(1, rows)
    out = op(query, key, value, starts, tail, counts, 0.125)
    for t in range(rows):
        one = op(query[:, :, t : t + 1].contiguous(), key, value, starts[:, t : t + 1].contiguous(),
                 tail[:, t : t + 1].contiguous(), counts[:, t : t + 1].contiguous(), 0.125)
        assert torch.equal(one[0, 0], out[0, t]), t


def order_revealing_states(generator: torch.Generator, heads: int, kv_heads: int, rows: int, slots: int, dim: int):
    """Query, key and value where a changed order of sums shows in the output: slots 3 and 7 hold the keys
    `test_many_rows_sum_every_score_in_the_one_row_order` describes; the queries are powers of two."""
    key = torch.randn(1, kv_heads, slots, dim, generator=generator) / 16
    key[:, :, 3] = 0
    key[:, :, 3, [0, 1]], key[:, :, 3, [16, 17]], key[:, :, 3, [2, 3]] = 2.0**23, -(2.0**23), 0.25
    key[:, :, 7] = 0
    key[:, :, 7, [4, 5, 36, 37]] = torch.tensor([2.0**24, 0, 0.5, -(2.0**24)])
    value = torch.randn(1, kv_heads, slots, dim, generator=generator).to(torch.bfloat16)
    scales = 2.0 ** (torch.arange(heads * rows) % 4 - 2).view(1, heads, rows, 1)  # powers of two: exact products
    query = (torch.ones(1, heads, rows, dim) * scales).to(torch.bfloat16)
    return query, key.to(torch.bfloat16), value


@pytest.mark.parametrize("dim", [64, 128])
def test_cache_blocks_and_gathered_keys_take_the_same_steps(op, dim):
    """A row's keys read from the cache's contiguous slots (16 at a time, unrolled) and the same keys gathered
    one by one from its tail give the same bits, the prefix split anywhere (odd splits too: values go in
    pairs), on keys whose scores change with the order of their sums."""
    heads, kv_heads, slots = 9, 3, 53
    query, key, value = order_revealing_states(torch.Generator().manual_seed(7), heads, kv_heads, 1, slots, dim)
    whole = op(query, key, value, torch.tensor([[slots]]), torch.zeros(1, 1, 1, dtype=torch.int64),
               torch.tensor([[0]]), dim**-0.5)
    for cut in (0, 1, 7, 16, 17, 33, slots - 1):
        tail = torch.arange(cut, slots).view(1, 1, -1)
        split = op(query, key, value, torch.tensor([[cut]]), tail, torch.tensor([[slots - cut]]), dim**-0.5)
        assert torch.equal(split, whole), cut


def test_amx_tiles_and_the_avx512_steps_agree_to_rounding(op, states):
    """Where the CPU has AMX-BF16 the kernel runs on tiles (its own order of sums: `csrc/tree_attention_amx.cpp`),
    and `path` runs either in one process: both give softmax attention's values to bf16's rounding, a row's bits
    the same in any company on each, and an unknown path is refused."""
    query, key, value = states
    starts, tail, counts = tree_layout()
    with pytest.raises(RuntimeError, match="path auto, avx512_amx or avx512_bf16, got sse9"):
        op(query, key, value, starts, tail, counts, SCALE, "sse9")
    if torch.ops.specdec_attention.steps_path() != "avx512_amx":
        pytest.skip(f"no AMX-BF16 tiles here (path {torch.ops.specdec_attention.steps_path()})")
    tiles = op(query, key, value, starts, tail, counts, SCALE, "avx512_amx")
    vector = op(query, key, value, starts, tail, counts, SCALE, "avx512_bf16")
    assert torch.equal(tiles, op(query, key, value, starts, tail, counts, SCALE))  # what a pass runs here
    torch.testing.assert_close(tiles.float(), vector.float(), atol=1e-2, rtol=1e-2)
    one = op(query[:1, :, 3:4].contiguous(), key[:1], value[:1], starts[:1, 3:4].contiguous(),
             tail[:1, 3:4].contiguous(), counts[:1, 3:4].contiguous(), SCALE, "avx512_amx")
    assert torch.equal(one[0, 0], tiles[0, 3])
