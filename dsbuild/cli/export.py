"""`dsbuild export`: write one version as a folder another tool reads directly (Energon, HF, MDS, LitData, wids)."""

from __future__ import annotations

import json

import typer


def export(
    ref: str = typer.Argument(..., help="PATH[@VERSION]"),
    dest: str = typer.Argument(..., help="Export folder: new, empty, or an earlier export of the same thing."),
    to: str = typer.Option(..., "--to", help="energon, hf, mds, litdata or wids."),
    split: str = typer.Option(None, "--split", help="Split set NAME (all its splits) or NAME/SPLIT (one)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Write a version for another tool; run it again to finish an interrupted export.

    Example: dsbuild export catalog@v1 exports/v1-energon --to energon --split main"""
    from dsbuild.export import export as run_export

    r = run_export(ref, dest, to=to, split=split)
    if as_json:
        typer.echo(json.dumps(r.to_json(), indent=2, sort_keys=True))
        return
    splits = ", ".join(f"{name} {n}" for name, n in r.splits.items())
    state = "already complete" if r.existed else (f"{r.files_written} files written ({r.bytes_written:,} bytes), "
                                                  f"{r.linked_shards} shards linked, {r.files_kept} kept")
    typer.echo(f"{r.tool} export of {r.version_id[:12]} in {r.dest}: {r.samples} samples ({splits}); {state}")


def register(app: typer.Typer) -> None:
    app.command("export")(export)
