"""Where the server's API keys come from: the command line, a key file, an environment variable.

Why: a key given as `--api-key KEY` is visible to every local user in `ps`.
A key file (`--api-key-file`, readable by the operator only) or the environment
(`SPECDEC_API_KEYS`; the admin keys in `SPECDEC_ADMIN_KEYS`) keeps it out of the
process list. This module only reads: the CLI hands it the values and the
environment mapping, so nothing here looks at global state.

Invariants: the keys of all sources together, in order (command line, file,
environment), each once; a key file holds one key a line, blank lines and
lines starting with `#` ignored; the environment holds keys separated by commas
or whitespace; a key file that cannot be read is an OSError naming it, never a
server that starts without the keys it was told to require.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

API_KEYS_ENV = "SPECDEC_API_KEYS"
ADMIN_KEYS_ENV = "SPECDEC_ADMIN_KEYS"


def read_key_file(path: str | Path) -> list[str]:
    """The keys in a key file (one a line; blank lines and `#` comments left out)."""
    lines = Path(path).expanduser().read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def gather_keys(
    given: Sequence[str], key_file: str | Path | None, environ: Mapping[str, str], variable: str
) -> tuple[str, ...]:
    """The keys from the command line, then `key_file`, then `environ[variable]`, each once, in order."""
    keys = list(given)
    if key_file is not None:
        keys += read_key_file(key_file)
    keys += [key for key in re.split(r"[\s,]+", environ.get(variable, "")) if key]
    return tuple(dict.fromkeys(key.strip() for key in keys))
