"""Small device tensors read back to the host together: one wait on an accelerator.

Why: every read of a value on a GPU (`.tolist()`, `int(...)`, `.item()`) waits for the
device's stream to drain. A proposer often needs two results of one computation (a
head's top-k log-probabilities and their token ids; a draft's token and its
probability): read one after the other, they wait twice. Concatenated first, they
come back in one transfer.

Invariant: each tensor comes back as its own `.tolist()` would give it, values and
nesting: every value travels as float64, which holds a float32 or a token id
(< 2**53) exactly, and integer tensors come back as ints.
"""

from __future__ import annotations

import torch


def read_back(*tensors: torch.Tensor) -> list:
    """Each tensor's `.tolist()`, all brought to the host in one transfer."""
    flat = torch.cat([tensor.reshape(-1).double() for tensor in tensors]).cpu().numpy()
    out, at = [], 0
    for tensor in tensors:
        part = flat[at : at + tensor.numel()].reshape(tensor.shape)
        out.append((part if tensor.is_floating_point() else part.astype("int64")).tolist())
        at += tensor.numel()
    return out
