"""PreallocatedLayer: in-place appends agree with concatenation, across growth, truncation and reuse."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from specdec.backends.torch.kv_cache import PreallocatedLayer, preallocated_cache


def chunk(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, n, 4, generator=g), torch.randn(1, 2, n, 4, generator=g)


@pytest.mark.parametrize("capacity", [1, 3, 64])
def test_appends_match_dynamic_layer_across_growth(capacity):
    ours, reference = PreallocatedLayer(capacity), DynamicLayer()
    for seed, n in enumerate([5, 1, 1, 7, 2, 16]):
        k, v = chunk(n, seed)
        keys, values = ours.update(k, v)
        ref_keys, ref_values = reference.update(k, v)
        torch.testing.assert_close(keys, ref_keys, rtol=0, atol=0)
        torch.testing.assert_close(values, ref_values, rtol=0, atol=0)
        assert ours.get_seq_length() == reference.get_seq_length()
    assert ours.capacity >= 32  # 32 entries in all: grown by doubling from the initial capacity


def test_truncate_then_append_overwrites_the_dropped_entries():
    layer = PreallocatedLayer(8)
    k1, v1 = chunk(6, 1)
    layer.update(k1, v1)
    layer.truncate(2)
    assert layer.keys.shape[-2] == 2
    k2, v2 = chunk(3, 2)
    keys, values = layer.update(k2, v2)
    torch.testing.assert_close(keys, torch.cat([k1[..., :2, :], k2], dim=-2), rtol=0, atol=0)
    torch.testing.assert_close(values, torch.cat([v1[..., :2, :], v2], dim=-2), rtol=0, atol=0)
    layer.crop(-4)
    assert layer.get_seq_length() == 1
    with pytest.raises(ValueError):
        layer.truncate(2)
    with pytest.raises(ValueError):
        layer.crop(3)


def test_writes_through_the_views_land_in_the_buffer():
    """TargetModel.commit moves accepted entries by assigning into `keys[..., a:b, :]`."""
    layer = PreallocatedLayer(16)
    k, v = chunk(6, 3)
    layer.update(k, v)
    layer.keys[..., 1:3, :] = layer.keys[..., torch.tensor([4, 5]), :]
    layer.truncate(3)
    layer.update(*chunk(1, 4))
    torch.testing.assert_close(layer.keys[..., 1:3, :], k[..., 4:6, :], rtol=0, atol=0)


def test_reset_keeps_the_buffers_for_the_next_sequence():
    cache = preallocated_cache(num_layers=2, capacity=4)
    for layer in cache.layers:
        layer.update(*chunk(9, 5))
    buffers = [layer._key_buffer for layer in cache.layers]
    cache.reset()
    assert cache.get_seq_length() == 0
    for layer, buffer in zip(cache.layers, buffers, strict=True):
        keys, _ = layer.update(*chunk(2, 6))
        assert layer._key_buffer is buffer and keys.shape[-2] == 2


def test_views_follow_claims_and_trims_and_refuse_assignment():
    """The filled prefixes are made when read: after a claim (the fused pass writes the slots itself) and a
    trim they span exactly the kept entries of the current buffer; assigning them is refused, since it would
    bypass the buffer."""
    layer = PreallocatedLayer(capacity=4)
    assert layer.keys is None and layer.values is None
    keys, values, write = layer.claim(1, 2, 8, torch.float32, 6)  # grows past the capacity
    assert int(write) == 0 and layer.keys.shape == (1, 2, 6, 8) and layer.keys.data_ptr() == keys.data_ptr()
    keys[..., 5, :] = 1.0
    assert torch.equal(layer.keys[..., 5, :], torch.ones(1, 2, 8))
    layer.truncate(3)
    assert layer.keys.shape == layer.values.shape == (1, 2, 3, 8)
    with pytest.raises(NotImplementedError, match="views of its buffers"):
        layer.keys = torch.zeros(1, 2, 3, 8)
