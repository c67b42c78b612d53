"""The `specdec` command line: JSON output, streaming text, and one-line errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specdec.cli import main


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specdec.cli", *args], input=stdin, capture_output=True, text=True, timeout=600
    )


def test_generate_json_matches_library(default_model, capsys):
    from specdec.api import generate

    code = main(["generate", "Name three colours.", "--chat", "--dtype", "fp32", "--max-new-tokens", "12", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result) == {"text", "token_ids", "stats", "path"}
    assert result["path"]["dtype"] == "float32" and result["path"]["weights"] == "float32"
    expected = generate(default_model, "Name three colours.", chat=True, max_new_tokens=12)
    assert result["token_ids"] == expected.token_ids
    assert result["text"] == expected.text
    stats = result["stats"]
    for key in ("num_new_tokens", "num_forward_passes", "mat", "wall_time_s", "tokens_per_s"):
        assert key in stats
    assert stats["num_new_tokens"] == len(result["token_ids"])
    assert stats["mat"] == pytest.approx(1.0)


@pytest.mark.slow
def test_generate_streams_text_and_prints_stats_from_stdin():
    proc = run_cli("generate", "-", "--dtype", "fp32", "--max-new-tokens", "8", "--stats", stdin="The sky is")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "tokens/s" in proc.stderr and "MAT" in proc.stderr
    assert "path: backend torch, device cpu, dtype float32" in proc.stderr  # which path ran, every auto settled


@pytest.mark.parametrize(
    "args,message",
    [
        (["generate", "   "], "prompt is empty"),
        (["generate", "hi", "--model", "/no/such/model.gguf"], "not found"),
        (["generate", "hi", "--method", "nosuchmethod"], "unknown method"),
        (["generate", "hi", "--method", "plain:depth=3"], "unknown option"),
        (["generate", "hi", "--temperature", "-1"], "temperature"),
    ],
)
def test_bad_input_is_one_line_without_traceback(args, message, capsys):
    """In this process (a new interpreter costs ~4.5 s of imports a case): an exception that escaped `main`
    would fail the test, as its traceback would show in the command's output."""
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    assert message in lines[-1]
    assert lines[-1].startswith("specdec: error:")


def test_the_command_itself_exits_2_with_one_line():
    proc = run_cli("generate", "   ")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "specdec: error: the prompt is empty"


def test_non_positive_max_new_tokens_is_refused():
    proc = run_cli("generate", "hi", "--max-new-tokens", "0")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "positive" in proc.stderr
