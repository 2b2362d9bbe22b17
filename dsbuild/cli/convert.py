"""`dsbuild convert`: captures -> a new version in a catalog."""

from __future__ import annotations

from pathlib import Path

import typer

from dsbuild.cli.render import SessionProgress, console, print_json


def convert(
    captures: Path = typer.Argument(..., help="Capture root: every folder below it with a session.json."),
    out: Path = typer.Argument(..., help="Catalog folder; each convert adds a version to it."),
    format: str = typer.Option("webdataset", "--format", help="webdataset (tar) or parquet."),
    clip_seconds: float = typer.Option(8.0, "--clip-seconds", help="Target clip length (cut at keyframes)."),
    shard_size: str = typer.Option("256MB", "--shard-size", help="Target shard size, e.g. 256MB or 1GiB."),
    audio: bool = typer.Option(True, "--audio/--no-audio", help="Carry the capture's audio in each clip."),
    transcode: str = typer.Option(None, "--transcode", help="Re-encode clips, e.g. h264:256x256:30fps:gop8 "
                                  "(codec[:WxH][:<rate>fps][:gop<N>][:crf<N>][:bf<N>][:<pix_fmt>])."),
    workers: int = typer.Option(0, "--workers", help="Worker processes (0 = one per core)."),
    executor: str = typer.Option("local", "--executor", help="local (process pool) or ray."),
    ray_address: str = typer.Option(None, "--ray-address", help="Ray cluster address (default: start a local Ray)."),
    onto: str = typer.Option(None, "--onto", help="Build incrementally onto this version (id, prefix or tag)."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 if any session was quarantined."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
) -> None:
    """Cut sessions into keyframe-aligned clips and write content-addressed shards + a manifest."""
    from dsbuild.convert import ConvertConfig, convert as run_convert
    from dsbuild.convert.config import parse_size

    config = ConvertConfig(format=format, clip_seconds=clip_seconds, shard_size=parse_size(shard_size),
                           audio=audio, transcode=transcode)
    with SessionProgress("convert", enabled=not as_json) as progress:
        result = run_convert(captures, out, config, workers=workers or None, onto=onto,
                                 executor=executor, ray_address=ray_address, on_progress=progress)
    if as_json:
        print_json(result.to_json())
    else:
        _render(result)
    if strict and result.quarantined:
        raise typer.Exit(1)


def _render(r) -> None:
    from rich.table import Table

    state = "already existed" if r.existed else "committed"
    console.print(f"[bold]version {r.version_id[:12]}[/] {state} in {r.catalog}  (content {r.content_id[:12]})")
    t = Table(show_header=False, box=None)
    for k, v in [("format", r.format), ("sessions", r.sessions), ("samples", r.samples), ("shards", r.shards),
                 ("bytes", f"{r.bytes:,}"), ("long clips (kept whole)", r.long_clips),
                 ("sessions repaired", r.repaired_sessions), ("quarantined", len(r.quarantined)),
                 ("parent", (r.parent or "-")[:12]), ("sessions reused from parent", r.reused_sessions),
                 ("bytes written", f"{r.written_bytes:,}"),
                 ("seconds", r.seconds)]:
        t.add_row(k, str(v))
    console.print(t)
    for q in r.quarantined:
        console.print(f"[yellow]quarantined[/] {q['session']}: {q['path']}: {q['reason']}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("convert")(convert)
