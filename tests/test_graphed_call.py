"""`GraphedCall`: a head's small fixed-shape step, replayed as a CUDA graph on a GPU, eager on the CPU.

CI has no GPU: these check what the CPU runs (the eager fallback, its key and its report) and that
Hydra's levels padded to one shape (what a graph a level needs) draft the tree the unpadded levels do.
"""

from __future__ import annotations

import pytest
import torch

from specdec.backends.torch.graphed_call import GraphedCall


def test_without_cuda_every_call_runs_eagerly_with_its_key() -> None:
    seen = []

    def step(key: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append(key)
        return x[:key] * 2, x.sum()[None]

    call = GraphedCall(step)
    x = torch.arange(6.0)
    for key in (2, 3, 2):
        doubled, total = call(x, key=key)
        assert torch.equal(doubled, x[:key] * 2) and total.item() == 15.0
    assert seen == [2, 3, 2] and call.eager_calls == 3 and call.replays == 0
    assert call.mode == ("cuda-graphs" if torch.cuda.is_available() else "eager")
    assert not call.graphs_for(x)
    assert GraphedCall(step, use_graphs=False).mode == "eager"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is absent")
def test_graphs_asked_for_without_cuda_are_refused() -> None:
    with pytest.raises(ValueError, match="CUDA"):
        GraphedCall(lambda key, x: x, use_graphs=True)
