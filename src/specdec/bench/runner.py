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
- responses.jsonl gets each (question, turn, method) row the moment that run
  completes (one line, flushed), so a run that is stopped loses at most the
  pair in flight and `--resume` continues it (`specdec.bench.resume`); once
  all rows are in, the file is rewritten with the final exact-match flags.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Protocol

import torch
from tqdm import tqdm

from specdec.backends.registry import load_model
from specdec.bench import sources
from specdec.bench.baselines import HfContender
from specdec.bench.config import BASELINES, BenchConfig, BenchPlan, MethodSpec, prepare
from specdec.bench.metrics import BenchSummary, summarize
from specdec.bench.records import PairKey, RunResult, fill_match_flags, from_engine, make_row, match_fields
from specdec.bench.report import new_session, write_manifest, write_reports
from specdec.bench.resume import RESPONSES, ResumeState, open_resume, run_identity
from specdec.data import Question
from specdec.engine.floor import Floor
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import LoadedModel
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
        # A scope of its own: state learned across requests (session store, recycle table) comes
        # from this method's earlier requests only, never from another method's run of the same prompt.
        self.proposer = spec.config.build(dataclasses.replace(engine.loaded, state_scope=spec.label))
        self.settings = settings
        # A floor of its own too: a floor keeps its rates by proposer class, so two variants of one method
        # (`logitspec`, `logitspec:k=8`) would each start a prompt from the rates the other just left.
        self.floor = Floor()

    def run(self, prompt_ids: list[int]) -> RunResult:
        before = sources.snapshot(self.proposer)  # outside the stopwatch
        self.engine.floor = self.floor  # the shared engine gates this method by its own rates
        start = time.perf_counter()
        out = self.engine.generate(prompt_ids, self.proposer, self.settings)
        wall = time.perf_counter() - start
        counts = sources.difference(before, sources.snapshot(self.proposer))
        return dataclasses.replace(from_engine(out, len(prompt_ids), wall), source_counts=counts)


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
    # keep_prompts off: the methods take turns on each prompt, and each must pay its own prefill, as the
    # transformers baselines do, or whoever ran first would time the prefill for all of them. The floor is
    # each contender's own (`SpecdecContender.floor`), set before its runs.
    engine = Engine(loaded, floor=Floor(), keep_prompts=False)
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


class RowSink:
    """Appends each finished row to responses.jsonl at once (one line, flushed) and keeps it."""

    def __init__(self, file: IO[str], session_id: str, bar: tqdm) -> None:
        self.file, self.session_id, self.bar = file, session_id, bar
        self.rows: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any]) -> None:
        row = {**row, "session": self.session_id, "completed_utc": _now_utc()}
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()  # a kill from now on loses nothing of this pair
        self.rows.append(row)
        self.bar.update(1)


def run_question(
    question: Question,
    index: int,
    contenders: dict[str, Contender],
    prompting: Prompting,
    done: Mapping[PairKey, dict[str, Any]],
    sink: RowSink,
) -> None:
    """All turns of one question for every method, interleaved turn by turn; pairs in `done` are not run again.

    A skipped pair's stored answer stands in for a new one, so a second turn
    always follows the method's own first answer, in whichever session it ran.
    """
    labels = list(contenders)
    shift = index % len(labels)
    order = labels[shift:] + labels[:shift]
    answers: dict[str, list[str]] = {label: [] for label in labels}
    for turn in range(1, len(question.turns) + 1):
        turn_rows = {label: done.get((question.question_id, turn, label)) for label in labels}
        for label in order:
            if turn_rows[label] is not None:
                answers[label].append(str(turn_rows[label]["text"]).strip())
                continue
            prompt_ids = prompting.encode(question.turns[:turn], answers[label])
            result = contenders[label].run(prompt_ids)
            answers[label].append(result.text.strip())
            flags = match_fields(result.token_ids, turn_rows, BASELINES)
            turn_rows[label] = make_row(label, question, turn, result, flags)
            sink.add(turn_rows[label])


def load_models(config: BenchConfig, plan: BenchPlan, loaded: LoadedModel | None) -> tuple[LoadedModel, LoadedModel | None]:
    target = loaded or load_model(config.model)
    assistant = None
    if plan.needs_assistant:
        assistant = load_model(config.draft_model, dtype=target.dtype, device=str(target.device),
                               cache_dir=config.model.cache_dir)
    return target, assistant


def run_bench(config: BenchConfig, loaded: LoadedModel | None = None, command: str | None = None) -> BenchSummary:
    """Run the benchmark; write responses.jsonl, summary.csv/.md, plots and manifest.json; return the summary.

    `loaded`: an already-loaded target model, e.g. the user's own transformers model object wrapped as it
    is (`specdec.load_model(model, tokenizer=tok)`); config.model is then not loaded and does not apply
    (the loaded model's own pack, exact and backend do), and the manifest says so.
    `command`: the command line to record in the manifest.
    With `config.resume`, the pairs already in that folder are skipped and the
    summary covers its old rows and the new ones (see `specdec.bench.resume`).
    """
    plan = prepare(config)
    identity = run_identity(config, plan, loaded)
    state = open_resume(plan.out_dir, identity) if config.resume is not None else ResumeState()
    if config.threads:
        torch.set_num_threads(config.threads)
    target, assistant = load_models(config, plan, loaded)
    contenders = build_contenders(plan, config, target, assistant)
    prompting = Prompting(target.tokenizer, config.chat and bool(getattr(target.tokenizer, "chat_template", None)))
    out_dir = plan.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    session = new_session(command, started, uuid.uuid4().hex[:12])
    old_ids = [str(row["question_id"]) for row in state.rows]
    context = {"config": config, "plan": plan, "target": target, "assistant": assistant, "chat": prompting.chat,
               "identity": identity, "session": session, "sessions": list(state.sessions),
               "model_given": loaded is not None,
               "question_ids": list(dict.fromkeys([*old_ids, *(q.question_id for q in plan.questions)]))}
    write_manifest(out_dir, None, context)  # before any row: a killed run can be resumed and checked
    if config.progress:
        print(f"specdec bench: writing {out_dir} (if stopped, continue with --resume {out_dir})", file=sys.stderr)
    done = state.done
    pending = sum(1 for q in plan.questions for t in range(1, len(q.turns) + 1) for label in contenders
                  if (q.question_id, t, label) not in done)
    if pending:
        warm_up(contenders, prompting, config.warmup, min(config.max_new_tokens, WARMUP_MAX_NEW_TOKENS))
    new_rows = _run_all(plan, contenders, prompting, done, out_dir / RESPONSES, session["id"], pending,
                        config.progress)
    rows = fill_match_flags([*state.rows, *new_rows], BASELINES)
    _rewrite_rows(out_dir / RESPONSES, rows)
    summary = summarize(rows, plan.labels, out_dir, run_notes(config))
    context["finished"] = time.time()
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
    plan: BenchPlan,
    contenders: dict[str, Contender],
    prompting: Prompting,
    done: Mapping[PairKey, dict[str, Any]],
    path: Path,
    session_id: str,
    pending: int,
    progress: bool,
) -> list[dict[str, Any]]:
    """Every pair not in `done`, each row appended to `path` the moment it completes; returns the new rows."""
    with path.open("a", encoding="utf-8") as file, tqdm(
        total=pending, desc="bench", unit="run", file=sys.stderr, disable=not progress
    ) as bar:
        sink = RowSink(file, session_id, bar)
        for index, question in enumerate(plan.questions):
            run_question(question, index, contenders, prompting, done, sink)
    return sink.rows


def _rewrite_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """responses.jsonl with the final match flags, replaced atomically (the appended file stands until then)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def _now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")
