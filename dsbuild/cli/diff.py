"""`dsbuild diff`: samples added/removed/changed between two versions, and statistics drift."""

from __future__ import annotations

import typer

from dsbuild.cli.render import console, print_json


def diff(
    a: str = typer.Argument(..., help="PATH@A"),
    b: str = typer.Argument(..., help="PATH@B"),
    limit: int = typer.Option(20, "--limit", help="How many keys to list per kind of change."),
    split: str = typer.Option(None, "--split", help="Compare split sets instead: NAME, or NAME_A:NAME_B."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Compare two versions (of the same or different catalogs). Always exits 0."""
    from rich.table import Table

    from dsbuild.lineage.catalog import open_ref
    from dsbuild.lineage.diff import diff_versions

    (ca, va), (cb, vb) = open_ref(a), open_ref(b)
    if split:
        from dsbuild.split import diff_split_sets, open_split

        name_a, _, name_b = split.partition(":")
        d = diff_split_sets(open_split(ca, va, name_a), open_split(cb, vb, name_b or name_a))
        if as_json:
            print_json(d)
        else:
            g = d["groups"]
            console.print(f"split sets {name_a}@{va[:12]} -> {name_b or name_a}@{vb[:12]}: groups moved "
                          f"{len(g['moved'])}, added {len(g['added'])}, removed {len(g['removed'])}")
            for group, (x, y) in list(g["moved"].items())[:limit]:
                console.print(f"  moved {group}: {x} -> {y}", highlight=False)
        return
    d = diff_versions(ca, va, cb, vb, limit=limit)
    if as_json:
        print_json(d)
        return
    console.print(f"{va[:12]} -> {vb[:12]}: +{d['added']} -{d['removed']} ~{d['changed']} "
                  f"({d['unchanged']} unchanged)")
    for kind in ("added", "removed", "changed"):
        for k in d[f"{kind}_keys"]:
            console.print(f"  {kind[0] if kind != 'changed' else '~'} {k}", highlight=False)
    t = Table("statistic", "a", "b", "delta")
    for name, v in d["drift"].items():
        t.add_row(name, str(v["a"]), str(v["b"]), str(v["delta"]))
    for title, v in d["per_title"].items():
        t.add_row(f"samples[{title}]", str(v["a"]), str(v["b"]), str(v["b"] - v["a"]))
    console.print(t)


def register(app: typer.Typer) -> None:
    app.command("diff")(diff)
