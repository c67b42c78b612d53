"""No import cycles among specdec's modules, and no import from a lower layer into a higher one,
counting every import: module-level, local, TYPE_CHECKING.

An AST walk over src/specdec (nothing is imported). `from pkg import name` is an edge to
`pkg.name` when that is a module, else to the package; a submodule's implicit import of
its package's __init__ is not an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
# The layers, bottom up (drawn in docs/architecture.md): a module imports only from its own layer or
# lower ones. A module belongs to the first layer with a prefix that names it or a package above it.
LAYERS = (
    ("shared pieces", ("specdec.tree", "specdec.sampling", "specdec.text", "specdec.prompts",
                       "specdec.errors", "specdec.choices", "specdec.extras", "specdec.data", "specdec.datastore")),
    ("models", ("specdec.models",)),
    ("kernels", ("specdec.kernels",)),
    ("backends", ("specdec.backends",)),
    ("engine", ("specdec.engine",)),
    ("proposers", ("specdec.proposers", "specdec.drafters")),
    ("applications", ("specdec",)),  # the CLI, server, bench, demo, integrations, api, jobs
)


def layer_of(module: str) -> int:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return index
    raise ValueError(f"{module} is in no layer")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import from a module into a higher layer than its own, as 'importer (layer) -> imported (layer)'."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(module):
                found.append(f"{module} ({LAYERS[layer_of(module)][0]}) -> {target} ({LAYERS[layer_of(target)][0]})")
    return found


# What a module outside `specdec.backends` may import of it: the contract and the registry, which answers
# every per-backend question as a capability (docs: DESIGN.md, "Layout"); a backend's own modules stay inside.
BACKENDS_BOUNDARY = ("specdec.backends", "specdec.backends.contract", "specdec.backends.registry")


def past_the_backend_boundary(graph: dict[str, set[str]]) -> list[str]:
    """Each import from outside `specdec.backends` into one of its modules other than BACKENDS_BOUNDARY,
    as 'importer -> imported'."""
    found = []
    for module, targets in sorted(graph.items()):
        if module == "specdec.backends" or module.startswith("specdec.backends."):
            continue  # inside, a backend's modules import each other freely
        for target in sorted(targets):
            if target.startswith("specdec.backends.") and target not in BACKENDS_BOUNDARY:
                found.append(f"{module} -> {target}")
    return found


def module_graph(src: Path) -> dict[str, set[str]]:
    modules = {}
    for path in (src / "specdec").rglob("*.py"):
        parts = path.relative_to(src).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(group)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return groups


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [{"a", "b", "c"}]


def test_no_import_cycles():
    assert cycles(module_graph(SRC)) == []


def test_layer_check_finds_a_planted_upward_import():
    graph = {
        "specdec.tree": set(),
        "specdec.backends.torch.target": {"specdec.tree", "specdec.engine.loop"},  # the plant
        "specdec.engine.loop": {"specdec.backends.torch.target", "specdec.tree"},
        "specdec.cli": {"specdec.engine.loop"},
    }
    assert upward_imports(graph) == ["specdec.backends.torch.target (backends) -> specdec.engine.loop (engine)"]


def test_every_module_has_a_layer_and_imports_only_downward():
    graph = module_graph(SRC)
    assert all(layer_of(module) >= 0 for module in graph)
    assert upward_imports(graph) == []


def test_boundary_check_finds_a_planted_import_of_a_backends_own_module():
    graph = {name: set(targets) for name, targets in module_graph(SRC).items()}
    graph["specdec.engine.loop"].add("specdec.backends.torch.target")  # the plant
    graph["specdec.cli"].add("specdec.backends.llamacpp")  # and another, from an application
    assert "specdec.backends.registry" in graph["specdec.engine.loop"]  # a boundary import is no finding
    assert past_the_backend_boundary(graph) == [
        "specdec.cli -> specdec.backends.llamacpp",
        "specdec.engine.loop -> specdec.backends.torch.target",
    ]


def test_boundary_check_reads_a_planted_import_from_source(tmp_path):
    """The same check on a tiny package written to disk: the AST walk turns `from ... import` into the edge."""
    package = tmp_path / "specdec"
    for folder in ("backends", "backends/torch", "engine"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "backends" / "registry.py").write_text("from specdec.backends.torch.target import head\n")
    (package / "backends" / "torch" / "target.py").write_text("head = None\n")
    (package / "engine" / "loop.py").write_text(
        "from specdec.backends.registry import head\nfrom specdec.backends.torch import target\n")
    assert past_the_backend_boundary(module_graph(tmp_path)) == ["specdec.engine.loop -> specdec.backends.torch.target"]


def test_nothing_outside_backends_imports_a_backends_own_modules():
    assert past_the_backend_boundary(module_graph(SRC)) == []


def test_test_modules_import_shared_pieces_from_shared_modules_only():
    """What several test modules share lives in modules that hold no tests (tests/helpers.py, and
    tests/distribution.py for the acceptance rules' checks) and fixtures in conftest.py: a test module that
    imports another test module (or conftest) runs that module's fixtures and tests by surprise."""
    tests = Path(__file__).resolve().parent
    local = {path.stem for path in tests.glob("*.py") if path.stem.startswith("test_") or path.stem == "conftest"}
    offenders = []
    for path in sorted(tests.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.name} imports {name}" for name in names if name.split(".")[0] in local]
    assert not offenders, offenders
