"""A proposer's top ids read back with the step's decisions (`verify`'s tops), run on the CPU.

On an accelerator every value the host reads waits for the device. LogitSpec reads the top-k of the
last logits (its next-next candidates), the recycle table the top-k at every verified node and
lookahead the best token along its Jacobi window, each once a step; with `Engine(one_transfer=True)` (the default on an accelerator) those ids come
back in the step's one transfer and the proposer reads no logits. Here the logits it is handed sit on
the meta device, which holds no values, so any read of them fails: the trees must still be the ones it
drafts from real logits.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import fresh_logitspec, fresh_recycle

from specdec.backends.torch.rows import BatchedTarget
from specdec.backends.torch.target import TargetModel
from specdec.engine.generation import GenerationConfig, ProposalContext
from specdec.engine.loop import Engine
from specdec.engine.uniforms import PositionUniforms
from specdec.engine.verify import Draws, verify
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method
from specdec.sampling import SamplingParams

PROMPT = "Repeat this list twice: apples, pears, plums, figs, dates, limes, kiwis, grapes."


def _ids(loaded, text: str) -> list[int]:  # noqa: ANN001 - LoadedModel
    return encode_prompt(loaded.tokenizer, text, chat=True)


def _trees(loaded, method: str, blind: bool, steps: int) -> list[tuple[list[int], list[int]]]:  # noqa: ANN001
    """`steps` trees of a fresh proposer, greedy: each verified and read back in one transfer; with `blind`
    the proposer is handed its logits on the meta device, beside the top ids that came back."""
    if method.startswith("logitspec"):
        proposer = fresh_logitspec(loaded, method)
    else:
        proposer = fresh_recycle(loaded, parse_method(method)) if method == "recycle" else parse_method(method).build(loaded)
    prompt = _ids(loaded, PROMPT)
    rows = BatchedTarget(TargetModel(loaded.model))
    _, logits, _ = rows.add(prompt)
    proposer.begin(prompt)
    tokens, top, drafted = [*prompt, int(logits.argmax())], None, []
    draws = Draws(SamplingParams(), None, PositionUniforms(None))
    for _ in range(steps):
        ctx = ProposalContext(tokens, logits, len(prompt), SamplingParams(), 8, last_top=top)
        tree = proposer.propose(ctx)
        drafted.append((tree.token_list, tree.parents.tolist()))
        [result] = verify(rows, [tree], [draws], one_transfer=True, tops=[proposer.top_wanted])
        if blind:
            result = dataclasses.replace(result, target_logits=result.target_logits.to("meta"))
        proposer.observe(result)
        tokens, logits, top = tokens + result.tokens, result.next_logits, result.next_top if blind else None
    return drafted


@pytest.mark.parametrize("method", ["logitspec", "logitspec:adaptive=false,recycle=true", "recycle", "lookahead"])
def test_drafts_from_the_read_back_top_ids_alone(default_model, method: str) -> None:
    with torch.inference_mode():
        seen = _trees(default_model, method, blind=False, steps=12)
        blind = _trees(default_model, method, blind=True, steps=12)
    assert blind == seen
    assert sum(len(tokens) > 1 for tokens, _ in seen) >= 3  # it drafted: candidates or recycled rows were read


def test_meta_logits_are_unreadable() -> None:
    """What the test above relies on: a proposer that read its logits' values would fail there."""
    with pytest.raises((NotImplementedError, RuntimeError)):
        torch.topk(torch.zeros(10).to("meta"), 3).indices.tolist()


def test_one_transfer_decodes_as_the_cpu_walk(default_model) -> None:
    """LogitSpec over a whole generation: one transfer a step (top ids included) against the CPU's lazy
    walk, the same tokens and the same tree at every step."""
    runs = []
    for one_transfer in (True, False):
        engine = Engine(default_model, one_transfer=one_transfer)
        out = engine.generate(
            _ids(default_model, PROMPT), fresh_logitspec(default_model, "logitspec"), GenerationConfig(48)
        )
        runs.append((out.token_ids, [(s.tree_size, s.num_accepted) for s in out.stats.steps]))
    assert runs[0] == runs[1]
    assert len(runs[0][1]) < 40  # it drafted and was accepted
