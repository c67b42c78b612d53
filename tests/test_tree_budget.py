"""The heads' candidate scores (`specdec.proposers.tree_budget.top_log_probs`) against torch's log-softmax and topk."""

from __future__ import annotations

import pytest
import torch

from specdec.kernels import q4_kernel
from specdec.proposers.tree_budget import top_log_probs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_log_probs_are_the_log_softmax_at_the_top_ids(dtype):
    q4_kernel.load_extension()  # with it: one pass over each row; without: torch.topk (the same contract)
    logits = (torch.randn(5, 4099, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    logp, ids = top_log_probs(logits, 6)
    full = torch.log_softmax(logits.float(), dim=-1)
    assert ids.shape == logp.shape == (5, 6) and logp.dtype == torch.float32
    want, _ = full.topk(6, dim=-1)
    torch.testing.assert_close(logp, want, rtol=0, atol=1e-5)  # best first, the same values (ties aside)
    torch.testing.assert_close(logp, full.gather(-1, ids), rtol=0, atol=1e-5)  # each value is its id's


def test_a_row_without_k_scores_falls_back_to_torch():
    logits = torch.full((2, 8), float("nan"))
    logits[0] = torch.arange(8.0)
    logp, ids = top_log_probs(logits, 3)
    assert ids[0].tolist() == [7, 6, 5] and torch.isfinite(logp[0]).all()
