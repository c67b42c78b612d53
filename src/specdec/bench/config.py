"""Benchmark settings, and their validation before any model is loaded.

Why a module of its own: a benchmark run is long, so every mistake a user can
make (an unknown method or option, an empty or malformed prompts file, a
results folder that already holds results, an hf-assisted run without a draft
model) must be refused in one line *before* the first model is loaded.
`prepare(config)` does all of that and returns a `BenchPlan`: the questions,
the parsed methods and the results folder, nothing loaded yet.

Invariants:
- the method list is parsed once, here; every method is either one of ours (a
  validated proposer config from `specdec.proposers`) or a transformers
  reference baseline (`HfBaseline`);
- method labels are unique (a label is the method string in canonical form);
- an existing, non-empty results folder is never written into, except by
  `resume`, which continues a run there (see `specdec.bench.resume`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specdec.choices import ModelSpec
from specdec.data import DataError, Question, default_questions_path, load_questions
from specdec.models import default_device, resolve_dtype
from specdec.proposers import METHODS, MethodError, make_config, split_method

# Shown when --methods is not given; names that are not registered yet are left out.
DEFAULT_METHODS = ("plain", "hf-greedy", "hf-pld", "pld", "logitspec")
BASELINES = ("plain", "hf-greedy")  # speedups and exact match are reported against these


class BenchConfigError(ValueError):
    """A benchmark setting that cannot work (reported before any model is loaded)."""


@dataclass(frozen=True)
class HfBaseline:
    """A reference run of transformers' own `model.generate` (greedy, prompt lookup or assisted)."""

    name: str  # hf-greedy, hf-pld or hf-assisted
    num_tokens: int | None = None  # hf-pld: prompt_lookup_num_tokens; hf-assisted: num_assistant_tokens
    max_ngram: int | None = None  # hf-pld: max_matching_ngram_size


# name -> {option: default}; the defaults are transformers' own (hf-pld: the issue's 10 tokens).
HF_BASELINES: dict[str, dict[str, int]] = {
    "hf-greedy": {},
    "hf-pld": {"num_tokens": 10, "max_ngram": 2},
    "hf-assisted": {"num_tokens": 20},
}


@dataclass(frozen=True)
class MethodSpec:
    label: str  # canonical method string: name or name:opt=value,...
    name: str
    config: Any  # a proposer config (ours) or an HfBaseline

    @property
    def is_hf(self) -> bool:
        return isinstance(self.config, HfBaseline)


@dataclass(frozen=True)
class BenchConfig:
    """Everything a benchmark run needs; the CLI builds one from its options."""

    # the target; its pack, exact and backend set how our methods verify (transformers' baselines run the
    # model as loaded, on torch)
    model: ModelSpec = ModelSpec()
    methods: tuple[str, ...] | None = None  # None: DEFAULT_METHODS that exist
    data: str | None = None  # None: Spec-Bench (specdec.data.default_questions_path)
    categories: tuple[str, ...] | None = None
    per_category: int | None = None
    limit: int | None = None
    chat: bool = True  # apply the chat template when the tokenizer has one
    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    threads: int | None = None
    draft_model: str | None = None
    warmup: int = 1  # warm-up runs per method, on a short prompt, before timing
    out: str | None = None  # None: results/bench-<UTC timestamp>[-n]
    resume: str | None = None  # a results folder to continue (skips the pairs it holds); replaces `out`
    results_root: str = "results"
    progress: bool = True

    def __post_init__(self) -> None:
        positive = {"max_new_tokens": self.max_new_tokens, "per_category": self.per_category,
                    "limit": self.limit, "threads": self.threads}
        for name, value in positive.items():
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise BenchConfigError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.model, ModelSpec):
            raise BenchConfigError(f"model must be a ModelSpec, got {type(self.model).__name__}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise BenchConfigError(f"warmup must be an integer >= 0, got {self.warmup!r}")
        if not self.temperature >= 0:
            raise BenchConfigError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if self.methods is not None and not self.methods:
            raise BenchConfigError("the method list is empty")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class BenchPlan:
    methods: tuple[MethodSpec, ...]
    questions: tuple[Question, ...]
    out_dir: Path
    data_path: str
    data_sha256: str  # of the prompts file: a resumed run must read the same questions

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(m.label for m in self.methods)

    @property
    def needs_assistant(self) -> bool:
        return any(m.name == "hf-assisted" for m in self.methods)


def split_method_list(text: str) -> tuple[str, ...]:
    """`plain,pld,logitspec:k=60,budget=32` -> ("plain", "pld", "logitspec:k=60,budget=32").

    A comma separates methods, except that a `key=value` item without a colon
    continues the options of the method before it.
    """
    specs: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if "=" in item and ":" not in item:
            if not specs or ":" not in specs[-1]:
                raise BenchConfigError(f"option {item!r} does not follow a method with options (name:key=value)")
            specs[-1] = f"{specs[-1]},{item}"
        else:
            specs.append(item)
    if not specs:
        raise BenchConfigError("the method list is empty")
    return tuple(specs)


def _canonical(name: str, options: dict[str, str]) -> str:
    return name if not options else name + ":" + ",".join(f"{k}={v}" for k, v in options.items())


def _hf_baseline(name: str, options: dict[str, str]) -> HfBaseline:
    allowed = HF_BASELINES[name]
    values: dict[str, int] = dict(allowed)
    for key, raw in options.items():
        if key not in allowed:
            listed = ", ".join(sorted(allowed)) or "none"
            raise MethodError(f"{name}: unknown option {key!r}; options: {listed}")
        try:
            values[key] = int(raw)
        except ValueError:
            raise MethodError(f"{name}: option {key} must be int, got {raw!r}") from None
        if values[key] <= 0:
            raise MethodError(f"{name}: option {key} must be positive, got {raw!r}")
    return HfBaseline(name, values.get("num_tokens"), values.get("max_ngram"))


def parse_method_spec(spec: str) -> MethodSpec:
    """One method string -> MethodSpec; unknown names and options raise MethodError."""
    name, options = split_method(spec)
    if name in HF_BASELINES:
        return MethodSpec(_canonical(name, options), name, _hf_baseline(name, options))
    if name not in METHODS:
        known = ", ".join([*sorted(METHODS), *HF_BASELINES])
        raise MethodError(f"unknown method {name!r}; known methods: {known}")
    return MethodSpec(_canonical(name, options), name, make_config(name, options))


def parse_methods(specs: tuple[str, ...] | None) -> tuple[MethodSpec, ...]:
    chosen = specs if specs is not None else tuple(m for m in DEFAULT_METHODS if m in METHODS or m in HF_BASELINES)
    methods = tuple(parse_method_spec(s) for s in chosen)
    labels = [m.label for m in methods]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise BenchConfigError(f"methods listed more than once: {', '.join(duplicates)}")
    return methods


def default_out_dir(root: str | Path, now: datetime | None = None) -> Path:
    """results/bench-<UTC timestamp>, with -2, -3, ... appended if that name is taken."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    base = Path(root) / f"bench-{stamp}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def check_out_dir(out: str | Path) -> Path:
    path = Path(out)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise BenchConfigError(f"results folder {path} exists and is not empty; choose another --out")
    return path


def prepare(config: BenchConfig) -> BenchPlan:
    """Validate every setting and load the prompts; raises a ValueError subclass, loads no model."""
    methods = parse_methods(config.methods)
    if any(m.name == "hf-assisted" for m in methods) and not config.draft_model:
        raise BenchConfigError("hf-assisted needs an assistant model: give --draft-model")
    try:
        resolve_dtype(config.model.dtype, config.model.device or default_device())
    except Exception as err:  # ModelLoadError is not a ValueError; report it as bad input
        raise BenchConfigError(str(err)) from None
    questions = load_questions(config.data, config.categories, config.per_category, config.limit)
    if not questions:
        raise DataError("no questions left after --categories / --per-category / --limit")
    data_path = Path(config.data) if config.data else default_questions_path()
    digest = hashlib.sha256(data_path.read_bytes()).hexdigest()
    return BenchPlan(methods, tuple(questions), choose_out_dir(config), str(data_path), digest)


def choose_out_dir(config: BenchConfig) -> Path:
    """`resume` (a folder that may hold a run), else `out` (must be empty), else a new timestamped folder."""
    if config.resume is not None:
        if config.out is not None and Path(config.out) != Path(config.resume):
            raise BenchConfigError("give --out DIR for a new run or --resume DIR to continue one, not both")
        path = Path(config.resume)
        if path.exists() and not path.is_dir():
            raise BenchConfigError(f"cannot resume {path}: it is not a folder")
        return path
    return check_out_dir(config.out) if config.out else default_out_dir(config.results_root)
