"""`run_bench`: several methods on the same prompts, timed fairly, reported side by side.

Why: a speedup measured in separate runs mostly measures the machine's mood.
So one process, one target model, one set of prompt ids; every method is warmed
up first; then the methods take turns on each prompt (A B C, then B C A on the
next question, ...) so drift and background load hit all of them alike, and
rotating the order keeps any "who runs first after a new prompt" effect from
favouring one method.

Invariants:
- everything the user can get wrong is checked by `prepare` before a model loads;
- each proposer is built once per method and reused (the engine calls `begin`);
- MT-bench's second turn is asked after the method's *own* first answer
  (Spec-Bench does the same), so its prompt may differ between methods;
- the same max_new_tokens, dtype, threads and seed for every method;
- responses.jsonl is written as turns finish, so a long run that is stopped
  keeps what it measured.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm import tqdm

from specdec.bench.baselines import HfContender
from specdec.bench.config import BASELINES, BenchConfig, BenchPlan, MethodSpec, prepare
from specdec.bench.metrics import BenchSummary, summarize
from specdec.bench.records import RunResult, from_engine, make_row, match_flags
from specdec.bench.report import write_reports
from specdec.data import Question
from specdec.engine import Engine, GenerationConfig
from specdec.models import LoadedModel, load_model
from specdec.prompts import encode_prompt
from specdec.sampling import SamplingParams

WARMUP_PROMPT = "Name three colours."
WARMUP_MAX_NEW_TOKENS = 16


class Contender(Protocol):
    def run(self, prompt_ids: list[int]) -> RunResult: ...


class SpecdecContender:
    """One of our methods: a proposer built once, run through the shared Engine."""

    def __init__(self, engine: Engine, spec: MethodSpec, settings: GenerationConfig) -> None:
        self.engine = engine
        self.proposer = spec.config.build(engine.loaded)
        self.settings = settings

    def run(self, prompt_ids: list[int]) -> RunResult:
        start = time.perf_counter()
        out = self.engine.generate(prompt_ids, self.proposer, self.settings)
        wall = time.perf_counter() - start
        return from_engine(out, len(prompt_ids), wall)


@dataclass(frozen=True)
class Prompting:
    tokenizer: Any
    chat: bool  # the chat template is applied

    def encode(self, turns: Sequence[str], answers: Sequence[str]) -> list[int]:
        """Prompt ids for the last of `turns`, after the earlier turns and this method's own answers."""
        messages = []
        for i, turn in enumerate(turns):
            messages.append({"role": "user", "content": turn})
            if i < len(turns) - 1:
                messages.append({"role": "assistant", "content": answers[i]})
        if not self.chat:  # plain text: the conversation's parts, one paragraph each
            text = "\n\n".join(m["content"] for m in messages if m["content"])
            return encode_prompt(self.tokenizer, text, chat=False)
        return encode_prompt(self.tokenizer, messages, chat=True)


def build_contenders(
    plan: BenchPlan, config: BenchConfig, loaded: LoadedModel, assistant: LoadedModel | None
) -> dict[str, Contender]:
    engine = Engine(loaded)
    sampling = SamplingParams(temperature=config.temperature, seed=config.seed)
    settings = GenerationConfig(max_new_tokens=config.max_new_tokens, sampling=sampling)
    contenders: dict[str, Contender] = {}
    for spec in plan.methods:
        if spec.is_hf:
            contenders[spec.label] = HfContender(
                spec.config, loaded, config.max_new_tokens, config.temperature, config.seed, assistant
            )
        else:
            contenders[spec.label] = SpecdecContender(engine, spec, settings)
    return contenders


def warm_up(contenders: dict[str, Contender], prompting: Prompting, runs: int, max_new_tokens: int) -> None:
    """Each method `runs` times on a short prompt, untimed, so one-off costs stay out of the results."""
    if runs <= 0:
        return
    prompt_ids = prompting.encode([WARMUP_PROMPT], [])
    for _ in range(runs):
        for contender in contenders.values():
            contender.run(prompt_ids)


def run_question(
    question: Question, index: int, contenders: dict[str, Contender], prompting: Prompting, bar: tqdm
) -> list[dict[str, Any]]:
    """All turns of one question for every method, interleaved turn by turn; returns its rows."""
    labels = list(contenders)
    shift = index % len(labels)
    order = labels[shift:] + labels[:shift]
    answers: dict[str, list[str]] = {label: [] for label in labels}
    rows: list[dict[str, Any]] = []
    for turn in range(len(question.turns)):
        results: dict[str, RunResult] = {}
        for label in order:
            prompt_ids = prompting.encode(question.turns[: turn + 1], answers[label])
            results[label] = contenders[label].run(prompt_ids)
            answers[label].append(results[label].text.strip())
            bar.update(1)
        flags = match_flags(results, BASELINES)
        rows.extend(make_row(label, question, turn + 1, results[label], flags[label]) for label in labels)
    return rows


def load_models(config: BenchConfig, plan: BenchPlan, loaded: LoadedModel | None) -> tuple[LoadedModel, LoadedModel | None]:
    target = loaded or load_model(config.model, dtype=config.dtype, device=config.device, cache_dir=config.cache_dir)
    assistant = None
    if plan.needs_assistant:
        assistant = load_model(config.draft_model, dtype=target.dtype, device=str(target.device),
                               cache_dir=config.cache_dir)
    return target, assistant


def run_bench(config: BenchConfig, loaded: LoadedModel | None = None, command: str | None = None) -> BenchSummary:
    """Run the benchmark; write responses.jsonl, summary.csv/.md, plots and manifest.json; return the summary.

    `loaded`: an already-loaded target model (config.model is then not loaded).
    `command`: the command line to record in the manifest.
    """
    plan = prepare(config)
    if config.threads:
        torch.set_num_threads(config.threads)
    target, assistant = load_models(config, plan, loaded)
    contenders = build_contenders(plan, config, target, assistant)
    prompting = Prompting(target.tokenizer, config.chat and bool(getattr(target.tokenizer, "chat_template", None)))
    out_dir = plan.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    warm_up(contenders, prompting, config.warmup, min(config.max_new_tokens, WARMUP_MAX_NEW_TOKENS))
    rows = _run_all(plan, contenders, prompting, out_dir / "responses.jsonl", config.progress)
    summary = summarize(rows, plan.labels, out_dir, run_notes(config))
    context = {"config": config, "plan": plan, "target": target, "assistant": assistant,
               "chat": prompting.chat, "command": command, "started": started, "finished": time.time()}
    write_reports(out_dir, rows, summary, context)
    return summary


def run_notes(config: BenchConfig) -> list[str]:
    """Caveats that belong next to the numbers."""
    notes = []
    if config.temperature > 0:
        notes.append(
            f"temperature {config.temperature}: outputs are samples, so exact match is reported but not expected; "
            "hf-* baselines sample too (same temperature, top-k/top-p off, torch.manual_seed(seed) per call)"
        )
    return notes


def _run_all(
    plan: BenchPlan, contenders: dict[str, Contender], prompting: Prompting, path: Path, progress: bool
) -> list[dict[str, Any]]:
    total = sum(len(q.turns) for q in plan.questions) * len(contenders)
    rows: list[dict[str, Any]] = []
    with path.open("w", encoding="utf-8") as file, tqdm(
        total=total, desc="bench", unit="run", file=sys.stderr, disable=not progress
    ) as bar:
        for index, question in enumerate(plan.questions):
            question_rows = run_question(question, index, contenders, prompting, bar)
            for row in question_rows:
                file.write(json.dumps(row) + "\n")
            file.flush()
            rows.extend(question_rows)
    return rows
