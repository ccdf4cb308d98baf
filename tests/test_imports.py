"""The layout holds: no package imports another package's private (``_``) module, and the packages do not
import each other in a circle. Read from the source with ``ast`` (every ``import``, also inside functions).
Budget: pure, well under a second."""

import ast
from collections import defaultdict
from pathlib import Path

import pytest

import dpcomm

SRC = Path(dpcomm.__file__).parent
# The training runtime is being moved above a new training layer: its imports are checked there.
PENDING = {"runtime", "train", "demo"}


def _unit(module: str) -> str:
    """The package (``dpcomm.collectives``) or top-level module (``dpcomm.launch``) a module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports() -> list[tuple[str, str]]:
    out = []
    for path in SRC.rglob("*.py"):
        module = ".".join(("dpcomm", *path.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] if node.module != "dpcomm" else [f"dpcomm.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            out += [(module, n) for n in names if n.startswith("dpcomm.")]
    return out


def test_no_package_imports_another_packages_private_module():
    bad = [
        (src, dst)
        for src, dst in _imports()
        if _unit(src) != _unit(dst)
        and _unit(src) not in PENDING
        and any(p.startswith("_") and not p.startswith("__") for p in dst.split(".")[2:])
    ]
    assert bad == []


def test_packages_import_each_other_without_cycles():
    edges: dict[str, set[str]] = defaultdict(set)
    for src, dst in _imports():
        a, b = _unit(src), _unit(dst)
        if a != b and a not in PENDING and b not in PENDING and a and b:
            edges[a].add(b)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    cycles = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if reaches(b, a)})
    assert cycles == []


@pytest.mark.parametrize("low", ["costmodel", "topology", "timeline", "utils", "ops", "registry", "errors"])
def test_lower_layers_do_not_reach_up(low):
    """Cost models, topologies, timelines and the small shared modules import neither the CLI, the runtime,
    the simulator nor the planners."""
    up = {"cli", "runtime", "train", "sim", "planner", "testbed"}
    assert not {_unit(dst) for src, dst in _imports() if _unit(src) == low} & up
