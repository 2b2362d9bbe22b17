"""`dsbuild export`: write one version as a folder another tool reads directly (Energon, HF, MDS, LitData, wids, DALI)."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, QUIET, REF, choice
from dsbuild.cli.render import Out, Progress

EXAMPLES = """\b
Examples:
  dsbuild export catalog@gold exports/gold-hf --to hf --split-set main
  dsbuild export catalog@gold exports/train-wids --to wids --split main/train
Run the same command again to finish an interrupted export."""


def _tools() -> tuple[str, ...]:
    from dsbuild.export import TOOLS

    return TOOLS


def export(
    ref: str = REF,
    dest: str = typer.Argument(
        ..., metavar="DEST", help="Export folder: new, empty, or an earlier export of the same thing."
    ),
    to: str = typer.Option(
        ..., "--to", metavar="TOOL", callback=choice("--to", _tools), help="dali, energon, hf, litdata, mds or wids."
    ),
    split: str = typer.Option(None, "--split", metavar="NAME/SPLIT", help="Export this split alone."),
    split_set: str = typer.Option(
        None,
        "--split-set",
        metavar="NAME",
        help="Export every split of this split set (default: all samples as 'train').",
    ),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Write a version for another tool (Energon, HF, MDS, LitData, wids, DALI)."""
    from dsbuild.core.errors import UsageError
    from dsbuild.export import export as run_export

    o = Out(as_json, quiet)
    if split and split_set:
        raise UsageError("give --split NAME/SPLIT or --split-set NAME, not both")
    if split is not None and not all(split.partition("/")[::2]):
        raise UsageError(
            f"--split {split!r}: use NAME/SPLIT, e.g. main/train",
            hint=f"--split-set {split.partition('/')[0] or 'NAME'} exports every split",
        )
    if split_set is not None and "/" in split_set:
        raise UsageError(
            f"--split-set {split_set!r}: use NAME, e.g. main", hint=f"--split {split_set} exports one split"
        )
    with Progress("export", o) as bar:
        r = run_export(
            ref,
            dest,
            to=to,
            split=split or split_set,
            progress=lambda done, total: bar.update(done, total, stage="samples"),
        )
    for warning in r.warnings:  # (under --json: in the report)
        o.note(("warning ", "yellow"), warning)
    if as_json:
        return o.json(r.to_json())
    if quiet:
        return o.value(r.dest)
    splits = ", ".join(f"{name} {n}" for name, n in r.splits.items())
    state = (
        "already complete"
        if r.existed
        else (
            f"{r.files_written} files written ({r.bytes_written:,} bytes), "
            f"{r.linked_shards} shards linked, {r.files_kept} kept"
        )
    )
    if r.repaired:
        state += f"; repaired: {r.repaired} file{'s' * (r.repaired != 1)} missing or of another size, written again"
    o.line(f"{r.tool} export of {o.id(r.version_id)} in ", r.dest, f": {r.samples} samples ({splits}); {state}")


def register(app: typer.Typer) -> None:
    app.command("export", epilog=EXAMPLES)(export)
