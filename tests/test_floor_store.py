"""The floor's learned states on disk (`specdec.engine.floor_store`): what a process learned reaches the next.

The policy runs on fixed step prices (as in tests/test_floor.py), so nothing depends on the machine's load;
the last test runs the bundled model through the API, whose engine keeps its floor in the cache (the suite's
own, `conftest`).
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from helpers import run_policy

import specdec
from specdec.engine.floor import EXPLORE, SETTLE, Floor, FloorState, proposer_name, resumed
from specdec.engine.floor_store import FloorStore, remembered_floor
from specdec.proposers import parse_method

KEY = {"model": "m", "machine": "here"}


class Proposer:  # a proposer type of its own: its learned state is kept under this name
    pass


def learned(tmp_path, drafted_tokens: int, drafted_s: float, steps: int = 300) -> FloorStore:
    """A store holding one row's state after `steps` steps at that price, written as the row finished."""
    store = FloorStore(tmp_path / "floor.json", KEY)
    floor = Floor(store=store)
    state = floor.start(Proposer())
    run_policy(state, steps, drafted_tokens, drafted_s)
    floor.finish(Proposer(), state)
    return store


def test_a_new_process_starts_from_what_the_last_one_learned(tmp_path) -> None:
    store = learned(tmp_path, drafted_tokens=1, drafted_s=3.0)  # drafting loses
    state = Floor(store=FloorStore(store.path, KEY)).start(Proposer())
    assert state.leader is False and not state.drafts()  # no warm-up: it knows drafting lost
    assert state.gap <= EXPLORE[1] and state.since == 0  # ... and tries it again within EXPLORE[1] steps
    modes = run_policy(state, EXPLORE[1] + 1, drafted_tokens=1, drafted_s=3.0)
    assert not any(modes[:-1]) and modes[-1]

    winning = learned(tmp_path, drafted_tokens=3, drafted_s=1.5)  # the same file, now drafting pays
    assert Floor(store=FloorStore(winning.path, KEY)).start(Proposer()).leader is True
    assert Floor(store=FloorStore(winning.path, KEY)).start(object()).leader is None  # another type: fresh


def test_sampled_and_greedy_rows_are_kept_apart(tmp_path) -> None:
    store = learned(tmp_path, drafted_tokens=1, drafted_s=3.0)
    floor = Floor(store=FloorStore(store.path, KEY))
    assert floor.start(Proposer(), greedy=False).leader is None


def test_a_state_for_another_key_is_not_read(tmp_path) -> None:
    store = learned(tmp_path, drafted_tokens=1, drafted_s=3.0)
    other = FloorStore(store.path, {**KEY, "machine": "elsewhere"})
    assert other.read() == {}
    assert Floor(store=other).start(Proposer()).drafts()  # a fresh state's warm-up


def test_resumed_ends_runs_and_shortens_the_gap() -> None:
    state = FloorState(
        leader=False, gap=2048, since=700, plain_run=1, draft_run=2, run_tokens=5, run_seconds=2.0
    )
    back = resumed(state)
    assert (back.gap, back.since, back.plain_run, back.draft_run, back.run_tokens, back.run_seconds) == (
        EXPLORE[1],
        0,
        SETTLE + 1,
        0,
        0,
        0.0,
    )
    assert back.leader is False and state.gap == 2048  # a copy: the state it came from is unchanged


@pytest.mark.parametrize(
    "spoil", ["not json", "leader", "negative", "nan", "missing", "format", "extra", "greedy"]
)
def test_a_spoilt_file_is_ignored_whole(tmp_path, spoil: str) -> None:
    store = learned(tmp_path, drafted_tokens=1, drafted_s=3.0)
    saved = json.loads(store.path.read_text())
    state = saved["states"][0]["state"]
    if spoil == "leader":
        state["leader"] = "yes"
    elif spoil == "negative":
        state["drafting"]["seconds"] = -1.0
    elif spoil == "nan":
        state["plain"]["tokens"] = math.nan
    elif spoil == "missing":
        del state["prices"]["sum_xy"]
    elif spoil == "format":
        saved["format"] = 99
    elif spoil == "extra":
        state["unknown"] = 1
    elif spoil == "greedy":
        saved["states"][0]["greedy"] = 1
    store.path.write_text("{" if spoil == "not json" else json.dumps(saved))
    assert store.read() == {}
    assert Floor(store=store).start(Proposer()).drafts()  # fresh: its warm-up drafts


def test_an_unwritable_store_costs_only_the_learning(tmp_path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    store = FloorStore(blocked / "floor.json", KEY)  # its folder is a file: every write fails
    floor = Floor(store=store)
    state = floor.start(Proposer())
    run_policy(state, 50, drafted_tokens=1, drafted_s=3.0)
    floor.finish(Proposer(), state)  # no error
    assert not floor.start(Proposer()).drafts()  # this process still knows


def test_the_api_carries_the_floor_to_its_next_call(default_model, bench_prompts) -> None:
    """Each `specdec.generate` call on a loaded model builds an engine; the second starts from the first's
    floor (kept beside the cost curve), and its text is the first's: the floor changes no output. The model
    goes by a name of its own here, so no other test (on another worker) writes its file meanwhile."""
    from helpers import fixed_attention_plan, save_fixed_costs

    from specdec.backends.torch import attention

    loaded = save_fixed_costs(dataclasses.replace(default_model, name="smollm2-135m-floor-store-test"))
    attention.save_plan(loaded, fixed_attention_plan())
    prompt = loaded.tokenizer.decode(bench_prompts["summarization"])  # the chat-templated text
    store = remembered_floor(loaded).store
    store.path.unlink(missing_ok=True)
    first = specdec.generate(loaded, prompt, "pld", max_new_tokens=24)
    kept = store.read()
    assert (proposer_name(parse_method("pld").build(loaded)), True) in kept
    assert store.path.parent.name == "costs" and store.path.name.endswith(".floor.json")
    second = specdec.generate(loaded, prompt, "pld", max_new_tokens=24)
    assert second.token_ids == first.token_ids
    assert second.token_ids == specdec.generate(loaded, prompt, "plain", max_new_tokens=24).token_ids
