"""`dsbuild samples`: write sample captures that follow the capture contract."""

from __future__ import annotations

from pathlib import Path

import typer

from dsbuild.cli.render import console, print_json


def samples(
    out: Path = typer.Argument(..., help="Folder to write sessions into."),
    sessions: int = typer.Option(3, "--sessions", help="Number of sessions."),
    seconds: float = typer.Option(10.0, "--seconds", help="Length of each session in seconds."),
    seed: int = typer.Option(0, "--seed", help="Seed: the same seed gives byte-identical captures."),
    damage: list[str] = typer.Option([], "--damage", help="Inject damage: KIND or INDEX=KIND (repeatable)."),
    noise: int = typer.Option(0, "--noise", help="Add grain (0-255) for realistic bitrates in benchmarks."),
    as_json: bool = typer.Option(False, "--json", help="Print the written sessions as JSON."),
) -> None:
    """Generate synthetic captures with real H.264 video (and optionally damaged ones, for tests)."""
    from dsbuild.samples.synthetic import generate

    plan = {}
    for i, item in enumerate(damage):
        index, _, kind = item.rpartition("=")
        plan[int(index) if index else i] = kind
    paths = generate(out, sessions=sessions, seconds=seconds, seed=seed, damage=plan, noise=noise)
    if as_json:
        print_json({"sessions": [str(p) for p in paths], "damage": plan})
    else:
        console.print(f"wrote {len(paths)} sessions to {out}")


def register(app: typer.Typer) -> None:
    app.command("samples")(samples)
