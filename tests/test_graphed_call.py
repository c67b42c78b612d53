"""`GraphedCall`: a head's small fixed-shape step, replayed as a CUDA graph on a GPU, eager on the CPU.

CI has no GPU: these check what the CPU runs (the eager fallback, its key and its report) and that
Hydra's levels padded to one shape (what a graph a level needs) draft the tree the unpadded levels do,
and that the heads' proposers share one graphed step, so its graphs are captured once.
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


@pytest.mark.parametrize("method", ["medusa", "hydra", "eagle"])
def test_proposers_on_one_model_share_the_heads_graphs(default_model, method: str) -> None:
    """Built once a request (the API) or once a pooled proposer (the server), a head's proposers replay one
    graphed step kept beside the heads, so a GPU captures its graphs once a process; another top-k shapes
    other graphs."""
    from dataclasses import replace

    from specdec.proposers import parse_method

    config = parse_method(method)
    steps = [getattr(config.build(default_model), "_tree_call" if method == "eagle" else "step") for _ in range(2)]
    wider = replace(config, topk=config.topk + 1).build(default_model)
    assert steps[0] is steps[1]
    assert getattr(wider, "_tree_call" if method == "eagle" else "step") is not steps[0]
