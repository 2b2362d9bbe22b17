"""Package dependencies are acyclic and follow the pipeline:

    cli -> (bench, export) -> (convert, validators, split, loader, samples) -> lineage -> formats -> core
    cli -> importers -> formats -> core

Imports are read with ``ast`` (also the ones inside functions and under ``TYPE_CHECKING``), so a lazy or
type-only import counts too. Inside a package, modules are acyclic as well: no module imports, directly or
through others, a module that imports it back.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import dsbuild

TIERS = {
    "core": 0,
    "formats": 1,
    "lineage": 2,
    "convert": 3,
    "validators": 3,
    "split": 3,
    "loader": 3,
    "samples": 3,
    "importers": 3,
    "bench": 4,
    "export": 4,
    "ray": 4,
    "cli": 5,
}
ROOT = Path(dsbuild.__file__).parent


def _package_imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts == ("__init__",):
            continue
        src = parts[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                bits = name.split(".")
                if bits[0] == "dsbuild" and len(bits) > 1 and bits[1] != src:
                    graph[src].add(bits[1])
    return graph


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, a package named by its ``__init__.py``."""
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = ("dsbuild", *path.relative_to(ROOT).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _module_imports() -> dict[str, set[str]]:
    """Module -> the dsbuild modules it imports (``from pkg import mod`` names the module ``pkg.mod``)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for src, path in mods.items():
        graph[src] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in mods:  # pkg.mod.attr -> pkg.mod
                    name = name.rpartition(".")[0]
                if name and name != src:
                    graph[src].add(name)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None when it is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return trail[trail.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt, trail + [nxt])):
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [node])):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_every_package_has_a_tier():
    packages = {
        p.relative_to(ROOT).parts[0].removesuffix(".py")
        for p in ROOT.iterdir()
        if p.suffix == ".py" or (p / "__init__.py").exists()
    } - {"__init__", "__pycache__"}
    assert packages <= set(TIERS), packages - set(TIERS)


def test_imports_only_point_down_the_pipeline():
    upward = sorted(
        (src, dst) for src, dsts in _package_imports().items() for dst in dsts if TIERS.get(dst, 99) > TIERS[src]
    )
    assert upward == []


def test_no_package_cycle():
    cycle = _cycle(_package_imports())
    assert cycle is None, f"cycle: {' -> '.join(cycle)}"


def test_no_module_cycle():
    cycle = _cycle(_module_imports())
    assert cycle is None, f"cycle: {' -> '.join(cycle)}"


def test_the_loader_never_imports_the_cli_validators_or_bench():
    assert not _package_imports().get("loader", set()) & {"cli", "validators", "bench"}
