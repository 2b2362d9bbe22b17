"""`dsbuild samples`: write sample captures that follow the capture contract."""

from __future__ import annotations

from pathlib import Path

import typer

from dsbuild.cli.render import console, print_json
from dsbuild.core.errors import UsageError

SOURCES = ("synthetic", "atari")


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def samples(
    out: Path = typer.Argument(..., help="Folder to write sessions into."),
    source: str = typer.Option("synthetic", "--source",
                               help="synthetic (generated) or atari (real gameplay recorded with ale-py)."),
    sessions: int = typer.Option(3, "--sessions", help="Number of sessions (per game with --source atari)."),
    seconds: float = typer.Option(10.0, "--seconds", help="Length of each session in seconds."),
    seed: int = typer.Option(0, "--seed", help="Seed: the same seed gives byte-identical captures."),
    damage: list[str] = typer.Option([], "--damage", help="Inject damage: KIND or INDEX=KIND (repeatable)."),
    noise: int = typer.Option(0, "--noise", help="Add grain (0-255) for realistic bitrates in benchmarks."),
    games: str = typer.Option(None, "--games", help="atari: comma list of games (default "
                                                    "Breakout,Pong,MsPacman; any ale-py ROM id works)."),
    policy: str = typer.Option(None, "--policy",
                               help="atari: random, sticky or scripted, or a comma list cycled over "
                                    "sessions (default sticky)."),
    upscale: int = typer.Option(None, "--upscale", help="atari: integer pixel upscale factor 1-8 (default 1)."),
    as_json: bool = typer.Option(False, "--json", help="Print the written sessions as JSON."),
) -> None:
    """Write sample captures with real H.264 video: synthetic ones (optionally damaged, for tests) or
    real Atari gameplay (--source atari; needs the ale-py package, the `atari` extra)."""
    if source not in SOURCES:
        raise UsageError(f"--source must be one of {', '.join(SOURCES)}, not {source!r}")
    if source == "atari":
        if damage or noise:
            raise UsageError("--damage and --noise work with --source synthetic only")
        from dsbuild.samples.atari import DEFAULT_GAMES, AtariOptions, record

        options = AtariOptions(
            games=_csv(games) if games is not None else DEFAULT_GAMES, sessions=sessions, seconds=seconds,
            policies=_csv(policy) if policy is not None else ("sticky",), seed=seed,
            upscale=upscale if upscale is not None else 1,
        )
        paths = [r.path for r in record(out, options)]
        if as_json:
            print_json({"sessions": [str(p) for p in paths], "source": source})
        else:
            console.print(f"wrote {len(paths)} Atari sessions to {out}")
        return
    if games is not None or policy is not None or upscale is not None:
        raise UsageError("--games, --policy and --upscale work with --source atari only")
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
