"""`specdec bench`: a small real run, checked against its own responses.jsonl.

Every figure in the summary is recomputed here from the raw rows (token ids,
wall times, forward passes), independently of specdec.bench.metrics, and our
greedy plain decoding must be token-identical to transformers' greedy generate
in fp32. Bad input must be refused before any model is loaded. No timing
assertions: the machine is shared.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from statistics import mean

import pytest

from specdec.bench import BenchConfig, BenchConfigError, run_bench, runner, split_method_list
from specdec.bench.report import source_revision
from specdec.bench.resume import read_responses
from specdec.choices import ModelSpec
from specdec.cli import main
from specdec.data import DataError, load_questions
from specdec.prompts import encode_prompt
from specdec.proposers import METHODS, MethodError

MAX_NEW_TOKENS = 16
QUESTIONS = [
    {
        "question_id": 81,
        "category": "writing",  # an MT-bench subcategory: two turns
        "turns": ["Write two short sentences about the sea.", "Now say the same thing in one sentence."],
    },
    {
        "question_id": 301,
        "category": "summarization",
        "turns": [
            "Summarize this text. The old mill stood by the river. The old mill ground wheat for the village. "
            "Every morning the miller opened the old mill and every evening the miller closed the old mill."
        ],
    },
]
FILES = ("responses.jsonl", "summary.csv", "summary.md", "speedup.png", "accepted_lengths.png", "manifest.json")


def write_questions(path: Path, questions: list[dict]) -> Path:
    path.write_text("".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8")
    return path


def read_rows(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "responses.jsonl").read_text().splitlines()]

NO_MODEL = ModelSpec("/no/such/model")


def methods_under_test() -> tuple[str, ...]:
    return ("plain", "hf-greedy", "pld") if "pld" in METHODS else ("plain", "hf-greedy")


@pytest.fixture(scope="module")
def bench_run(default_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    config = BenchConfig(
        data=str(write_questions(tmp / "questions.jsonl", QUESTIONS)),
        methods=methods_under_test(),
        max_new_tokens=MAX_NEW_TOKENS,
        warmup=0,  # timing is not what these tests check
        out=str(tmp / "results"),
        progress=False,
    )
    summary = run_bench(config, loaded=default_model, command="pytest")
    return summary, Path(summary.out_dir), read_rows(Path(summary.out_dir))


def recompute(rows: list[dict], method: str) -> dict:
    """The summary figures of one method, from the rows alone (Spec-Bench: per question, all turns)."""
    mine = [r for r in rows if r["method"] == method]
    speeds = []
    for qid in dict.fromkeys(r["question_id"] for r in mine):
        turns = [r for r in mine if r["question_id"] == qid]
        speeds.append(sum(r["new_tokens"] for r in turns) / sum(r["wall_time_s"] for r in turns))
    by_key = {(r["method"], r["question_id"], r["turn"]): r["token_ids"] for r in rows}
    same = {
        base: mean(by_key[(method, r["question_id"], r["turn"])] == by_key[(base, r["question_id"], r["turn"])]
                   for r in mine)
        for base in ("plain", "hf-greedy") if any(m == base for m, _, _ in by_key)
    }
    return {
        "tokens_per_s": mean(speeds),
        # The engine's MAT: the prefill's pass and the token it yields are left out.
        "mat": sum(r["new_tokens"] - 1 for r in mine) / sum(r["forward_passes"] - 1 for r in mine),
        "exact_match": same,
    }


@pytest.mark.slow
def test_results_folder_and_rows(bench_run):
    summary, out_dir, rows = bench_run
    for name in FILES:
        assert (out_dir / name).is_file() and (out_dir / name).stat().st_size > 0, name
    methods = methods_under_test()
    assert summary.methods == methods
    num_turns = sum(len(q["turns"]) for q in QUESTIONS)
    assert len(rows) == num_turns * len(methods)
    for row in rows:
        assert row["new_tokens"] == len(row["token_ids"]) <= MAX_NEW_TOKENS
        assert row["forward_passes"] >= 1 and row["decode_steps"] == row["forward_passes"] - 1
        want_mat = (row["new_tokens"] - 1) / row["decode_steps"] if row["decode_steps"] else 1.0
        assert row["mat"] == pytest.approx(want_mat)
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["model"]["dtype"] == "float32"
    assert manifest["model"]["path"]["weights"] == "float32" and manifest["model"]["path"]["exact"] is False
    assert manifest["machine"]["torch_threads"] >= 1 and manifest["versions"]["torch"]
    assert manifest["model"]["why"]["exact"].startswith("off")  # fp32: the reason beside the path, as doctor's
    assert manifest["machine"]["isa"] and all(isinstance(here, bool) for here in manifest["machine"]["isa"].values())
    assert manifest["data"]["question_ids"] == ["81", "301"]
    assert manifest["status"] == "complete" and len(manifest["sessions"]) == 1
    assert manifest["git"] == manifest["sessions"][0]["git"] and set(manifest["git"]) == {"commit", "dirty"}
    assert {row["session"] for row in rows} == {manifest["sessions"][0]["id"]}
    assert "| **overall** |" in (out_dir / "summary.md").read_text()


@pytest.mark.slow
def test_summary_agrees_with_rows(bench_run):
    summary, _, rows = bench_run
    plain = recompute(rows, "plain")
    hf_greedy = recompute(rows, "hf-greedy")
    for method in summary.methods:
        got = summary.stats[method]["overall"]
        want = recompute(rows, method)
        assert got["tokens_per_s"] == pytest.approx(want["tokens_per_s"])
        assert got["mat"] == pytest.approx(want["mat"])
        assert got["exact_match_plain"] == pytest.approx(want["exact_match"]["plain"])
        assert got["exact_match_hf_greedy"] == pytest.approx(want["exact_match"]["hf-greedy"])
        assert got["speedup_vs_plain"] == pytest.approx(want["tokens_per_s"] / plain["tokens_per_s"])
        assert got["speedup_vs_hf_greedy"] == pytest.approx(want["tokens_per_s"] / hf_greedy["tokens_per_s"])
    # A user's file keeps its own categories: "writing" is not folded into Spec-Bench's mt_bench.
    assert set(summary.categories) == {"writing", "summarization"}


@pytest.mark.slow
def test_plain_is_token_identical_to_transformers_greedy(bench_run):
    summary, _, rows = bench_run
    plain = {(r["question_id"], r["turn"]): r["token_ids"] for r in rows if r["method"] == "plain"}
    hf = {(r["question_id"], r["turn"]): r["token_ids"] for r in rows if r["method"] == "hf-greedy"}
    assert plain.keys() == hf.keys() and len(plain) == 3
    assert all(len(ids) > 0 for ids in plain.values())
    assert plain == hf
    assert summary.stats["plain"]["overall"]["exact_match_hf_greedy"] == 1.0
    # The forward-pass hook on transformers' generate: greedy makes one pass per token, as ours does.
    for row in rows:
        if row["method"] in ("plain", "hf-greedy"):
            assert row["forward_passes"] == row["new_tokens"] and row["mat"] == 1.0


@pytest.mark.slow
def test_speculative_method_ran(bench_run):
    if "pld" not in METHODS:
        pytest.skip("the pld method is not registered in specdec.proposers.METHODS yet")
    summary, _, rows = bench_run
    pld = [r for r in rows if r["method"] == "pld"]
    assert len(pld) == 3 and all(r["accepted_histogram"] for r in pld)
    assert summary.histograms["pld"] and sum(summary.histograms["pld"].values()) > 0
    assert all(r["match_plain"] == (r["token_ids"] == plain["token_ids"]) for r in pld
               for plain in rows if plain["method"] == "plain"
               and (plain["question_id"], plain["turn"]) == (r["question_id"], r["turn"]))


@pytest.mark.slow
def test_second_turn_follows_the_methods_own_first_answer(bench_run, default_model):
    _, _, rows = bench_run
    first, second = QUESTIONS[0]["turns"]
    for method in methods_under_test():
        turn1, turn2 = (r for r in rows if r["method"] == method and r["question_id"] == "81")
        messages = [
            {"role": "user", "content": first},
            {"role": "assistant", "content": turn1["text"].strip()},
            {"role": "user", "content": second},
        ]
        assert turn2["num_prompt_tokens"] == len(encode_prompt(default_model.tokenizer, messages, chat=True))


@pytest.mark.slow
def test_cli_prints_the_summary_as_the_last_stdout_line(tmp_path, capsys):
    data = write_questions(tmp_path / "q.jsonl", QUESTIONS[1:])
    out = tmp_path / "out"
    argv = ["bench", "--dtype", "fp32", "--data", str(data), "--methods", "plain,hf-greedy",
            "--max-new-tokens", "4", "--warmup", "0", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    printed = json.loads(last)
    rows = read_rows(out)
    assert printed["out_dir"] == str(out)
    for method in ("plain", "hf-greedy"):
        overall = printed["methods"][method]["overall"]
        assert overall["tokens_per_s"] == pytest.approx(recompute(rows, method)["tokens_per_s"])
        assert overall["new_tokens"] == sum(r["new_tokens"] for r in rows if r["method"] == method)
        assert set(printed["methods"][method]["categories"]) == {"summarization"}
    assert printed["methods"]["plain"]["overall"]["exact_match_hf_greedy"] == 1.0


def test_each_method_pays_its_own_prefill(default_model, tmp_path):
    # The methods take turns on each prompt: an engine keeping prompts would let whoever ran first time the
    # prefill for all of them (the transformers baselines always pay it).
    data = str(write_questions(tmp_path / "questions.jsonl", QUESTIONS[1:]))
    config = BenchConfig(data=data, methods=("plain", "pld"), max_new_tokens=4, warmup=0, progress=False)
    contenders = runner.build_contenders(runner.prepare(config), config, default_model, None)
    prompt = encode_prompt(default_model.tokenizer, QUESTIONS[1]["turns"][0], chat=True)
    for label in ("plain", "pld"):
        contenders[label].run(prompt)
    engine = contenders["plain"].engine
    assert engine is contenders["pld"].engine and engine._solo.target.prompts.hits == 0


def test_two_variants_of_one_method_keep_their_own_floor(default_model, tmp_path):
    # A floor keeps rates by proposer class: shared, `logitspec:k=8` would start from `logitspec`'s last rates.
    data = str(write_questions(tmp_path / "questions.jsonl", QUESTIONS[1:]))
    config = BenchConfig(data=data, methods=("logitspec", "logitspec:k=8"), max_new_tokens=8, warmup=0, progress=False)
    contenders = runner.build_contenders(runner.prepare(config), config, default_model, None)
    contenders["logitspec"].run(encode_prompt(default_model.tokenizer, QUESTIONS[1]["turns"][0], chat=True))
    first, second = contenders["logitspec"], contenders["logitspec:k=8"]
    assert first.floor.start(first.proposer).drafting.value is not None  # it learned
    assert second.floor.start(second.proposer).drafting.value is None  # and kept it to itself


def test_bad_method_is_refused_before_the_model_loads(tmp_path, capsys):
    data = str(write_questions(tmp_path / "q.jsonl", QUESTIONS))
    with pytest.raises(MethodError, match="unknown method 'nope'"):
        run_bench(BenchConfig(model=NO_MODEL, methods=("plain", "nope"), data=data, out=str(tmp_path / "o")))
    with pytest.raises(MethodError, match="unknown option"):
        run_bench(BenchConfig(model=NO_MODEL, methods=("hf-pld:bogus=1",), data=data))
    assert main(["bench", "--model", "/no/such/model", "--methods", "plain,nope", "--data", data]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown method 'nope'" in err[0]
    assert not (tmp_path / "o").exists()


def test_bad_data_and_folders_are_refused_before_the_model_loads(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "category": "qa"}\n')
    with pytest.raises(DataError, match="turns"):
        run_bench(BenchConfig(model=NO_MODEL, methods=("plain",), data=str(bad)))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match="no prompts"):
        run_bench(BenchConfig(model=NO_MODEL, methods=("plain",), data=str(empty)))
    full = tmp_path / "full"
    full.mkdir()
    (full / "responses.jsonl").write_text("{}\n")
    good = str(write_questions(tmp_path / "q.jsonl", QUESTIONS))
    with pytest.raises(BenchConfigError, match="not empty"):
        run_bench(BenchConfig(model=NO_MODEL, methods=("plain",), data=good, out=str(full)))
    with pytest.raises(BenchConfigError, match="draft-model"):
        run_bench(BenchConfig(model=NO_MODEL, methods=("hf-assisted",), data=good))


def test_method_list_keeps_options_with_their_method():
    assert split_method_list("plain,hf-greedy,logitspec:k=60,budget=32,pld") == (
        "plain", "hf-greedy", "logitspec:k=60,budget=32", "pld",
    )
    with pytest.raises(BenchConfigError):
        split_method_list("k=60,plain")
    with pytest.raises(BenchConfigError):
        split_method_list(" , ")


# --- resume -------------------------------------------------------------------------------------------

SUBSET = Path(__file__).parent / "data" / "spec_bench_subset.jsonl"
RESUME_METHODS = ("plain", "pld")


class Killed(Exception):
    """Stands for the process being killed in the middle of a run."""


def resume_config(folder: Path, limit: int, **changes) -> BenchConfig:
    """MT-bench's coding question (two turns), then a translation one: the subset's shortest prompts."""
    settings = dict(data=str(SUBSET), categories=("coding", "translation"), limit=limit, methods=RESUME_METHODS,
                    max_new_tokens=4, warmup=0, resume=str(folder), progress=False)
    return BenchConfig(**{**settings, **changes})


@pytest.fixture(scope="module")
def resumed(default_model, tmp_path_factory):
    """A run killed at its fourth pair (one question), then resumed with two questions."""
    out = tmp_path_factory.mktemp("resume") / "run"
    original = runner.SpecdecContender.run
    calls = []

    def dies_at_the_fourth_pair(self, prompt_ids):
        if len(calls) == 3:
            raise Killed
        calls.append(1)
        return original(self, prompt_ids)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner.SpecdecContender, "run", dies_at_the_fourth_pair)
        with pytest.raises(Killed):
            run_bench(resume_config(out, limit=1), loaded=default_model)
    killed_rows = read_rows(out)
    killed_manifest = json.loads((out / "manifest.json").read_text())
    summary = run_bench(resume_config(out, limit=2), loaded=default_model, command="pytest resume")
    return {"out": out, "killed_rows": killed_rows, "killed_manifest": killed_manifest, "summary": summary,
            "rows": read_rows(out), "manifest": json.loads((out / "manifest.json").read_text())}


def without_flags(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("match_")}


@pytest.mark.slow
def test_a_killed_run_keeps_every_completed_pair(resumed):
    killed = resumed["killed_rows"]
    # Question 121, turn 1 for both methods and turn 2 for plain: flushed as each pair completed.
    assert [(r["question_id"], r["turn"], r["method"]) for r in killed] == [
        ("121", 1, "plain"), ("121", 1, "pld"), ("121", 2, "plain")]
    assert resumed["killed_manifest"]["status"] == "running"
    assert resumed["killed_manifest"]["finished_utc"] is None


@pytest.mark.slow
def test_resume_runs_only_the_missing_pairs(resumed, default_model):
    killed, rows = resumed["killed_rows"], resumed["rows"]
    first_session = killed[0]["session"]
    assert len(rows) == 6 and len({(r["question_id"], r["turn"], r["method"]) for r in rows}) == 6
    # The three completed pairs are the same rows, not re-run (same session, times and tokens).
    assert [without_flags(r) for r in rows[:3]] == [without_flags(r) for r in killed]
    new = rows[3:]
    assert {r["session"] for r in new} != {first_session} and len({r["session"] for r in new}) == 1
    assert [(r["question_id"], r["turn"], r["method"]) for r in new][0] == ("121", 2, "pld")
    assert sorted((r["question_id"], r["method"]) for r in new[1:]) == [("161", "plain"), ("161", "pld")]
    # The resumed second turn follows pld's own first answer from the first session.
    turn1 = next(r for r in killed if r["method"] == "pld" and r["turn"] == 1)
    question = load_questions(SUBSET, categories=["coding"])[0]
    messages = [{"role": "user", "content": question.turns[0]},
                {"role": "assistant", "content": turn1["text"].strip()},
                {"role": "user", "content": question.turns[1]}]
    assert new[0]["num_prompt_tokens"] == len(encode_prompt(default_model.tokenizer, messages, chat=True))
    # Exact-match flags are final over all rows, old and new.
    by_key = {(r["question_id"], r["turn"], r["method"]): r["token_ids"] for r in rows}
    for r in rows:
        assert r["match_plain"] == (r["token_ids"] == by_key[(r["question_id"], r["turn"], "plain")])


@pytest.mark.slow
def test_resumed_summary_and_manifest_cover_all_rows(resumed):
    summary, rows, manifest = resumed["summary"], resumed["rows"], resumed["manifest"]
    for method in RESUME_METHODS:
        overall = summary.stats[method]["overall"]
        assert overall["num_turns"] == 3 and overall["num_questions"] == 2
        assert overall["new_tokens"] == sum(r["new_tokens"] for r in rows if r["method"] == method)
        assert overall["tokens_per_s"] == pytest.approx(recompute(rows, method)["tokens_per_s"])
    assert set(summary.categories) == {"mt_bench", "translation"}  # the Spec-Bench subset folds MT-bench
    assert manifest["status"] == "complete" and manifest["data"]["question_ids"] == ["121", "161"]
    first, second = manifest["sessions"]
    assert first["finished_utc"] is None and second["finished_utc"] == manifest["finished_utc"]
    assert manifest["started_utc"] == first["started_utc"] and second["command"] == "pytest resume"
    assert {r["session"] for r in rows} == {first["id"], second["id"]}
    for git in (manifest["git"], first["git"], second["git"]):
        assert git["commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{40}", git["commit"])
    assert manifest["run_identity"]["max_new_tokens"] == 4 and manifest["run_identity"]["dtype"] == "float32"


@pytest.mark.slow
def test_resume_refuses_a_different_run_and_names_what_differs(resumed, default_model, tmp_path):
    out = resumed["out"]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(BenchConfigError, match=r"max_new_tokens: 4 there, 5 here.*temperature: 0.0 there, 0.5 here"):
        run_bench(resume_config(out, limit=2, max_new_tokens=5, temperature=0.5), loaded=default_model)
    other = tmp_path / "other.jsonl"
    other.write_text("".join(SUBSET.read_text(encoding="utf-8").splitlines(keepends=True)[:-1]), encoding="utf-8")
    with pytest.raises(BenchConfigError, match="data_sha256"):
        run_bench(resume_config(out, limit=2, data=str(other)), loaded=default_model)
    with pytest.raises(BenchConfigError, match="methods"):
        run_bench(resume_config(out, limit=2, methods=("plain",)), loaded=default_model)
    with pytest.raises(BenchConfigError, match="model: 'smollm2-135m' there, '/no/such/model' here"):
        run_bench(resume_config(out, limit=2, model=ModelSpec("/no/such/model", dtype="fp32")))  # refused before loading
    with pytest.raises(BenchConfigError, match="not both"):
        run_bench(resume_config(out, limit=2, out=str(tmp_path / "elsewhere")), loaded=default_model)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_resume_refuses_a_folder_that_is_no_bench_run(tmp_path):
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "notes.txt").write_text("mine\n")
    with pytest.raises(BenchConfigError, match="no manifest.json"):
        run_bench(resume_config(stray, limit=1, model=ModelSpec("/no/such/model", dtype="fp32")))


@pytest.mark.slow
def test_cli_resume_of_a_finished_run_runs_nothing(resumed, tmp_path, capsys):
    out = tmp_path / "copy"
    shutil.copytree(resumed["out"], out)
    argv = ["bench", "--dtype", "fp32", "--data", str(SUBSET), "--categories", "coding,translation", "--limit", "2",
            "--methods", ",".join(RESUME_METHODS), "--max-new-tokens", "4", "--warmup", "0", "--resume", str(out),
            "--no-progress"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["methods"]["plain"]["overall"]["num_turns"] == 3
    assert read_rows(out) == resumed["rows"]
    assert len(json.loads((out / "manifest.json").read_text())["sessions"]) == 3


def test_a_torn_last_line_is_cut_and_a_bad_line_refused(tmp_path):
    path = tmp_path / "responses.jsonl"
    good = [{"question_id": "1", "turn": 1, "method": "plain"}, {"question_id": "1", "turn": 1, "method": "pld"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in good) + '{"question_id": "2", "tu', encoding="utf-8")
    assert read_responses(path) == good
    assert path.read_text(encoding="utf-8").endswith("}\n")  # appended rows start on a line of their own
    path.write_text('{"question_id": "1"}\n' + json.dumps(good[0]) + "\n", encoding="utf-8")
    with pytest.raises(BenchConfigError, match=":1 is not a responses row"):
        read_responses(path)


def test_source_revision_is_unknown_outside_a_checkout_and_never_raises(tmp_path, monkeypatch):
    assert source_revision(tmp_path / "absent") == {"commit": "unknown", "dirty": None}
    package = tmp_path / "repo" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    assert source_revision(package) == {"commit": "unknown", "dirty": None}  # not a git checkout
    git = ["git", "-C", str(package.parent), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    assert source_revision(package)["commit"] == "unknown"  # a checkout that does not track the package
    subprocess.run([*git, "add", "pkg/__init__.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert source_revision(package) == {"commit": head, "dirty": False}
    (package / "__init__.py").write_text("changed = 1\n")
    assert source_revision(package) == {"commit": head, "dirty": True}
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no git at all
    assert source_revision(package) == {"commit": "unknown", "dirty": None}


def test_session_workload_asks_three_things_about_each_article(tmp_path):
    from specdec.bench.workloads import session_questions, write_session_workload

    articles = load_questions(categories=["summarization"], per_category=2)
    rows = session_questions(2)
    assert [r["question_id"] for r in rows] == [f"{q.question_id}-{i}" for q in articles for i in (1, 2, 3)]
    assert {r["category"] for r in rows} == {"session"}
    for q, first in zip(articles, rows[::3], strict=True):
        doc = q.turns[0].removeprefix("Summarize: ")
        assert first["turns"] == [q.turns[0]]
    assert all(doc in r["turns"][0] for r in rows[3:6])
    path = write_session_workload(tmp_path, 2)
    assert [q.question_id for q in load_questions(path)] == [r["question_id"] for r in rows]
    assert write_session_workload(tmp_path, 2) == path


def test_session_workload_and_data_are_exclusive(tmp_path):
    with pytest.raises(SystemExit, match="not both"):
        main(["bench", "--workload", "session", "--data", str(tmp_path / "x.jsonl"), "--out", str(tmp_path / "o")])
