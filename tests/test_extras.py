"""The lean install: `import specdec` and the CLI's start pull in no optional package, and a
subcommand whose extra is missing says which extra to install before doing any work.

Each check runs in a fresh interpreter: this process has the extras imported already. A missing
package is simulated the way Python itself allows, `sys.modules[name] = None` (the import then
fails and `find_spec` reports it absent), in that child only.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from specdec.extras import DISTRIBUTION, EXTRAS

SRC = str(Path(__file__).parents[1] / "src")
OPTIONAL = sorted({name for names in EXTRAS.values() for name in names})


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={"PYTHONPATH": SRC}
    )


def test_import_and_parser_load_no_optional_package():
    code = (
        "import sys, specdec, specdec.cli\n"
        "specdec.cli.build_parser()\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {OPTIONAL!r}))"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("argv", "blocked", "extra"),
    [(["serve"], "fastapi", "serve"), (["bench"], "matplotlib", "bench"), (["analyze"], "matplotlib", "bench")],
)
def test_missing_extra_is_one_line_naming_it(argv, blocked, extra):
    code = (
        f"import sys\nsys.modules[{blocked!r}] = None\n"
        "from specdec.cli import main\n"
        f"status = main({argv!r})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))\n"
        "sys.exit(status)"
    )
    result = _run(code)
    assert result.returncode == 2, result.stderr
    assert f"pip install '{DISTRIBUTION}[{extra}]'" in result.stderr
    assert blocked in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stdout.strip() == "[]"  # refused before any model code was imported
