"""The layering of ``src/dpcomm``, read from the source with ``ast`` (no module is imported).

Rules (each a test; a failure names the module and the import):

1. **The runtime runs plans, it does not make them**: no module under ``dpcomm.runtime`` imports
   ``dpcomm.planner``, ``dpcomm.sim``, ``dpcomm.cli`` or ``dpcomm.train`` (the layer above it), at module
   level or inside a function.
2. **No reaching into another package's private modules**: a module of package ``dpcomm.X`` (the first
   component under ``dpcomm``; ``dpcomm.launch`` is its own package) imports no module whose name has a
   component starting with ``_`` (not a dunder) inside another package ``dpcomm.Y``.
3. **No import cycle**, between modules or between packages (modules merged into their ``dpcomm.X``):
   the graph "module A imports module B when A is imported" has no cycle. Counted:
   ``import`` statements at module level and in class bodies (they run at import). Not counted: imports
   inside functions (they run when called, after every module is loaded) and under ``if TYPE_CHECKING:``
   (never run). ``from P import n`` is an edge to ``P.n`` when ``n`` is a module, else to ``P``; importing
   ``P.m`` is not counted as importing ``P`` (the package is loaded first either way, and a package importing
   its own submodules is not a cycle Python cannot resolve). Between packages, imports inside functions
   count too: a lazy import hides a cycle from Python, not from a reader.
4. **Lower layers do not reach up**: cost models, topologies, timelines, plans and the small shared modules
   import no CLI, training layer, runtime, simulator, planner or testbed.

Imports by name count too: ``importlib.import_module("dpcomm.x")`` (or ``__import__``) with a constant name
is an edge to ``dpcomm.x``; where the name is computed, every string constant of the module that names a
dpcomm module is taken as imported (lazily). A registry that imports its plug-ins by string hides a cycle
from ``import`` statements, not from this test (``test_a_string_import_cycle_is_found``).

Known violations in modules this change does not own are listed in ``KNOWN`` and marked ``xfail`` with the
reason; delete an entry once its module is fixed (the test then runs and guards it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
ROOT = "dpcomm"
RUNTIME_MUST_NOT_IMPORT = ("dpcomm.planner", "dpcomm.sim", "dpcomm.cli", "dpcomm.train")

KNOWN: dict[str, str] = {}  # module -> why its test is expected to fail for now (none today)


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / ROOT).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved against ``module``)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


_BY_NAME = ("import_module", "__import__")


_PARSED: dict[str, list[tuple[str, bool]]] = {}  # this tree's modules, parsed once for every test


def _imports(module: str, source: str | None = None, modules: dict | None = None) -> list[tuple[str, bool]]:
    """``(imported module, at import time?)`` for every dpcomm import of ``module`` (its ``source``; default:
    the file), statements and imports by name (module docstring)."""
    if source is None and modules is None:
        if module not in _PARSED:
            _PARSED[module] = _imports(module, MODULES[module].read_text(), MODULES)
        return _PARSED[module]
    modules = MODULES if modules is None else modules
    text = source if source is not None else MODULES[module].read_text()
    tree = ast.parse(text, filename=module)
    found: list[tuple[str, bool]] = []
    computed = [False]  # an import_module(...) whose name is not a constant

    def visit(node: ast.AST, eager: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, False)
            elif isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.body:
                    visit_one(sub, False)
                for sub in child.orelse:
                    visit_one(sub, eager)
            else:
                visit_one(child, eager)

    def visit_one(child: ast.AST, eager: bool) -> None:
        if isinstance(child, ast.Import):
            found.extend((a.name, eager) for a in child.names)
        elif isinstance(child, ast.ImportFrom):
            target = _resolve(module, child)
            for a in child.names:
                sub = f"{target}.{a.name}"
                found.append((sub if sub in modules else target, eager))
        elif isinstance(child, ast.Call) and _called(child) in _BY_NAME and child.args:
            name = child.args[0]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                found.append((name.value, eager))
            else:
                computed[0] = True
            visit(child, eager)
        else:
            visit(child, eager)

    visit(tree, True)
    if computed[0]:  # a name made at run time: any module named in a string here may be the one
        found.extend(
            (n.value, False)
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in modules
        )
    return [(m, eager) for m, eager in found if m == ROOT or m.startswith(ROOT + ".")]


def _called(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _private(module: str) -> bool:
    return any(p.startswith("_") and not p.startswith("__") for p in module.split(".")[1:])


def _mark(module: str) -> pytest.param:
    marks = [pytest.mark.xfail(reason=KNOWN[module], strict=False)] if module in KNOWN else []
    return pytest.param(module, marks=marks, id=module)


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("dpcomm.runtime")])
def test_runtime_imports_no_planner_sim_cli_or_train(module):
    bad = [m for m, _ in _imports(module) if m.startswith(RUNTIME_MUST_NOT_IMPORT)]
    assert not bad, f"{module} imports {bad}: the runtime takes a Plan and nothing else from above it"


@pytest.mark.parametrize("module", [_mark(m) for m in MODULES])
def test_no_private_module_of_another_package(module):
    bad = [m for m, _ in _imports(module) if _private(m) and _package(m) != _package(module)]
    assert not bad, f"{module} imports another package's private module(s) {sorted(set(bad))}"


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (or a self-import), Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def _eager_edges() -> dict[str, set[str]]:
    return {m: {t for t, eager in _imports(m) if eager and t in MODULES} for m in MODULES}


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"a"}}) == [["a"]] and _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_at_import_time():
    assert _cycles(_eager_edges()) == [], "modules that import each other at import time"


def test_no_cycle_between_packages_at_import_time():
    # the same graph with modules merged into their packages (dpcomm.X): data flows one way between them
    packages: dict[str, set[str]] = {}
    for m, targets in _eager_edges().items():
        packages.setdefault(_package(m), set()).update(
            _package(t) for t in targets if _package(t) != _package(m)
        )
    assert _cycles(packages) == [], "packages that import each other at import time"


def _all_package_edges(sources: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Package -> packages it imports, counting imports inside functions too (they run sooner or later);
    ``sources``: module -> text of a made-up tree (default: this one)."""
    if sources is None and _PACKAGE_EDGES:
        return _PACKAGE_EDGES
    modules = MODULES if sources is None else dict.fromkeys(sources, Path())
    out: dict[str, set[str]] = {}
    for m in modules:
        text = None if sources is None else sources[m]
        out.setdefault(_package(m), set()).update(
            _package(t)
            for t, _ in _imports(m, text, modules)
            if _package(t) != _package(m) and _package(t) != ROOT
        )
    if sources is None:
        _PACKAGE_EDGES.update(out)
    return out


_PACKAGE_EDGES: dict[str, set[str]] = {}  # this tree's, computed once


@pytest.mark.parametrize(
    "registry",
    [
        'import importlib\n\ndef load():\n    importlib.import_module("dpcomm.plugins.kind")\n',
        'from importlib import import_module\nKINDS = ("dpcomm.plugins.kind",)\n\n'
        "def load():\n    for name in KINDS:\n        import_module(name)\n",
        'def load():\n    __import__("dpcomm.plugins.kind")\n',
    ],
    ids=["constant", "names in a tuple", "__import__"],
)
def test_a_string_import_cycle_is_found(registry):
    # a registry that imports its plug-in by name, and the plug-in that imports the registry to register
    tree = {
        "dpcomm.core.registry": registry,
        "dpcomm.plugins.kind": "from dpcomm.core.registry import register\n",
    }
    assert _cycles(_all_package_edges(tree)) == [["dpcomm.core", "dpcomm.plugins"]]
    tree["dpcomm.plugins.kind"] = "X = 1\n"  # the plug-in no longer imports back: no cycle
    assert _cycles(_all_package_edges(tree)) == []


def test_no_cycle_between_packages_even_through_lazy_imports():
    # stricter than the import-time rule: a lazy import hides a cycle from Python, not from a reader
    assert _cycles(_all_package_edges()) == [], "packages that import each other (lazily or not)"


@pytest.mark.parametrize(
    "low", ["costmodel", "topology", "timeline", "utils", "ops", "registry", "errors", "plan", "schedules"]
)
def test_lower_layers_do_not_reach_up(low):
    """Cost models, topologies, timelines, plans and the small shared modules import neither the CLI, the
    training layer, the runtime, the simulator, the planners nor the testbed."""
    up = {f"{ROOT}.{p}" for p in ("cli", "runtime", "train", "sim", "planner", "testbed")}
    assert not _all_package_edges()[f"{ROOT}.{low}"] & up
