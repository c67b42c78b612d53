"""`specdec analyze`: rank arithmetic on hand-made logits, and a small real run."""

from __future__ import annotations

import json

import pytest
import torch

from specdec.analyze import AnalyzeConfig, PromptAnalysis, next_next_ranks, run_analysis, summarize
from specdec.data import load_questions
from specdec.engine.loop import Engine


def test_next_next_ranks():
    logits = torch.tensor([[0.1, 0.9, 0.5, 0.2], [3.0, 2.0, 1.0, 0.0]])
    ranks = next_next_ranks(logits, torch.tensor([2, 3]))
    assert ranks.tolist() == [1, 3]


def test_summarize_weights_by_steps():
    a = PromptAnalysis("1", "qa", 10, {1: 2, 10: 5, 60: 9}, 4, 9)
    b = PromptAnalysis("2", "rag", 30, {1: 3, 10: 15, 60: 30}, 30, 30)
    table = summarize([a, b])
    assert table["qa"]["top10"] == 0.5
    assert table["overall"]["top60"] == 39 / 40
    assert table["overall"]["pld_retrieval"] == 34 / 40


@pytest.mark.slow
def test_small_real_run(default_model, tmp_path, spec_bench_subset):
    """In the full tier (~9 s here: a summarization prompt's prefill and two analyses)."""
    questions = load_questions(spec_bench_subset, categories=["summarization", "qa"], per_category=1)
    table = run_analysis(Engine(default_model), questions, AnalyzeConfig(max_new_tokens=24), tmp_path / "out")
    for name in ("analysis.md", "analysis.json", "analysis.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    record = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert len(record["prompts"]) == 2
    for row in record["prompts"]:
        hits = {int(k): v for k, v in row["topk_hits"].items()}
        assert hits[1] <= hits[10] <= hits[60] <= row["num_steps"]
        # LogitSpec retrieves for the root too, so it finds a draft wherever PLD does.
        assert row["pld_hits"] <= row["logitspec_hits"] <= row["num_steps"]
    assert 0.0 <= table["overall"]["pld_retrieval"] <= table["overall"]["logitspec_retrieval"] <= 1.0
