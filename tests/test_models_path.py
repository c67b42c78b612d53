"""`specdec models path NAME`: the local Hugging Face folder other tools (vLLM) load.

The bundled model's folder is the suite's hermetic cache (converted once, shared
with the other tests); a pulled model is looked up in a cache folder laid out as
`specdec models pull` and the first conversion leave it, so nothing is fetched.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specdec.cli import main
from specdec.models import DEFAULT_MODEL, default_cache_dir, local_folder
from specdec.models.base import SHA_PREFIX_CHARS
from specdec.models.pulled import PULLABLE, pulled_path

PULLED = "qwen2.5-coder-0.5b"


def test_bundled_model_path_is_the_converted_folder(capsys):
    assert main(["models", "path", DEFAULT_MODEL]) == 0
    folder = Path(capsys.readouterr().out.strip())
    assert folder == local_folder(DEFAULT_MODEL) and folder.parent == default_cache_dir()
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert (folder / "tokenizer.json").is_file()


def test_pulled_model_path_uses_its_cache_folder(tmp_path, capsys):
    pulled_path(PULLED, tmp_path).parent.mkdir(parents=True)
    pulled_path(PULLED, tmp_path).write_bytes(b"GGUF")  # present: `models pull` checked it when it wrote it
    converted = tmp_path / f"{PULLED}-{PULLABLE[PULLED].sha256[:SHA_PREFIX_CHARS]}"
    converted.mkdir()
    (converted / "config.json").write_text("{}")
    assert main(["models", "path", PULLED, "--cache-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(converted)


@pytest.mark.parametrize(
    "args, message",
    [
        ([PULLED], f"fetch it with: specdec models pull {PULLED}"),
        (["no-such-model"], f"unknown model 'no-such-model': a bundled or pullable model has a local folder ({DEFAULT_MODEL}"),
        ([], "specdec models path needs a NAME"),
    ],
)
def test_path_errors_are_one_line_and_write_nothing(tmp_path, capsys, args, message):
    assert main(["models", "path", *args, "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "args, message",
    [(["no-such-model"], "unknown model 'no-such-model': one of "), ([], "specdec models pull needs a NAME: one of ")],
)
def test_pull_errors_name_the_pullable_models_and_write_nothing(tmp_path, capsys, args, message):
    assert main(["models", "pull", *args, "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and PULLED in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir())
