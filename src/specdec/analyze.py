"""`specdec analyze`: do LogitSpec's two observations hold on these prompts and this model?

LogitSpec (arXiv 2507.01449) rests on two measurable claims:
(a) the last logit, which yields the next token, also ranks the *next-next* token
    high (the paper's Figure 2: top-1 / top-10 / top-60 hit rates);
(b) so retrieving for the next-next candidates finds a draft far more often than
    prompt lookup alone (the paper's Table 3: retrieval success 62.7-69.5% for
    PLD, 97.6-99.4% for LogitSpec).

Both are measured along the model's own greedy output: one plain greedy
generation per prompt, then one teacher-forced forward pass over prompt + output
for the logits at every position. A "step" is every output position t whose
next-next token exists (t + 1 < output length): the root is output[t], drawn from
the logits at the position before it.

Retrieval success counts an n-gram match (any m from max_ngram down to 1): PLD
for context + root; LogitSpec for context + root or for context + root + any of
the top-k candidates. A bare candidate with nothing retrieved does not count.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from specdec.backends.registry import scores_every_position
from specdec.data import Question
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.prompts import encode_prompt
from specdec.proposers.logitspec.retrieval import retrieve
from specdec.proposers.ngram_index import NGramIndex
from specdec.proposers.plain import PlainProposer

TOP_KS = (1, 10, 60)


@dataclass(frozen=True)
class AnalyzeConfig:
    max_new_tokens: int = 128
    k: int = 60  # LogitSpec's next-next candidates
    max_ngram: int = 3
    chat: bool = True


@dataclass(frozen=True)
class PromptAnalysis:
    question_id: str
    category: str
    num_steps: int
    topk_hits: dict[int, int]  # k -> steps whose next-next token is in the top-k of the last logit
    pld_hits: int  # steps where prompt lookup retrieved a draft
    logitspec_hits: int  # steps where LogitSpec retrieved a draft (root or any candidate)


def next_next_ranks(logits: torch.Tensor, next_next: torch.Tensor) -> torch.Tensor:
    """Rank (0 = top) of each true next-next token in its row. logits [T, V], next_next [T] int64."""
    chosen = logits.gather(1, next_next[:, None])  # [T, 1]
    return (logits > chosen).sum(dim=1)  # [T]


def analyze_prompt(engine: Engine, question: Question, config: AnalyzeConfig) -> PromptAnalysis:
    prompt = encode_prompt(engine.tokenizer, question.turns[0], chat=config.chat)
    output = engine.generate(prompt, PlainProposer(), GenerationConfig(config.max_new_tokens)).token_ids
    num_steps = len(output) - 1
    if num_steps < 1:
        return PromptAnalysis(question.question_id, question.category, 0, dict.fromkeys(TOP_KS, 0), 0, 0)
    target = engine.target
    target.reset()
    all_logits = target.append(prompt + output)  # [P + T, V]
    # Row P - 1 + t produced output[t] (the root of step t); its next-next token is output[t + 1].
    rows = all_logits[len(prompt) - 1 : len(prompt) - 1 + num_steps].float()
    ranks = next_next_ranks(rows, torch.tensor(output[1:], dtype=torch.int64))
    topk_hits = {k: int((ranks < k).sum()) for k in TOP_KS}
    index = NGramIndex(config.max_ngram)
    index.extend(prompt)
    pld_hits = logitspec_hits = 0
    for t in range(num_steps):
        index.extend(output[t : t + 1])
        context = index.tokens  # prompt + output[: t + 1], the root last
        found = retrieve(index, context, rows[t], config.k, 1, 1, keep_self=True)
        pld_hits += found.root_ngram > 0
        logitspec_hits += found.root_ngram > 0 or any(m > 0 for m in found.cand_ngrams)
    return PromptAnalysis(question.question_id, question.category, num_steps, topk_hits, pld_hits, logitspec_hits)


def summarize(results: Sequence[PromptAnalysis]) -> dict[str, dict[str, float]]:
    """Per category (and "overall"): top-k hit rates and retrieval success, as shares of steps."""
    groups: dict[str, list[PromptAnalysis]] = {}
    for r in results:
        groups.setdefault(r.category, []).append(r)
    groups["overall"] = list(results)
    table = {}
    for name, rows in groups.items():
        steps = sum(r.num_steps for r in rows) or 1
        entry = {f"top{k}": sum(r.topk_hits[k] for r in rows) / steps for k in TOP_KS}
        entry["pld_retrieval"] = sum(r.pld_hits for r in rows) / steps
        entry["logitspec_retrieval"] = sum(r.logitspec_hits for r in rows) / steps
        entry["steps"] = steps
        table[name] = entry
    return table


def markdown_table(table: dict[str, dict[str, float]]) -> str:
    head = "| category | steps | next-next in top-1 | top-10 | top-60 | PLD retrieval | LogitSpec retrieval |"
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|"]
    for name, e in table.items():
        lines.append(
            f"| {name} | {int(e['steps'])} | {e['top1']:.1%} | {e['top10']:.1%} | {e['top60']:.1%} "
            f"| {e['pld_retrieval']:.1%} | {e['logitspec_retrieval']:.1%} |"
        )
    return "\n".join(lines)


def plot(table: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(table)
    series = [("top1", "next-next in top-1"), ("top10", "top-10"), ("top60", "top-60"),
              ("pld_retrieval", "PLD retrieval"), ("logitspec_retrieval", "LogitSpec retrieval")]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for i, (key, label) in enumerate(series):
        xs = [j + (i - len(series) / 2 + 0.5) * width for j in range(len(names))]
        ax.bar(xs, [100 * table[n][key] for n in names], width, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("% of decoding steps")
    ax.set_ylim(0, 105)
    ax.set_title("Next-next token in the last logit's top-k, and retrieval success (greedy output)")
    ax.legend(fontsize=8, ncols=5, loc="lower center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_analysis(engine: Engine, questions: Sequence[Question], config: AnalyzeConfig, out_dir: Path) -> dict:
    """Analyse every question, write analysis.md / analysis.json / analysis.png to out_dir; return the table."""
    if not scores_every_position(engine.target):
        raise ValueError("analyze reads every position's logits from the transformers model: load it with "
                         f"backend 'torch' (not {engine.loaded.backend!r})")
    out_dir.mkdir(parents=True, exist_ok=False)
    start = time.perf_counter()
    results = [analyze_prompt(engine, q, config) for q in tqdm(questions, desc="analyze", unit="prompt")]
    table = summarize(results)
    (out_dir / "analysis.md").write_text(markdown_table(table) + "\n")
    record = {"config": asdict(config), "table": table, "prompts": [asdict(r) for r in results],
              "wall_time_s": time.perf_counter() - start}
    (out_dir / "analysis.json").write_text(json.dumps(record, indent=1))
    plot(table, out_dir / "analysis.png")
    return table
