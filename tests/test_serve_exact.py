"""The server answers the same question the same way: exact verification by default, where the model allows it.

What must hold (each test can fail):
- with the server's default settings on the bundled model as it loads by
  default (bf16 where oneDNN runs it), eight concurrent copies of a greedy
  request, of a seeded one and of a greedy `plain` one each give the text of the
  request alone (the batch shares passes; without exact verification near-tie
  argmaxes flip), and the default method's greedy text is plain decoding's;
- the start-up decision: "auto" turns exact on where the model's path can and
  leaves it off (saying why) where it cannot, as with the fp32 model; "on" there
  fails at start-up; "off" is off;
- the server reads the model's one `exact` option (`ModelSpec.exact`, `--exact`);
  `ServerConfig` has none of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import fixed_attention_plan, save_fixed_costs
from starlette.testclient import TestClient

from specdec.backends.torch import attention
from specdec.choices import ModelSpec
from specdec.models import load_model
from specdec.serve.app import ServerConfig, create_app
from specdec.serve.exactness import settle_exact, why_not_exact

COPIES = 8
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
GREEDY = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 48, "temperature": 0}
SEEDED = {**GREEDY, "temperature": 0.8, "top_p": 0.95, "seed": 4321}


@pytest.fixture(scope="module")
def default_loaded():
    """The bundled model as a plain `load_model` gives it (bf16 where oneDNN runs bf16)."""
    return load_model("smollm2-135m")


def seed_fixed_timings(loaded, exact: str | None = None) -> None:
    """The served variant's attention plan and cost curve fixed (one cache file per dtype), so no test times."""
    served = dataclasses.replace(loaded, exact=exact or ("on" if why_not_exact(loaded) is None else "off"))
    attention.save_plan(served, fixed_attention_plan())
    save_fixed_costs(served)


def serve_default(loaded, **changes) -> Iterator[TestClient]:
    with TestClient(create_app(ServerConfig(log_level="warning", **changes), loaded)) as client:
        yield client


def texts(http: TestClient, body: dict, copies: int) -> list[str]:
    def ask(_: int) -> str:
        reply = http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(max_workers=copies) as pool:
        return list(pool.map(ask, range(copies)))


@pytest.mark.slow
def test_concurrent_copies_give_the_solo_text_with_default_settings(default_loaded):
    if why_not_exact(default_loaded) is not None:
        pytest.skip(f"exact verification is not possible here: {why_not_exact(default_loaded)}")
    seed_fixed_timings(default_loaded)
    plain = {**GREEDY, "specdec": {"method": "plain"}}
    for http in serve_default(default_loaded):
        assert http.app.state.service.loaded.exact == "on"
        solos = {}
        for name, body in {"greedy": GREEDY, "seeded": SEEDED, "plain": plain}.items():
            solos[name] = texts(http, body, 1)[0]
            assert texts(http, body, COPIES) == [solos[name]] * COPIES, name
        assert solos["greedy"] == solos["plain"]  # the default method's text is plain decoding's


def test_auto_is_on_where_possible_and_off_where_not(default_model, default_loaded):
    reason = why_not_exact(default_model)
    assert reason is not None and "float32" in reason  # fp32 has no batch-invariant pass
    loaded, note = settle_exact(default_model, "auto")
    assert loaded.exact == "off" and "exact verification off" in note and reason in note
    with pytest.raises(ValueError, match="--exact on is not possible"):
        settle_exact(default_model, "on")
    assert settle_exact(default_loaded, "off")[0].exact == "off"
    if why_not_exact(default_loaded) is None:
        loaded, note = settle_exact(default_loaded, "auto")
        assert loaded.exact == "on" and "exact verification on" in note
    with pytest.raises(ValueError, match="exact must be one of"):
        settle_exact(default_loaded, "maybe")


def test_the_server_reads_the_models_exact_option(default_model, default_loaded):
    assert "exact" not in {field.name for field in dataclasses.fields(ServerConfig)}  # declared once, in ModelSpec
    seed_fixed_timings(default_loaded, "off")
    config = ServerConfig(model=ModelSpec(exact="off"), max_batch=1, log_level="warning")
    service = create_app(config, default_loaded).state.service
    assert service.loaded.exact == "off" and "--exact off" in service.exact_note
    with pytest.raises(ValueError, match="--exact on is not possible"):
        create_app(ServerConfig(model=ModelSpec(exact="on"), max_batch=1), default_model)  # fp32: cannot


def test_serve_parses_exact_auto_by_default():
    from specdec.cli import build_parser, model_spec

    parser = build_parser()
    assert model_spec(parser.parse_args(["serve"])).exact == "auto"
    assert model_spec(parser.parse_args(["serve", "--exact", "off"])).exact == "off"
    assert parser.parse_args(["generate", "hi"]).exact == "auto"  # other commands: the model's auto (where free)
