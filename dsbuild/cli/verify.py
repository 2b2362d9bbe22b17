"""`dsbuild verify`: prove a version's bytes are what its id says; exit 1 on any problem."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, QUIET, REF, seed_option
from dsbuild.cli.render import Out, Progress

EXAMPLES = """\b
Examples:
  dsbuild verify catalog@gold
  dsbuild verify s3://datasets/cat --sample 10 --seed 1
Exit: 0 intact, 1 damage found (the report names the command that heals it), 2 bad ref, 3 storage."""


def verify(
    ref: str = REF,
    sample: int = typer.Option(None, "--sample", min=1, metavar="N", help="Check only N shards, chosen by --seed."),
    seed: int = seed_option("Seed for --sample."),
    threads: int = typer.Option(4, "--threads", min=1, metavar="N", help="Shards hashed at once (threads)."),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Prove a version's bytes are what its id says.

    Version id = sha256(manifest), index = its pin, every shard = its name = its bytes, every index
    entry inside its shard."""
    from dsbuild.core.errors import CheckFailed
    from dsbuild.lineage.catalog import open_ref
    from dsbuild.lineage.verify import verify as run_verify

    o = Out(as_json, quiet)
    catalog, version = open_ref(ref)
    with Progress("verify", o) as bar:
        r = run_verify(
            catalog,
            version,
            sample=sample,
            seed=seed,
            threads=threads,
            progress=lambda done, total: bar.update(done, total, stage="shards"),
        )
    if as_json:
        o.json(r.to_json())
    else:
        o.line(
            f"version {o.id(version)}: {r.shards_checked} shards, {r.bytes_checked:,} bytes, "
            f"{r.samples_checked} samples checked: ",
            ("OK", "green") if r.ok else (f"{len(r.problems)} problem(s)", "red"),
        )
        o.table(
            ["problem", "where", "detail"],
            [
                (
                    p["problem"],
                    p.get("shard") or p.get("sample") or p.get("index") or p.get("version"),
                    (f"sample {p['sample']}: " if p.get("sample") and p.get("shard") else "")
                    + str(p.get("detail", "")),
                )
                for p in r.problems
            ],
        )
    if not r.ok:
        raise CheckFailed(
            f"version {version[:12]} of {catalog.url}: {len(r.problems)} problem(s)",
            hint=f"heal with: {r.heal}" if r.heal else None,
        )


def register(app: typer.Typer) -> None:
    app.command("verify", epilog=EXAMPLES)(verify)
