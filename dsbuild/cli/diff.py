"""`dsbuild diff`: samples added/removed/changed between two versions, and statistics drift."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, QUIET
from dsbuild.cli.render import Out

EXAMPLES = """\b
Examples:
  dsbuild diff catalog@gold catalog                    # gold against the newest version
  dsbuild diff catalog@gold catalog --split-set main   # how groups moved between split sets"""


def diff(
    a: str = typer.Argument(..., metavar="REF_A", help="PATH[@VERSION] of the old version."),
    b: str = typer.Argument(..., metavar="REF_B", help="PATH[@VERSION] of the new version (any catalog)."),
    limit: int = typer.Option(20, "--limit", min=0, metavar="N", help="Keys listed per kind of change."),
    split_set: list[str] = typer.Option(
        [],
        "--split-set",
        metavar="NAME",
        help="Compare split sets instead: NAME for both, or give it twice (A, then B).",
    ),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Compare two versions: samples and statistics drift.

    The versions may be in different catalogs. Exits 0 when both exist."""
    from dsbuild.core.errors import UsageError
    from dsbuild.lineage.catalog import open_ref

    o = Out(as_json, quiet)
    (ca, va), (cb, vb) = open_ref(a), open_ref(b)
    if split_set:
        if len(split_set) > 2:
            raise UsageError("--split-set: give one NAME (both versions) or two (A, then B)")
        from dsbuild.lineage.splitsets import open_split_set
        from dsbuild.split import diff_split_sets

        na, nb = split_set[0], split_set[-1]
        d = diff_split_sets(open_split_set(ca, va, na), open_split_set(cb, vb, nb))
        if as_json:
            return o.json(d)
        g = d["groups"]
        o.line(
            f"split sets {na}@{o.id(va)} -> {nb}@{o.id(vb)}: groups moved {len(g['moved'])}, "
            f"added {len(g['added'])}, removed {len(g['removed'])}"
        )
        o.table(["group", "from", "to"], [(grp, x, y) for grp, (x, y) in list(g["moved"].items())[:limit]])
        return
    from dsbuild.lineage.diff import diff_versions

    d = diff_versions(ca, va, cb, vb, limit=limit)
    if as_json:
        return o.json(d)
    o.line(f"{o.id(va)} -> {o.id(vb)}: +{d['added']} -{d['removed']} ~{d['changed']} ({d['unchanged']} unchanged)")
    o.table(["change", "key"], [(kind, k) for kind in ("added", "removed", "changed") for k in d[f"{kind}_keys"]])
    rows = [(name, v["a"], v["b"], v["delta"]) for name, v in d["drift"].items()]
    rows += [(f"samples of {title}", v["a"], v["b"], v["b"] - v["a"]) for title, v in d["per_title"].items()]
    o.table(["statistic", "a", "b", "delta"], rows)


def register(app: typer.Typer) -> None:
    app.command("diff", epilog=EXAMPLES)(diff)
