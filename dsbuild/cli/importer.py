"""`dsbuild import`: recordings people already have, written as captures (docs/import.md)."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, QUIET
from dsbuild.cli.render import Out, Progress

VIDEO_EXAMPLES = """\b
Examples:
  dsbuild import video recordings captures --title "Kart Storm" --player p-7f3a91
  dsbuild import video recordings captures --pattern '{title}/{player}/{session}.mkv'
  dsbuild import video obs captures --title Kart --clock meta      # input logs in absolute time
Exit: 0 imported, 1 --strict and a line or file was dropped, 2 bad input. See docs/import.md."""

MCAP_EXAMPLES = """\b
Examples:
  dsbuild import mcap run.mcap captures --video-topic /camera/image_raw --action-topic /cmd
  dsbuild import mcap bags captures --video-topic /cam --telemetry-topic /joint_states --title Reach
Exit: 0 imported, 1 --strict and a message or file was dropped, 2 bad input. See docs/import.md."""

LEROBOT_EXAMPLES = """\b
Examples:
  dsbuild import lerobot lerobot/pusht captures                     # v2.1 or v3.0, one session per episode
  dsbuild import lerobot so100_pick captures --camera observation.images.wrist --title "SO-100 pick"
Exit: 0 imported, 1 --strict and a row, frame or episode was dropped, 2 bad input. See docs/import.md."""

import_app = typer.Typer(
    help="Bring your own recordings: write them as captures that `dsbuild convert` reads.",
    epilog="\b\nExamples:\n  dsbuild import video recordings captures --title Kart --player p-7f3a91\n"
    "  dsbuild import mcap run.mcap captures --video-topic /camera --action-topic /cmd\n"
    "  dsbuild import lerobot so100_pick captures\nSee docs/import.md.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

STRICT = typer.Option(False, "--strict", help="Exit 1 if any file, line or value was dropped.")
CONDITION = typer.Option(
    [], "--condition", metavar="KEY=VALUE", help="A condition label for every session; repeatable."
)
CRF = typer.Option(18, "--crf", min=0, max=51, metavar="0-51", help="H.264 quality of the re-encoded video.")


def _conditions(pairs: list[str]) -> tuple[tuple[str, str], ...]:
    from dsbuild.core.errors import UsageError

    out = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--condition {pair!r}: expected KEY=VALUE", hint="e.g. --condition track=harbor")
        out.append((key.strip(), value))
    return tuple(out)


def _render(o: Out, report, strict: bool) -> None:
    """The report (human or --json), then --strict's verdict."""
    from dsbuild.core.errors import CheckFailed

    if o.as_json:
        o.json(report.to_json())
    else:
        dropped, guessed = report.totals("dropped"), report.totals("guessed")
        o.line(f"imported {len(report.sessions)} session(s) into {report.output}")
        for f, reason in report.failed:
            o.note(("warning", "yellow"), f" {f}: {reason}")
        for s in report.sessions:
            for problem in s.problems:
                o.note(f"{s.session_id}: {problem}")
        o.pairs(
            [
                ("failed files", len(report.failed)),
                ("ignored files", report.ignored),
                ("dropped", ", ".join(f"{k} {v}" for k, v in dropped.items()) or "none"),
                ("guessed", ", ".join(f"{k} {v}" for k, v in guessed.items()) or "none"),
            ]
        )
    if strict and (report.failed or report.drops):
        raise CheckFailed(f"--strict: {len(report.failed)} file(s) refused and {report.drops} value(s) dropped")


def video(
    src: str = typer.Argument(..., metavar="SRC", help="Folder of video files (any container FFmpeg opens)."),
    out: str = typer.Argument(..., metavar="CAPTURES", help="A new (or empty) folder to write the captures into."),
    title: str = typer.Option(None, "--title", metavar="TEXT", help="The game's title (overrides --pattern)."),
    player: str = typer.Option(None, "--player", metavar="ID", help="Who played (overrides --pattern)."),
    condition: list[str] = CONDITION,
    pattern: str = typer.Option(
        None,
        "--pattern",
        metavar="PATTERN",
        help="Fields from each video's path under SRC: {title}, {player}, {session}, any other {name} a "
        "condition, * anything within a folder; e.g. '{title}/{player}/{session}.mkv'.",
    ),
    clock: str = typer.Option(
        None,
        "--clock",
        metavar="TIME|meta",
        help="Log times are absolute (epoch seconds or ISO 8601); the first frame was shown at TIME "
        "(ISO 8601), or at the container's creation_time (meta).",
    ),
    strict: bool = STRICT,
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Import a folder of videos with their input logs.

    Each video is one session; NAME.inputs.csv (t,control,value; value a number or down/up) or
    NAME.inputs.jsonl beside it becomes its actions, NAME.telemetry.csv (t,channel,...) its telemetry.
    A line that does not fit the video is named with file and line and dropped."""
    from pathlib import Path

    from dsbuild.importers.video import VideoImport, import_videos

    o = Out(as_json, quiet)
    options = VideoImport(title, player, _conditions(condition), pattern, clock)
    with Progress("import", o) as bar:
        report = import_videos(
            Path(src), Path(out), options, lambda done, total, detail: bar.update(done, total, detail=detail)
        )
    _render(o, report, strict)


def mcap(
    src: str = typer.Argument(..., metavar="SRC", help="An .mcap file, or a folder of them (each file a session)."),
    out: str = typer.Argument(..., metavar="CAPTURES", help="A new (or empty) folder to write the captures into."),
    video_topic: str = typer.Option(
        ...,
        "--video-topic",
        metavar="TOPIC",
        help="The topic that becomes the video: images (raw, JPEG or PNG; re-encoded) or compressed video "
        "(H.264 or H.265; remuxed).",
    ),
    telemetry_topic: list[str] = typer.Option(
        [], "--telemetry-topic", metavar="TOPIC", help="A topic whose numeric fields become telemetry; repeatable."
    ),
    action_topic: list[str] = typer.Option(
        [], "--action-topic", metavar="TOPIC", help="A topic whose numeric fields become actions; repeatable."
    ),
    title: str = typer.Option(None, "--title", metavar="TEXT", help="The task or robot (default: the file's name)."),
    player: str = typer.Option(None, "--player", metavar="ID", help="Who or what recorded it (default: unknown)."),
    condition: list[str] = CONDITION,
    crf: int = CRF,
    strict: bool = STRICT,
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Import MCAP robot logs (JSON, ROS 2 CDR or protobuf channels).

    Each file is one session: an image topic is re-encoded as the video (a compressed-video topic is
    remuxed), at its log times (zero at the first frame); chosen topics' numeric fields become telemetry
    and actions (continuous controls), named by topic and field path (joint_states/position.0)."""
    from pathlib import Path

    from dsbuild.importers.mcap import McapImport, import_mcap

    o = Out(as_json, quiet)
    options = McapImport(
        video_topic, tuple(telemetry_topic), tuple(action_topic), title, player, _conditions(condition), crf
    )
    with Progress("import", o) as bar:
        report = import_mcap(
            Path(src), Path(out), options, lambda done, total, detail: bar.update(done, total, detail=detail)
        )
    _render(o, report, strict)


def lerobot(
    src: str = typer.Argument(..., metavar="SRC", help="A LeRobot dataset folder (meta/info.json, data/, videos/)."),
    out: str = typer.Argument(..., metavar="CAPTURES", help="A new (or empty) folder to write the captures into."),
    camera: str = typer.Option(
        None, "--camera", metavar="KEY", help="The camera whose stream comes first (default: the first in info.json)."
    ),
    title: str = typer.Option(None, "--title", metavar="TEXT", help="The task or robot (default: the folder's name)."),
    player: str = typer.Option(None, "--player", metavar="ID", help="Who or what recorded it (default: robot_type)."),
    condition: list[str] = CONDITION,
    crf: int = CRF,
    strict: bool = STRICT,
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Import a LeRobot dataset (codebase v2.1 or v3.0), one session per episode.

    Each camera becomes a stream of the session's video at the dataset's fps; action becomes actions
    (continuous controls action.0, ...), the other numeric features telemetry, the task text a condition
    and a text event. Times are the parquet's timestamps, kept on the 1/fps grid."""
    from pathlib import Path

    from dsbuild.importers.lerobot import LeRobotImport, import_lerobot

    o = Out(as_json, quiet)
    options = LeRobotImport(title, player, _conditions(condition), camera, crf)
    with Progress("import", o) as bar:
        report = import_lerobot(
            Path(src), Path(out), options, lambda done, total, detail: bar.update(done, total, detail=detail)
        )
    _render(o, report, strict)


def register(app: typer.Typer) -> None:
    import_app.command("video", epilog=VIDEO_EXAMPLES)(video)
    import_app.command("mcap", epilog=MCAP_EXAMPLES)(mcap)
    import_app.command("lerobot", epilog=LEROBOT_EXAMPLES)(lerobot)
    app.add_typer(import_app, name="import")
