"""`dsbuild samples`: write sample captures that follow the capture contract."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, QUIET, choice, seed_option
from dsbuild.cli.render import Out

MAX_SECONDS = 6 * 3600  # a session's length: sample captures, not an archive (memory grows with it)

EXAMPLES = """\b
Examples:
  dsbuild samples caps --sessions 6 --seconds 20 --seed 7
  dsbuild samples damaged --sessions 3 --damage 1=truncated_video
  dsbuild samples atari --source atari --games Breakout,Pong --sessions 2
  dsbuild samples robots --source mujoco --tasks walker-walk,cheetah-run --seconds 5"""


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _fresh_folder(out: str) -> None:
    """Refuse a FOLDER that is a file or already holds something: sessions written into it would replace
    folders of the same name and mix with the others into one capture set."""
    from pathlib import Path

    from dsbuild.core.errors import UsageError

    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{out}: is a file" if path.is_file() else f"{out}: is not a folder", hint="name a new folder")
    if path.is_dir() and any(path.iterdir()):
        raise UsageError(f"{out}: the folder is not empty", hint="choose a new folder or remove it")


def samples(
    out: str = typer.Argument(..., metavar="FOLDER", help="A new (or empty) local folder to write sessions into."),
    source: str = typer.Option(
        "synthetic",
        "--source",
        metavar="synthetic|atari|mujoco",
        callback=choice("--source", ("synthetic", "atari", "mujoco")),
        help="synthetic (generated), atari (real gameplay recorded with ale-py) or mujoco (dm_control robots).",
    ),
    sessions: int = typer.Option(
        3, "--sessions", min=1, metavar="N", help="Sessions (per game or task with --source atari or mujoco)."
    ),
    seconds: float = typer.Option(
        10.0, "--seconds", min=0.5, max=MAX_SECONDS, metavar="S", help="Length of each session."
    ),
    seed: int = seed_option("The same seed gives byte-identical captures."),
    damage: list[str] = typer.Option(
        [],
        "--damage",
        metavar="[INDEX=]KIND",
        help="Damage session INDEX (default: its position in the list) in one way; repeatable. Kinds: see the README.",
    ),
    noise: int = typer.Option(0, "--noise", min=0, max=255, metavar="0-255", help="Grain for realistic bitrates."),
    games: str = typer.Option(None, "--games", metavar="A,B", help="atari: games (default Breakout,Pong,MsPacman)."),
    policy: str = typer.Option(
        None,
        "--policy",
        metavar="P[,P]",
        help="atari: random, sticky or scripted; mujoco: random, smooth or scripted; or a list cycled over sessions.",
    ),
    upscale: int = typer.Option(None, "--upscale", min=1, max=8, metavar="1-8", help="atari: pixel upscale factor."),
    tasks: str = typer.Option(
        None,
        "--tasks",
        metavar="A,B",
        help="mujoco: dm_control tasks (default walker-walk,cheetah-run,manipulator-bring_ball).",
    ),
    size: int = typer.Option(
        None, "--size", min=16, max=1024, metavar="PIXELS", help="mujoco: square frame size (default 128)."
    ),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Write sample captures (synthetic, Atari or MuJoCo robots).

    Real H.264 video: synthetic sessions (optionally damaged, for tests), real Atari gameplay
    (--source atari; needs the `atari` extra) or dm_control robots in MuJoCo physics (--source mujoco;
    needs the `mujoco` extra)."""
    from pathlib import Path

    from dsbuild.core.errors import UsageError
    from dsbuild.core.store import is_url

    o = Out(as_json, quiet)
    if not 0.5 <= seconds <= MAX_SECONDS:  # click's range lets nan through
        raise UsageError(f"--seconds must be a number from 0.5 to {MAX_SECONDS}, not {seconds!r}")
    if not out.strip():
        raise UsageError("the output folder is empty", hint="name a folder, e.g. `dsbuild samples caps`")
    if is_url(out):
        raise UsageError(f"{out}: samples writes a local folder", hint="upload the folder afterwards")
    _fresh_folder(out)
    if source != "synthetic" and (damage or noise):
        raise UsageError("--damage and --noise work with --source synthetic only")
    if source != "atari" and (games is not None or upscale is not None):
        raise UsageError("--games and --upscale work with --source atari only")
    if source != "mujoco" and (tasks is not None or size is not None):
        raise UsageError("--tasks and --size work with --source mujoco only")
    if source == "mujoco":
        from dsbuild.samples.mujoco import DEFAULT_TASKS, MujocoOptions
        from dsbuild.samples.mujoco import record as record_mujoco

        robots = MujocoOptions(
            tasks=_csv(tasks) if tasks is not None else DEFAULT_TASKS,
            sessions=sessions,
            seconds=seconds,
            policies=_csv(policy) if policy is not None else MujocoOptions.policies,
            seed=seed,
            size=size or MujocoOptions.size,
        )
        paths, plan = [r.path for r in record_mujoco(Path(out), robots)], dict[int, str]()
    elif source == "atari":
        from dsbuild.samples.atari import DEFAULT_GAMES, AtariOptions, record

        options = AtariOptions(
            games=_csv(games) if games is not None else DEFAULT_GAMES,
            sessions=sessions,
            seconds=seconds,
            policies=_csv(policy) if policy is not None else ("sticky",),
            seed=seed,
            upscale=upscale or 1,
        )
        paths, plan = [r.path for r in record(Path(out), options)], dict[int, str]()
    else:
        if policy is not None:
            raise UsageError("--policy works with --source atari or mujoco only")
        from dsbuild.samples.synthetic import generate, parse_damage

        plan = parse_damage(damage, sessions)
        paths = generate(Path(out), sessions=sessions, seconds=seconds, seed=seed, damage=plan, noise=noise)
    if as_json:
        o.json({"source": source, "sessions": [str(p) for p in paths], "damage": plan})
    else:
        o.line(f"wrote {len(paths)} {source} sessions to {out}")


def register(app: typer.Typer) -> None:
    app.command("samples", epilog=EXAMPLES)(samples)
