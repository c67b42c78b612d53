"""The external datastore (specdec.datastore, specdec.datastore_build) and the `datastore` method.

Model-free: the suffix array equals a brute-force sort by the first sort_depth
tokens (ties by position); `match`, `lookup` and `branches` equal a brute-force
oracle over random small token arrays (files split by the separator).
With the default model's tokenizer: build -> open -> lookup on real text (the
Python standard library's own sources, not benchmark data) agrees with the
oracle; every broken folder (missing, truncated, corrupt, mismatched, another
tokenizer) is a DatastoreError with a clear message, from the API, the method,
the server's parts and the CLI. On the real model (fp32): greedy output of the
method (chain and tree) is token-identical to plain greedy on a Spec-Bench prompt
of every category, and seeded sampling is reproducible.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from helpers import CORPUS, STDLIB, prompts_by_category
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.cli import main
from specdec.datastore import SEPARATOR, Datastore, DatastoreError, tokenizer_identity
from specdec.datastore_build import build_datastore, suffix_array
from specdec.engine.generation import GenerationConfig
from specdec.errors import SpecdecError
from specdec.proposers import make_config, parse_method
from specdec.sampling import SamplingParams
from specdec.serve.options import RequestRefused
from specdec.serve.pool import ProposerPool

NEW_TOKENS = 16
HELD_OUT = STDLIB / "json" / "decoder.py"  # context drawn from a file outside the corpus


# ------------------------------------------------------------------ brute force
def occurrences(tokens: list[int], pattern: list[int]) -> list[int]:
    width = len(pattern)
    return [i for i in range(len(tokens) - width + 1) if tokens[i : i + width] == pattern]


def most_frequent(tokens: list[int], positions: list[int], offset: int) -> list[int]:
    counts = Counter(tokens[p + offset] for p in positions if tokens[p + offset] != SEPARATOR)
    return sorted(counts, key=lambda t: (-counts[t], t))


def oracle_path(tokens, positions, offset, first, length, sort_depth):
    path, positions = [first], [p for p in positions if tokens[p + offset] == first]
    while len(path) < length:
        at = offset + len(path)
        if len(positions) == 1 or at >= sort_depth:  # one occurrence, or position order: the earliest
            start = min(positions) + at
            for token in tokens[start : start + length - len(path)]:
                if token == SEPARATOR:
                    break
                path.append(token)
            break
        ranked = most_frequent(tokens, positions, at)
        if not ranked:
            break
        path.append(ranked[0])
        positions = [p for p in positions if tokens[p + at] == ranked[0]]
    return path


def oracle(tokens, context, max_ngram, length, max_branches, min_ngram, sort_depth):
    longest = min(max_ngram, len(context), sort_depth - 1)
    found = [
        m for m in range(max(min_ngram, 1), longest + 1) if occurrences(tokens, context[len(context) - m :])
    ]
    if not found:
        return 0, []
    m = max(found)
    positions = occurrences(tokens, context[len(context) - m :])
    firsts = most_frequent(tokens, positions, m)[:max_branches]
    return m, [oracle_path(tokens, positions, m, t, length, sort_depth) for t in firsts]


def in_memory(tokens: list[int], sort_depth: int) -> Datastore:
    array = np.asarray(tokens, dtype=np.int32)
    meta = {"sort_depth": sort_depth, "num_tokens": len(tokens)}
    return Datastore(Path("."), array, suffix_array(array, sort_depth), meta, exact_count=10**9)


# ------------------------------------------------------------------ model-free
@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.integers(-1, 4), max_size=80), sort_depth=st.integers(1, 12))
def test_suffix_array_equals_a_brute_force_sort(tokens, sort_depth):
    array = np.asarray(tokens, dtype=np.int64)
    # Sorted by the first sort_depth tokens (a shorter suffix first), then by position.
    expected = sorted(range(len(tokens)), key=lambda i: (tokens[i : i + sort_depth], i))
    assert suffix_array(array, sort_depth).tolist() == expected


files_of_tokens = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=25), min_size=1, max_size=4)


@settings(max_examples=250, deadline=None)
@given(
    files=files_of_tokens,
    context=st.lists(st.integers(0, 3), min_size=1, max_size=8),
    max_ngram=st.integers(1, 6),
    min_ngram=st.integers(1, 3),
    length=st.integers(1, 8),
    max_branches=st.integers(1, 3),
    sort_depth=st.integers(2, 9),
)
def test_lookup_and_branches_equal_a_brute_force_oracle(
    files, context, max_ngram, min_ngram, length, max_branches, sort_depth
):
    tokens = [token for file in files for token in [*file, SEPARATOR]]
    store = in_memory(tokens, sort_depth)
    m, expected = oracle(tokens, context, max_ngram, length, max_branches, min_ngram, sort_depth)
    assert store.match(context, max_ngram, min_ngram)[0] == m
    assert store.branches(context, max_ngram, length, max_branches, min_ngram) == expected
    assert store.lookup(context, max_ngram, length, min_ngram) == (expected[0] if expected else [])


def test_lookup_by_hand():
    #        0  1  2  3   4  5  6  7  8   9 10 11 12
    tokens = [5, 6, 7, 8, -1, 5, 6, 9, -1, 1, 6, 9, -1]
    store = in_memory(tokens, 8)
    assert store.lookup([5, 6], 4, 5) == [7, 8]  # "5 6" -> 7 once, 9 once: a tie goes to the smaller id
    assert store.branches([1, 6], 4, 5, 2) == [[9]]  # "1 6" occurs once; a file ends after 9
    assert store.branches([4, 6], 4, 5, 3) == [[9], [7, 8]]  # "6" -> 9 twice, 7 once
    assert store.lookup([4, 4], 4, 5) == []  # no match at all


# ------------------------------------------------------------------ with the real tokenizer
@pytest.fixture(scope="module")
def stdlib_store(default_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("datastores") / "stdlib"
    summary = build_datastore(CORPUS, default_model.tokenizer, out)
    assert summary.num_files == len(CORPUS) and summary.num_skipped == 0
    return out


def test_build_open_lookup_on_real_text_agrees_with_the_oracle(default_model, stdlib_store):
    store = Datastore.open(stdlib_store, default_model.tokenizer)
    store.exact_count = 10**9  # count every occurrence, as the oracle does
    tokens = store.tokens.tolist()
    assert tokens[-1] == SEPARATOR and tokens.count(SEPARATOR) == len(CORPUS)
    assert store.meta["tokenizer"] == tokenizer_identity(default_model.tokenizer)
    held_out = default_model.tokenizer(HELD_OUT.read_text(), add_special_tokens=False)["input_ids"]
    hits = 0
    for cut in range(40, len(held_out), max(1, len(held_out) // 60)):
        context = held_out[:cut]
        m, expected = oracle(tokens, context, 6, 8, 2, 1, store.sort_depth)
        assert store.branches(context, 6, 8, 2) == expected, cut
        hits += m >= 2
    assert hits > 10  # code shares plenty of 2-grams with other code


def test_sampled_counts_still_give_real_continuations(default_model, stdlib_store):
    store = Datastore.open(stdlib_store)  # default exact_count: large ranges are sampled
    tokens = store.tokens.tolist()
    commonest = Counter(tokens).most_common(2)
    context = [next(token for token, _ in commonest if token != SEPARATOR)]
    m, lo, hi = store.match(context, 4)
    assert m == 1 and hi - lo > store.exact_count  # a range that is sampled
    for branch in store.branches(context, 4, 6, 3):
        assert occurrences(tokens, [*context, *branch])  # every branch occurs right after the match


def damage(folder: Path, how: str) -> None:
    meta_path = folder / "meta.json"
    meta = json.loads(meta_path.read_text())
    if how == "no tokens":
        (folder / "tokens.npy").unlink()
    elif how == "no meta":
        meta_path.unlink()
    elif how == "truncated":
        data = (folder / "suffixes.npy").read_bytes()
        (folder / "suffixes.npy").write_bytes(data[: len(data) // 2])
    elif how == "garbage npy":
        (folder / "tokens.npy").write_bytes(b"not numpy at all")
    elif how == "bad json":
        meta_path.write_text("{not json")
    elif how == "version":
        meta_path.write_text(json.dumps({**meta, "version": 99}))
    elif how == "size":
        meta_path.write_text(json.dumps({**meta, "num_tokens": meta["num_tokens"] + 1}))
    elif how == "positions":
        suffixes = np.load(folder / "suffixes.npy")
        suffixes[3] = len(suffixes) + 5
        np.save(folder / "suffixes.npy", suffixes)
    elif how == "tokenizer":
        meta_path.write_text(json.dumps({**meta, "tokenizer": {**meta["tokenizer"], "sha256": "0" * 64}}))


BROKEN = {
    "no tokens": "tokens.npy is missing",
    "no meta": "meta.json is missing",
    "truncated": "suffixes.npy is truncated or corrupt",
    "garbage npy": "tokens.npy is truncated or corrupt",
    "bad json": "meta.json is unreadable",
    "version": "format version 99",
    "size": "meta.json says",
    "positions": "positions outside the corpus",
    "tokenizer": "built with tokenizer",
}


@pytest.mark.parametrize("how", sorted(BROKEN))
def test_a_broken_datastore_is_a_clear_error(default_model, stdlib_store, tmp_path, how):
    folder = tmp_path / "copy"
    folder.mkdir()
    for name in ("meta.json", "tokens.npy", "suffixes.npy"):
        (folder / name).write_bytes((stdlib_store / name).read_bytes())
    damage(folder, how)
    with pytest.raises(DatastoreError, match=BROKEN[how]) as caught:
        Datastore.open(folder, default_model.tokenizer)
    assert isinstance(caught.value, SpecdecError) and str(folder) in str(caught.value)
    with pytest.raises(DatastoreError, match=BROKEN[how]):
        parse_method(f"datastore:path={folder}").build(default_model)


def test_missing_paths_and_folders_are_clear_errors(default_model, tmp_path, capsys):
    with pytest.raises(DatastoreError, match="does not exist"):
        Datastore.open(tmp_path / "nowhere")
    with pytest.raises(DatastoreError, match="give the datastore folder"):
        parse_method("datastore").build(default_model)
    with pytest.raises(DatastoreError, match="not empty"):
        build_datastore(CORPUS[:1], default_model.tokenizer, Path(__file__).parent)
    with pytest.raises(DatastoreError, match="no readable UTF-8"):
        binary = tmp_path / "blob.bin"
        binary.write_bytes(b"\xff\xfe\x00\x81" * 10)
        build_datastore([binary], default_model.tokenizer, tmp_path / "out")
    assert main(["datastore", "build", str(tmp_path / "missing.py"), "-o", str(tmp_path / "x")]) == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_the_cli_builds_a_datastore(default_model, tmp_path, capsys):
    out = tmp_path / "ds"
    argv = ["datastore", "build", str(STDLIB / "json"), "--glob", "*.py", "-o", str(out), "--no-progress"]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == str(out)
    store = Datastore.open(out, default_model.tokenizer)
    assert store.meta["num_files"] == len(list((STDLIB / "json").rglob("*.py")))
    assert main(argv) == 2  # never overwrites


def test_the_server_opens_the_datastore_at_startup_only(default_model, stdlib_store):
    pool = ProposerPool(default_model)
    with pytest.raises(RequestRefused, match="datastore:path=DIR"):
        pool.check(make_config("datastore"))
    config = make_config("datastore", {"path": str(stdlib_store)})
    pool.prepare(config)
    proposer = pool.get(make_config("datastore", {"path": str(stdlib_store), "max_branches": 2}))
    assert proposer.datastore.folder == stdlib_store


# ------------------------------------------------------------------ on the real model
@pytest.fixture(scope="module")
def prompts(default_model, spec_bench_subset):
    return prompts_by_category(default_model.tokenizer, spec_bench_subset)


@pytest.mark.slow  # the fast tier's seeded lossless rows (test_lossless) check these tokens are plain sampling's
def test_seeded_sampling_is_reproducible(engine, default_model, prompts, stdlib_store):
    ids = prompts[next(name for name in prompts if name.startswith("translation"))]
    proposer = parse_method(f"datastore:path={stdlib_store},min_ngram=1").build(default_model)

    def run(seed: int) -> list[int]:
        config = GenerationConfig(max_new_tokens=16, sampling=SamplingParams(temperature=0.9, seed=seed))
        return engine.generate(ids, proposer, config).token_ids

    first = run(7)
    assert run(7) == first
    assert run(8) != first
