"""`dsbuild convert`: captures -> a new version in a catalog (or, with --dry-run, what would change)."""

from __future__ import annotations

import typer

from dsbuild.cli.params import EXECUTOR, JSON, QUIET, RAY_ADDRESS, WORKERS
from dsbuild.cli.render import Out, Progress, rate, to_stderr

EXAMPLES = """\b
Examples:
  dsbuild convert caps catalog --clip-seconds 4 --shard-size 64MB
  dsbuild convert caps catalog --dry-run          # new, changed, reused, healed, quarantined sessions
  dsbuild convert s3://raw/caps s3://datasets/cat --workers 8
Exit: 0 committed (or already there), 1 --strict and a session was quarantined or a stream lost over 1%
of its lines, 2 bad input, 3 storage. The capture format: docs/capture-format.md."""


def convert(
    captures: str = typer.Argument(
        ..., metavar="CAPTURES", help="Capture root (folder or fsspec URL): every folder below it with a session.json."
    ),
    out: str = typer.Argument(
        ..., metavar="CATALOG", help="Catalog folder or fsspec URL; each convert adds a version."
    ),
    format: str = typer.Option("webdataset", "--format", metavar="FORMAT", help="Shard format: webdataset or parquet."),
    clip_seconds: float = typer.Option(
        8.0, "--clip-seconds", metavar="S", help="Target clip length (cut at keyframes)."
    ),
    shard_size: str = typer.Option(
        "256MB", "--shard-size", metavar="SIZE", help="Target shard size: 256MB, 1GiB, bytes."
    ),
    audio: bool = typer.Option(True, "--audio/--no-audio", help="Carry the capture's first audio track in each clip."),
    transcode: str = typer.Option(
        None,
        "--transcode",
        metavar="SPEC",
        help="Re-encode clips: codec[:WxH][:<rate>fps][:gop<N>][:crf<N>][:bf<N>][:<pix_fmt>], "
        "e.g. h264:256x256:30fps:gop8.",
    ),
    zstd_level: int = typer.Option(
        3,
        "--zstd-level",
        metavar="N",
        min=1,
        max=22,
        help="zstd level of each clip's action events (1-22; level 10 costs 4-8x the CPU for <20% smaller events).",
    ),
    workers: int = WORKERS,
    executor: str = EXECUTOR,
    ray_address: str = RAY_ADDRESS,
    onto: str = typer.Option(
        None,
        "--onto",
        metavar="VERSION",
        help="Build onto this version (id, prefix or tag): reuse its unchanged sessions.",
    ),
    rehash: bool = typer.Option(False, "--rehash", help="Re-hash reused shards and rewrite damaged ones."),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Only say which sessions are new, changed, reused, healed, quarantined or removed; write nothing.",
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Exit 1 if any session was quarantined or a stream lost over 1% of its lines."
    ),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Build a version from captures.

    Cut sessions into keyframe-aligned clips and write content-addressed shards and a manifest."""
    from dsbuild.convert import ConvertConfig, parse_size
    from dsbuild.core.errors import CheckFailed
    from dsbuild.core.executor import ExecutorSpec

    o = Out(as_json, quiet)
    config = ConvertConfig(
        format=format,
        clip_seconds=clip_seconds,
        shard_size=parse_size(shard_size, "--shard-size"),
        audio=audio,
        transcode=transcode,
        zstd_level=zstd_level,
    )
    spec = ExecutorSpec(executor, workers, ray_address)
    if dry_run:
        from dsbuild.convert import plan_convert

        return _render_plan(o, plan_convert(captures, out, config, onto=onto))
    from dsbuild.convert import convert as run_convert

    with Progress("convert", o) as bar:
        drawn = {"sessions": -1, "shards": (-1, -1)}

        def progress(p) -> None:  # (each stage drawn when it moved: a finished stage is printed at every update)
            if p.done != drawn["sessions"]:
                drawn["sessions"] = p.done
                bar.update(
                    p.done,
                    p.total,
                    stage="sessions",
                    detail=f"{p.samples} clips, {rate(p.bytes, p.started)}"
                    + (f", {p.quarantined} quarantined" if p.quarantined else ""),
                )
            if p.shards_total and (p.shards_done, p.shards_total) != drawn["shards"]:
                drawn["shards"] = (p.shards_done, p.shards_total)
                bar.update(p.shards_done, p.shards_total, stage="shards")

        r = run_convert(captures, out, config, executor=spec, onto=onto, rehash=rehash, on_progress=progress)
    if as_json:
        o.json(r.to_json())
    elif quiet:
        o.value(r.version_id)
    else:
        _render(o, r)
    warnings = [s.message() for s in r.lossy_streams] + ([r.keyframe_hint] if r.keyframe_hint else [])
    for w in warnings if not quiet else ():  # (on stderr also under --json, whose report lists them too)
        to_stderr(("warning ", "yellow"), w)
    failed = ([f"{len(r.quarantined)} session(s) quarantined"] if r.quarantined else []) + (
        [f"{len(r.lossy_streams)} stream(s) lost over 1% of their lines"] if r.lossy_streams else []
    )
    if strict and failed:
        raise CheckFailed(
            f"{' and '.join(failed)} and --strict is set (version {r.version_id[:12]} was committed)",
            hint="`--json` lists every reason",
        )


def _render(o: Out, r) -> None:
    o.line(
        ("version ", "bold"),
        (o.id(r.version_id), "bold"),
        " already existed" if r.existed else " committed",
        f" in {r.catalog}",
    )
    o.pairs(
        [
            ("content id", o.id(r.content_id)),
            ("format", r.format),
            ("sessions", r.sessions),
            ("samples", r.samples),
            ("shards", f"{r.shards} ({r.written_shards} written, {r.reused_shards} reused)"),
            ("bytes", o.size(r.bytes)),
            ("bytes written", o.size(r.written_bytes)),
            ("parent", o.id(r.parent)),
            ("sessions reused", r.reused_sessions),
            ("sessions healed", r.healed_sessions),
            ("sessions repaired", r.repaired_sessions),
            ("long clips (kept whole)", r.long_clips),
            ("quarantined", len(r.quarantined)),
            ("repairs and drops", _repairs(r.repairs)),
            ("seconds", r.seconds),
            ("rate", f"{r.written_bytes / max(r.seconds, 1e-9) / 1e6:,.1f} MB/s written"),
        ]
    )
    for q in r.quarantined:
        o.line(("quarantined ", "yellow"), q.session, ": ", q.path, ": ", q.reason)


def _repairs(totals: dict[str, dict[str, int]]) -> str:
    """The non-zero totals, by stream ("none" when a convert kept everything as it was)."""
    parts = [
        f"{stream}: " + ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in counts.items() if n)
        for stream, counts in totals.items()
        if any(counts.values())
    ]
    return "; ".join(parts) + " (per session in sessions.json)" if parts else "none"


def _render_plan(o: Out, plan) -> None:
    if o.as_json:
        return o.json(plan.to_json())
    o.line(
        "dry run: nothing written. ",
        f"parent {o.id(plan.parent)}" if plan.parent else "no parent version",
        "" if plan.reusable or not plan.parent else " (built with other settings: every session is rebuilt)",
    )
    o.table(
        ["session", "state", "path", "reason"], [(s.session, s.state, s.path, s.reason or "") for s in plan.sessions]
    )
    counts = plan.to_json()["counts"]
    o.line(", ".join(f"{n} {state}" for state, n in counts.items()))


def register(app: typer.Typer) -> None:
    app.command("convert", epilog=EXAMPLES)(convert)
