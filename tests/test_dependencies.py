"""Every third-party import in src/specdec is declared: the base dependencies cover what a bare
install imports, and an extra's packages are imported only where that extra is asked for.

Why: a package that arrives through another one's dependencies (pydantic through transformers ->
typer) makes the base install decode by accident; a transformers release that drops it breaks
`import specdec`. An AST walk (nothing is imported) finds each import, `packages_distributions`
maps its top-level name to the distribution that provides it, and pyproject.toml says which
distributions the base and each extra declare. An extra's import is allowed inside a function
(the CLI checks the extra before calling it, `specdec.extras`) or in a module the extra owns.
"""

from __future__ import annotations

import ast
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "specdec"
# Modules (relative to src/specdec) that only run when their extra is installed: the CLI refuses
# their subcommand first (`require_extra`), and nothing a bare install imports reaches them.
EXTRA_MODULES = {
    "serve": ("serve/",),
    "bench": ("bench/report.py",),
}


def declared() -> tuple[set[str], dict[str, set[str]]]:
    """(base distributions, extra -> its distributions), canonical names, self-references left out."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    base = _names(project["dependencies"])
    return base, {extra: _names(reqs) for extra, reqs in project["optional-dependencies"].items()}


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements} - {"specdec-hf"}


def imports(path: Path) -> list[tuple[str, bool, int]]:
    """(top-level module name, inside a function, line) of every absolute import in one file."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name.split(".")[0], in_function, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and not child.level and child.module:
                found.append((child.module.split(".")[0], in_function, child.lineno))
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def undeclared_imports(package: Path, base: set[str], extras: dict[str, set[str]]) -> list[str]:
    """Each import a bare install would not satisfy, as 'file:line module (provided by ...)'."""
    providers = packages_distributions()
    problems = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        for module, in_function, line in imports(path):
            if module in sys.stdlib_module_names or module in ("specdec", "__future__"):
                continue
            dists = {canonicalize_name(d) for d in providers.get(module, [module])}
            if dists & base:
                continue
            owners = [name for name, reqs in extras.items() if dists & reqs]
            owned = any(relative.startswith(p) for name in owners for p in EXTRA_MODULES.get(name, ()))
            if owners and (in_function or owned):
                continue
            why = f"only in extra {owners}" if owners else "in no declared dependency"
            problems.append(f"{relative}:{line} {module} ({', '.join(sorted(dists))}: {why})")
    return problems


def test_every_import_is_declared():
    base, extras = declared()
    problems = undeclared_imports(PACKAGE, base, extras)
    assert not problems, "imports a bare install lacks:\n" + "\n".join(problems)


def test_a_planted_undeclared_import_is_found(tmp_path):
    """The check can fail: a proposer importing pydantic at module level, with pydantic only in an
    extra, is found; the same import inside a function, or in the extra's own module, is not."""
    base, extras = declared()
    base = base - {"pydantic", "annotated-types"}
    extras = {**extras, "serve": extras["serve"] | {"pydantic"}}
    (tmp_path / "proposers").mkdir()
    (tmp_path / "serve").mkdir()
    (tmp_path / "proposers" / "planted.py").write_text("import torch\nfrom pydantic import BaseModel\n")
    (tmp_path / "proposers" / "lazy.py").write_text("def f():\n    import pydantic\n")
    (tmp_path / "serve" / "owned.py").write_text("import pydantic\n")
    (tmp_path / "proposers" / "unknown.py").write_text("import not_a_declared_package\n")
    problems = undeclared_imports(tmp_path, base, extras)
    assert [p.split(" ")[0] for p in problems] == ["proposers/planted.py:2", "proposers/unknown.py:1"], problems
    assert "only in extra ['serve']" in problems[0] and "in no declared dependency" in problems[1]


def test_extras_module_mirrors_the_declared_extras():
    """`specdec.extras.EXTRAS` (what the CLI checks) names only packages its extra declares."""
    from specdec.extras import EXTRAS

    providers = packages_distributions()
    base, extras = declared()
    for extra, modules in EXTRAS.items():
        for module in modules:
            dists = {canonicalize_name(d) for d in providers.get(module, [module])}
            assert dists & extras[extra], f"{module} of EXTRAS[{extra!r}] is not declared by [{extra}]"
            assert not dists & base, f"{module} is a base dependency: the {extra} check need not name it"
