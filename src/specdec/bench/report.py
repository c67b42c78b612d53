"""The results folder: summary.csv, summary.md, PNG plots and manifest.json.

Why: a benchmark number is worth only as much as what it says about how it was
measured. Every report file is drawn from the one `BenchSummary` (so they agree
with each other and with the JSON line the CLI prints), and manifest.json
records what is needed to reproduce or distrust it: model, dtype, device,
library versions, CPU model, cores and threads, every setting, the question
ids, the prompts file's sha256, the command line and the git commit of the
source that ran (with whether its tree was dirty; "unknown" outside a git
checkout). The manifest is written when a run starts (status "running", so a
killed run can be resumed and checked) and again when it ends; a resumed run
lists every session that added rows, each with its own command and commit.

Plots use matplotlib's object API on the Agg canvas: no pyplot, no global
backend switch, no display needed.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, is_dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from specdec.backends.registry import describe_path, explain
from specdec.bench import sources
from specdec.bench.config import BASELINES
from specdec.bench.metrics import OVERALL, BenchSummary
from specdec.extras import installed_version
from specdec.models.machine import cpu_model, isa_flags

CSV_FIELDS = (
    "method", "category", "num_questions", "num_turns", "new_tokens", "wall_time_s", "tokens_per_s",
    "speedup_vs_plain", "speedup_vs_hf_greedy", "mat", "exact_match_plain", "exact_match_hf_greedy",
    "acceptance_rate", "retrieval_success",
)


def write_reports(out_dir: Path, rows: list[dict[str, Any]], summary: BenchSummary, context: dict[str, Any]) -> None:
    write_csv(out_dir / "summary.csv", summary)
    (out_dir / "summary.md").write_text(markdown_table(summary, context) + sources.markdown(rows), encoding="utf-8")
    plot_speedups(out_dir / "speedup.png", summary)
    plot_accepted_lengths(out_dir / "accepted_lengths.png", summary)
    write_manifest(out_dir, summary, context)


def write_manifest(out_dir: Path, summary: BenchSummary | None, context: dict[str, Any]) -> None:
    """manifest.json, replaced atomically (a kill never leaves half a manifest); summary None: the run is going on."""
    text = json.dumps(build_manifest(summary, context), indent=2, default=str) + "\n"
    tmp = out_dir / "manifest.json.tmp"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out_dir / "manifest.json")


def write_csv(path: Path, summary: BenchSummary) -> None:
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for label in summary.methods:
            for group in (*summary.categories, OVERALL):
                writer.writerow({"method": label, "category": group, **summary.stats[label][group]})


def _fmt(value: float | None, kind: str) -> str:
    if value is None:
        return "n/a"
    return {"x": f"{value:.2f}x", "%": f"{100 * value:.0f}%", "f1": f"{value:.1f}", "f2": f"{value:.2f}"}[kind]


def markdown_table(summary: BenchSummary, context: dict[str, Any]) -> str:
    config, target = context["config"], context["target"]
    header = (
        f"# specdec bench\n\nmodel `{target.name}` ({str(target.dtype).replace('torch.', '')}, {target.device}), "
        f"{len(context['question_ids'])} questions, max_new_tokens {config.max_new_tokens}, "
        f"temperature {config.temperature}, seed {config.seed}, torch threads {torch.get_num_threads()}, "
        f"chat template {'on' if context['chat'] else 'off'}.\n\n"
        "tokens/s: mean over questions of tokens/s (Spec-Bench); speedup: that mean / the baseline's; "
        "MAT: tokens per decoding forward pass (prefill left out, plain = 1.00); exact match: share of turns token-identical to the baseline.\n\n"
    )
    lines = [
        "| category | method | tokens/s | speedup vs plain | speedup vs hf-greedy | MAT | exact match vs plain "
        "| exact match vs hf-greedy |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for group in (*summary.categories, OVERALL):
        for label in summary.methods:
            m = summary.stats[label][group]
            name = f"**{group}**" if group == OVERALL else group
            lines.append(
                f"| {name} | `{label}` | {_fmt(m['tokens_per_s'], 'f1')} | {_fmt(m['speedup_vs_plain'], 'x')} "
                f"| {_fmt(m['speedup_vs_hf_greedy'], 'x')} | {_fmt(m['mat'], 'f2')} "
                f"| {_fmt(m['exact_match_plain'], '%')} | {_fmt(m['exact_match_hf_greedy'], '%')} |"
            )
    notes = "".join(f"\n- {note}" for note in summary.notes)
    return header + "\n".join(lines) + "\n" + (f"\nNotes:{notes}\n" if notes else "")


def _speedup_basis(summary: BenchSummary) -> tuple[str, str]:
    """The metric key and axis label of the speedup plot: vs plain, else vs hf-greedy, else tokens/s."""
    for baseline in BASELINES:
        if summary.baselines[baseline]:
            return "speedup_vs_" + baseline.replace("-", "_"), f"speedup vs {baseline}"
    return "tokens_per_s", "tokens/s"


def plot_speedups(path: Path, summary: BenchSummary) -> None:
    key, ylabel = _speedup_basis(summary)
    groups = (*summary.categories, OVERALL)
    fig = Figure(figsize=(max(6.0, 1.3 * len(groups) + 2), 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / max(len(summary.methods), 1)
    for i, label in enumerate(summary.methods):
        values = [summary.stats[label][g][key] or 0.0 for g in groups]
        xs = [g + (i - (len(summary.methods) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=label)
    if key != "tokens_per_s":
        ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(groups)), groups, rotation=20)
    ax.set_ylabel(ylabel)
    ax.set_title("speedup by category and method")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_accepted_lengths(path: Path, summary: BenchSummary) -> None:
    known = [label for label in summary.methods if summary.histograms[label]]
    fig = Figure(figsize=(4.0 * max(len(known), 1), 3.5))
    FigureCanvasAgg(fig)
    if not known:
        fig.text(0.5, 0.5, "no method reports accepted lengths", ha="center")
    for i, label in enumerate(known):
        hist = summary.histograms[label] or {}
        total = sum(hist.values())
        ax = fig.add_subplot(1, len(known), i + 1)
        ax.bar(list(hist), [v / total for v in hist.values()])
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(-0.6, max(max(hist, default=0), 1) + 0.6)
        ax.set_title(label, fontsize="small")
        ax.set_xlabel("accepted draft tokens per step")
        ax.set_ylabel("share of steps" if i == 0 else "")
    unknown = [label for label in summary.methods if not summary.histograms[label]]
    if unknown:
        fig.suptitle(f"not measured: {', '.join(unknown)}", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _utc(timestamp: float | None) -> str | None:
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat(timespec="seconds") if timestamp else None


def _git(args: list[str], cwd: Path) -> str | None:
    """stdout of one git command, or None when git is missing, fails or hangs."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def source_revision(package_dir: Path | None = None) -> dict[str, Any]:
    """{"commit": HEAD of the checkout specdec runs from, "dirty": uncommitted changes}; never raises.

    Only a checkout that *tracks* the package's files counts: an installed
    wheel inside some other repository (a venv in a clone) is "unknown", not
    that repository's commit. Untracked files that git does not ignore count
    as dirty; `dirty` is None when the commit is unknown.
    """
    here = package_dir or Path(__file__).resolve().parents[1]
    unknown: dict[str, Any] = {"commit": "unknown", "dirty": None}
    if not here.is_dir() or _git(["ls-files", "--error-unmatch", "__init__.py"], here) is None:
        return unknown
    commit = (_git(["rev-parse", "HEAD"], here) or "").strip()
    if not commit:
        return unknown
    status = _git(["status", "--porcelain"], here)
    return {"commit": commit, "dirty": bool(status.strip()) if status is not None else None}


def build_manifest(summary: BenchSummary | None, context: dict[str, Any]) -> dict[str, Any]:
    """The manifest of a run; `summary` None while it is going on (status "running")."""
    config, plan, target, assistant = context["config"], context["plan"], context["target"], context["assistant"]
    session, given = context["session"], bool(context.get("model_given"))
    return {
        "status": "running" if summary is None else "complete",
        "git": session["git"],
        "run_identity": context["identity"],
        "model": {"name": target.name, "dtype": str(target.dtype).replace("torch.", ""), "device": str(target.device),
                  "eos_token_ids": list(target.eos_token_ids), "pack": target.pack, "exact": target.exact,
                  "backend": target.backend, "given_by_caller": given, "path": describe_path(target),
                  "why": explain(target)},  # each setting's reason, as `specdec-hf doctor` prints it
        "draft_model": assistant.name if assistant is not None else None,
        "versions": {"specdec": installed_version("specdec"), "torch": torch.__version__,
                     "transformers": installed_version("transformers"), "python": platform.python_version()},
        "machine": {"cpu": cpu_model(), "isa": isa_flags(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "platform": platform.platform()},
        # a model the caller loaded (run_bench's `loaded`) stands in for settings.model, which was not loaded
        "settings": {**config.to_dict(), **({"model": None} if given else {})},
        "methods": [{"label": m.label, "name": m.name, "options": _options(m.config)} for m in plan.methods],
        "method_order": "rotated by one per question; turns interleaved across methods",
        "chat_template": context["chat"],
        "data": {"path": plan.data_path, "sha256": plan.data_sha256, "question_ids": list(context["question_ids"])},
        "command": session["command"],
        "started_utc": (context["sessions"][0] if context["sessions"] else session).get("started_utc"),
        "finished_utc": _utc(context.get("finished")),
        "sessions": [*context["sessions"], {**session, "finished_utc": _utc(context.get("finished"))}],
        "notes": list(summary.notes) if summary is not None else [],
    }


def new_session(command: str | None, started: float, session_id: str) -> dict[str, Any]:
    """This invocation's entry in the manifest's `sessions`: its id (also on its rows), command and commit."""
    return {"id": session_id, "command": command if command is not None else " ".join(sys.argv),
            "git": source_revision(), "started_utc": _utc(started)}


def _options(config: Any) -> dict[str, Any]:
    return asdict(config) if is_dataclass(config) else {}
