"""`dsbuild lineage`: where one sample came from and where it lives."""

from __future__ import annotations

import typer

from dsbuild.cli.render import console, print_json


def lineage(
    ref: str = typer.Argument(..., help="PATH[@VERSION]"),
    key: str = typer.Argument(..., help="Sample key."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Source session, source files with sha256, window, config and its hash, tool version, location."""
    from dsbuild.lineage.catalog import open_ref
    from dsbuild.lineage.history import sample_lineage

    catalog, version = open_ref(ref)
    info = sample_lineage(catalog, version, key)
    if as_json:
        print_json(info)
        return
    w, loc = info["window"], info["location"]
    console.print(f"[bold]{key}[/] in version {version[:12]} (sample sha256 {info['sample_sha256'][:16]}…)")
    console.print(f"  session  {info['session']['session_id']}  title={info['session']['title']} "
                  f"player={info['session']['player']}", highlight=False)
    console.print(f"  window   {w['t_start']:.3f}s – {w['t_end']:.3f}s, {w['frames']} frames (clip {w['clip_index']})")
    for s in info["sources"]:
        console.print(f"  source   {s['role']:<9} {s['path']}  sha256 {s['sha256']}", highlight=False)
    console.print(f"  config   {info['config_hash'][:16]}…  tool dsbuild {info['tool_version']}")
    where = f"offset {loc['offset']} length {loc['length']}" if loc["offset"] >= 0 else \
        f"row group {loc['row_group']} row {loc['row']}"
    console.print(f"  stored   {loc['shard']} {where}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("lineage")(lineage)
