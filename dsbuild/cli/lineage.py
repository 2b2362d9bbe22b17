"""`dsbuild lineage`: where one sample came from and where it lives."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, QUIET, REF
from dsbuild.cli.render import Out

EXAMPLES = """\b
Examples:
  dsbuild lineage catalog@gold ks-7-0003__000002
  dsbuild query catalog "select key from samples limit 3"    # find keys"""


def lineage(
    ref: str = REF,
    key: str = typer.Argument(..., metavar="KEY", help="Sample key (<session>__<clip>)."),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Show where one sample came from and where it lives.

    Source session, source files with sha256, window, config and its hash, tool version, location."""
    from dsbuild.lineage.catalog import open_ref
    from dsbuild.lineage.history import sample_lineage

    o = Out(as_json, quiet)
    catalog, version = open_ref(ref)
    d = sample_lineage(catalog, version, key)
    if as_json:
        return o.json(d)
    w, loc, s = d["window"], d["location"], d["session"]
    o.line((key, "bold"), f" in version {o.id(version)} (sample sha256 {d['sample_sha256']})")
    o.pairs(
        [
            ("session", s["session_id"]),
            ("title", s["title"]),
            ("player", s["player"]),
            ("platform", s["platform"]),
            ("build", s["build"]),
            ("window", f"{w['t_start']:.3f} s - {w['t_end']:.3f} s, {w['frames']} frames (clip {w['clip_index']})"),
            ("config", f"{d['config_hash']} (dsbuild {d['tool_version']})"),
            ("shard", loc["shard"]),
            ("location", ", ".join(f"{k} {v}" for k, v in loc.items() if k != "shard" and v is not None)),
        ]
    )
    o.table(
        ["role", "path", "sha256", "bytes"],
        [(x["role"], x["path"], x["sha256"], x["bytes"]) for x in d["sources"]],
        wide=("sha256",),
    )


def register(app: typer.Typer) -> None:
    app.command("lineage", epilog=EXAMPLES)(lineage)
