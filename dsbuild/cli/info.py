"""`dsbuild info`: one version at a glance, without SQL."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, QUIET, REF
from dsbuild.cli.render import Out

EXAMPLES = """\b
Examples:
  dsbuild info catalog              # the newest version
  dsbuild info catalog@gold --json"""


def info(
    ref: str = REF,
    no_trunc: bool = typer.Option(
        False, "--no-trunc", help="Whole ids on a terminal too (piped output always has them)."
    ),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Show one version: format, config, counts, hours, splits, tags."""
    from dsbuild.lineage.catalog import open_ref
    from dsbuild.lineage.history import version_info

    o = Out(as_json, quiet, no_trunc)
    catalog, version = open_ref(ref)
    d = version_info(catalog, version)
    if as_json:
        return o.json(d)
    if quiet:
        return o.value(version)
    st = d["stats"]
    o.pairs(
        [
            ("version", o.id(d["version_id"])),
            ("content id", o.id(d["content_id"])),
            ("catalog", d["catalog"]),
            ("tags", ", ".join(d["tags"]) or "-"),
            ("created", d["created_at"] or "-"),
            ("parent", o.id(d["parent"])),
            ("format", d["format"]),
            ("tool", f"dsbuild {d['tool_version']}"),
            ("config", ", ".join(f"{k}={v}" for k, v in sorted(d["config"].items()))),
            ("config hash", o.id(d["config_hash"])),
            ("sessions", st["sessions"]),
            ("samples", st["samples"]),
            ("shards", st["shards"]),
            ("bytes", o.size(st["bytes"])),
            ("frames", st["frames"]),
            ("hours", f"{st['hours']:.3f}"),
            ("long clips", st["long_clips"]),
            ("repaired sessions", st["repaired_sessions"]),
            ("quarantined", st["quarantined"]),
            ("controls", ", ".join(d["vocabulary"]["controls"]) or "-"),
            ("telemetry", ", ".join(d["vocabulary"]["telemetry"]) or "-"),
        ]
    )
    o.table(["title", "samples"], sorted(st["samples_per_title"].items()))
    for q in d["quarantined"]:
        o.line(("quarantined ", "yellow"), q["session"], ": ", q["path"], ": ", q["reason"])
    for s in d["split_sets"]:
        if "damaged" in s:
            o.line(("split set ", "bold"), s["name"], (" damaged: ", "red"), s["damaged"])
            continue
        parts = ", ".join(f"{name} {r['samples']}" for name, r in s["splits"].items())
        o.line(("split set ", "bold"), s["name"], f" ({parts})")


def register(app: typer.Typer) -> None:
    app.command("info", epilog=EXAMPLES)(info)
