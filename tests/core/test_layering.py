"""Package dependencies are acyclic and follow the pipeline:

    cli -> (bench, export) -> (convert, validators, split, loader, samples) -> lineage -> formats -> core

Imports are read with ``ast`` (also the ones inside functions), so a lazy import counts too.
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
    graph = _package_imports()
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            assert state.get(nxt) != 1, f"cycle: {' -> '.join(trail + [nxt])}"
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_the_loader_never_imports_the_cli_validators_or_bench():
    assert not _package_imports().get("loader", set()) & {"cli", "validators", "bench"}
