"""The browser playground and the per-token sources it shows.

What must hold (each test can fail):
- an emitted token gets the source of the node it was accepted at in the tree the proposer proposed,
  found again after the batch cut the tree; the target's own tokens are "target";
- a stream asked for sources carries `specdec.source`, `.step` and `.token` in each text chunk, with
  the same text as a stream that did not ask (whose chunks stay exactly OpenAI's); plain's tokens are
  all the target's, one per pass; LogitSpec on a repetitive prompt accepts drafts (MAT > 1);
- the page and its files are served without a key, with a policy that allows this origin only; the
  methods listing (and every other data path) needs the key; --no-ui serves no page;
- in a real headless Chromium against a real server with an API key: the page asks for the key,
  streams a LogitSpec reply beside plain's, colours the tokens by source (some drafted), and shows
  the counters; a screenshot is saved in the test's temporary folder.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator

import pytest
import torch
from starlette.testclient import TestClient

from specdec.engine.provenance import TARGET, Provenance, walk
from specdec.serve.app import ServerConfig, create_app
from specdec.serve.process import ServerProcess
from specdec.tree import DraftTree

KEY = "playground-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
# greedy SmolLM2 copies the list on: drafts from the prompt are accepted
REPEAT = "Repeat this line twice: red, green, blue, yellow, red, green, blue, yellow."
BROWSER_WAIT_S = 180.0  # bound on every wait in the browser


class _Tagged:
    """A proposer as the engine sees it after `propose`: its tree's node sources."""

    def __init__(self, sources: list[str] | None, draft_source: str = "pld") -> None:
        self.sources, self.draft_source = sources, draft_source

    def node_sources(self) -> list[str] | None:
        return self.sources


def test_tokens_get_the_source_of_the_node_they_were_accepted_at():
    # root 5; branch a: 7 -> 8 (cand, cand); branch b: 9 (session)
    tree = DraftTree(torch.tensor([5, 7, 8, 9]), torch.tensor([-1, 0, 1, 0]))
    provenance = Provenance()
    provenance.drafted(_Tagged(["", "cand", "cand", "session"]), tree)
    assert provenance.tag([7, 8, 42], step=3) == ["cand", "cand", TARGET]
    assert provenance.tag([9, 1], step=3) == ["session", TARGET]
    assert provenance.tag([3], step=3) == [TARGET]  # nothing accepted
    assert provenance.tag([7], step=0) == [TARGET]  # the prefill's token
    cut = DraftTree(torch.tensor([5, 9]), torch.tensor([-1, 0]))  # what a batch might verify
    assert walk(tree, cut.token_list[1:]) == [3]
    provenance.drafted(_Tagged(None), tree)  # one source for the whole tree
    assert provenance.tag([7, 8, 1], step=1) == ["pld", "pld", TARGET]
    provenance.drafted(_Tagged(["", "cand"]), tree)  # a list of the wrong length is not trusted
    assert provenance.tag([9, 1], step=1) == ["pld", TARGET]


# ------------------------------------------------------------------ the API, in process
@pytest.fixture(scope="module")
def http(default_model) -> Iterator[TestClient]:
    config = ServerConfig(method="logitspec", api_keys=(KEY,), max_tokens_limit=64, log_level="warning")
    app = create_app(config, default_model)
    # No floor: every step drafts as the method sizes it, so what the stream tests count depends neither on
    # how busy the machine is (the other worker's tests) nor on where the floor's tries fall in a short reply
    app.state.service.engine.floor = None
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def _stream(http: TestClient, method: str, sources: bool, prompt: str = REPEAT, max_tokens: int = 24) -> list[dict]:
    body = {
        "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
        "stream": True, "specdec": {"method": method, "sources": sources},
    }  # fmt: skip
    with http.stream("POST", "/v1/chat/completions", json=body, headers=AUTH) as response:
        assert response.status_code == 200, response.read()
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def _texts(chunks: list[dict]) -> list[tuple[str, dict | None]]:
    """(text, the chunk's specdec field) of every chunk that carries text."""
    return [
        (chunk["choices"][0]["delta"]["content"], chunk.get("specdec"))
        for chunk in chunks
        if chunk["choices"] and chunk["choices"][0]["delta"].get("content")
    ]


def test_a_stream_carries_each_tokens_source_only_when_asked(http):
    tagged, untagged = _texts(_stream(http, "logitspec", True)), _texts(_stream(http, "logitspec", False))
    assert "".join(t for t, _ in tagged) == "".join(t for t, _ in untagged)
    assert all(tag is None for _, tag in untagged)  # OpenAI's chunk, nothing added
    tags = [tag for _, tag in tagged]
    assert all(set(tag) == {"source", "step", "token"} for tag in tags)
    assert tags[0]["step"] == 0 and tags[0]["source"] == TARGET
    steps, tokens = [t["step"] for t in tags], [t["token"] for t in tags]
    assert steps == sorted(steps) and tokens == sorted(tokens)
    assert any(t["source"] != TARGET for t in tags)  # drafts were accepted on a repetitive prompt
    assert (tokens[-1]) / steps[-1] > 1  # MAT as the page computes it: (tokens - 1) / passes


def test_plain_tokens_are_all_the_targets_one_per_pass(http):
    tags = [tag for _, tag in _texts(_stream(http, "plain", True, max_tokens=12))]
    assert {tag["source"] for tag in tags} == {TARGET}
    assert all(tag["step"] == tag["token"] for tag in tags)


def test_the_page_is_public_and_every_data_path_needs_the_key(http):
    page = http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for path in ("/", "/playground/app.js", "/playground/style.css"):
        served = http.get(path)
        assert served.status_code == 200 and "://" not in served.text  # nothing from elsewhere: works offline
    for path in ("/v1/specdec/methods", "/v1/models"):
        assert http.get(path).status_code == 401
    listing = http.get("/v1/specdec/methods", headers=AUTH).json()
    methods = {m["name"]: m for m in listing["data"]}
    assert listing["default"] == "logitspec" and methods["plain"]["available"]
    assert not methods["draft"]["available"] and "draft_model" in methods["draft"]["reason"]
    k = next(o for o in methods["logitspec"]["options"] if o["name"] == "k")
    assert k["kind"] == "int" and k["max"] is not None and k["value"] >= 1


def test_no_ui_serves_no_page(default_model):
    app = create_app(ServerConfig(method="plain", ui=False, log_level="warning"), default_model)
    client = TestClient(app, raise_server_exceptions=False)  # no lifespan: nothing is generated here
    assert client.get("/").status_code == 404
    assert client.get("/v1/specdec/methods").status_code == 200


# ------------------------------------------------------------------ the page, in a real browser
def _browser():  # noqa: ANN202 - a selenium WebDriver, or a skip
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the dev extra)")
    from selenium.webdriver.chrome.service import Service

    binary = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.skip("no Chromium and chromedriver installed (Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(driver))


def _wait(condition, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + BROWSER_WAIT_S
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"the page did not show {what} within {BROWSER_WAIT_S:.0f} s")


@pytest.mark.slow  # a server process, a browser and two streamed replies: tens of seconds
def test_the_page_streams_coloured_tokens_beside_plain(default_model, tmp_path):
    browser = _browser()
    args = ["--dtype", "fp32", "--method", "logitspec", "--api-key", KEY, "--max-tokens-limit", "64",
            "--log-level", "warning"]  # fmt: skip
    server = ServerProcess(args, tmp_path / "server.log").start()
    try:
        server.wait_ready()
        browser.get(server.url + "/")
        find = browser.find_element
        _wait(lambda: find("id", "key-form").is_displayed(), "the key form")
        find("id", "key").send_keys(KEY)
        find("css selector", "#key-form button").click()
        _wait(lambda: find("id", "method").get_attribute("value") == "logitspec", "the methods")
        find("id", "max-tokens").clear()
        find("id", "max-tokens").send_keys("40")
        find("id", "compare").click()
        find("id", "prompt").send_keys(REPEAT)
        find("id", "send").click()
        _wait(lambda: len(browser.find_elements("css selector", ".reply[data-done=true]")) == 2, "both replies")
        browser.execute_script("window.scrollTo(0, 0)")
        browser.save_screenshot(str(tmp_path / "playground.png"))
        _check_replies(browser)
    finally:
        browser.quit()
        server.stop()
    assert (tmp_path / "playground.png").stat().st_size > 0


def _check_replies(browser) -> None:  # noqa: ANN001
    spec, plain = browser.find_elements("css selector", ".reply")
    assert spec.get_attribute("data-method") == "logitspec" and plain.get_attribute("data-method") == "plain"
    assert "error" not in spec.get_attribute("class") + plain.get_attribute("class")
    spec_sources = {s.get_attribute("data-source") for s in spec.find_elements("css selector", ".tok")}
    plain_sources = {s.get_attribute("data-source") for s in plain.find_elements("css selector", ".tok")}
    assert plain_sources == {TARGET} and spec_sources - {TARGET}, spec_sources
    assert spec.find_element("css selector", ".reply-text").text == plain.find_element("css selector", ".reply-text").text

    def counter(reply, name: str) -> str:  # noqa: ANN001
        return reply.find_element("css selector", f'[data-counter="{name}"] b').text

    assert int(counter(spec, "tokens")) == int(counter(plain, "tokens")) > 0
    assert float(counter(spec, "MAT")) > 1.0 and float(counter(plain, "MAT")) == 1.0
    assert int(counter(spec, "passes")) < int(counter(plain, "passes"))
