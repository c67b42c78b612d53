"""`read_back`: several small tensors brought to the host in one transfer give what each `.tolist()` gives."""

from __future__ import annotations

import torch

from specdec.engine.read_back import read_back


def test_each_tensor_comes_back_as_its_tolist() -> None:
    data = torch.Generator().manual_seed(0)
    log_probs = torch.randn(3, 4, generator=data).log_softmax(-1)  # float32 with every digit used
    ids = torch.randint(0, 151_936, (3, 4), generator=data)  # a large vocabulary's ids
    token, prob = torch.tensor(151_935), log_probs.exp()[1, 2]
    got = read_back(log_probs, ids, token, prob, torch.zeros(0, dtype=torch.int64))
    assert got == [log_probs.tolist(), ids.tolist(), 151_935, prob.item(), []]
    assert all(type(i) is int for row in got[1] for i in row) and type(got[2]) is int
    assert type(got[3]) is float
