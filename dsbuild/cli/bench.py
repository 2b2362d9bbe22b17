"""`dsbuild bench`: will the input pipeline keep the accelerators fed on this dataset version?

Flags and rendering only; measuring, baselines and the regression gate live in ``dsbuild.bench``."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, QUIET, REF, choice
from dsbuild.cli.render import Out, Progress, styled

EXAMPLES = """\b
Examples:
  dsbuild bench catalog --split main/train --resize 96x96 --duration 20 --save base.json
  dsbuild bench catalog --split main/train --resize 96x96 --duration 20 --baseline base.json
Exit: 0 measured (no regression), 1 regression against --baseline, 2 bad option or baseline."""


def _render(o: Out, rep: dict) -> None:
    from dsbuild.bench.report import table_rows

    ds = rep["dataset"]
    o.line(f"version {o.id(rep['version_id'])} ({ds['samples']} samples, {ds['shards']} shards, "
           f"{ds['shard_bytes'] / 1e6:,.1f} MB); device {rep['config']['device_resolved']}, {rep['config']['rounds']} rounds")
    o.table(["figure", "median", "range over rounds", "ours / baseline"], table_rows(rep), wide=("median",))
    tr = rep["training"]
    if "skipped" not in tr:
        o.line(("fed", "green") if tr["fed"] else ("starved", "red"),
               f": the accelerator waited {tr['wait_fraction']['median'] * 100:.1f}% of the time with a "
               f"{tr['step']['ms']:g} ms step")


def bench(
    ref: str = REF,
    split: str = typer.Option(None, "--split", metavar="NAME/SPLIT", help="One split of a split set, e.g. main/train."),
    batch_size: int = typer.Option(8, "--batch-size", min=1, metavar="N", help="Samples per batch."),
    threads: int = typer.Option(2, "--threads", min=0, metavar="N", help="Loader decode threads per rank."),
    old_workers: int = typer.Option(None, "--workers", hidden=True),  # renamed: --workers always means processes
    ranks: int = typer.Option(1, "--ranks", min=1, metavar="N", help="Simulated data-parallel ranks (processes)."),
    step_ms: float = typer.Option(50.0, "--step-ms", min=0, metavar="MS", help="Simulated training step (0: none)."),
    decode: str = typer.Option("frames", "--decode", metavar="frames|bytes", callback=choice("--decode", ("frames", "bytes")),
                               help="Deliver decoded frames or encoded clips."),
    resize: str = typer.Option(None, "--resize", metavar="HxW", help="Resize frames, e.g. 128x128."),
    device: str = typer.Option("auto", "--device", metavar="auto|cuda|cpu", callback=choice("--device", ("auto", "cuda", "cpu")),
                               help="Where batches go (auto: cuda if present, else cpu; numpy without torch)."),
    duration: float = typer.Option(30.0, "--duration", min=0.1, metavar="S", help="Measured seconds in all."),
    rounds: int = typer.Option(3, "--rounds", min=1, metavar="N", help="Interleaved rounds (figures are medians)."),
    compare: str = typer.Option("raw,pyav,webdataset", "--compare", metavar="A,B", help="Baselines: raw, pyav, webdataset or none."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="The loader's seed."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip the loader's per-sample sha256."),
    baseline: str = typer.Option(None, "--baseline", metavar="FILE", help="A report saved with --save to gate against."),
    fail_below: float = typer.Option(0.9, "--fail-below", min=0, metavar="X", help="With --baseline: exit 1 when a ratio "
                                                                                   "is below X times the saved one."),
    save: str = typer.Option(None, "--save", metavar="FILE", help="Write the JSON report to FILE."),
    html: str = typer.Option(None, "--html", metavar="FILE", help="Write a self-contained HTML page to FILE."),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Measure whether the loader keeps the accelerators fed.

    Throughput, latency, data wait and where the time goes, against baselines measured in the same run."""
    from pathlib import Path

    from dsbuild.bench import BenchOptions, run_bench
    from dsbuild.bench.options import parse_compare, parse_resize
    from dsbuild.bench.report import regressions
    from dsbuild.cli._pending import load_baseline
    from dsbuild.cli.render import json_text
    from dsbuild.core.errors import CheckFailed

    o = Out(as_json, quiet)
    if old_workers is not None:
        from dsbuild.core.errors import UsageError

        raise UsageError("bench --workers is now --threads (loader decode threads per rank)",
                         hint="--workers always means worker processes; use --threads N here")
    options = BenchOptions(ref=ref, split=split, batch_size=batch_size, workers=threads, ranks=ranks, step_ms=step_ms,
                           decode=decode, resize=parse_resize(resize), device=device, duration=duration, rounds=rounds,
                           compare=parse_compare(compare), seed=seed, verify=not no_verify)
    saved = load_baseline(Path(baseline)) if baseline else None
    with Progress("bench", o) as bar:
        current: dict = {}

        def progress(event: dict) -> None:
            if event.get("start"):
                current.update(event)
            stage = f"round {current['round'] + 1}/{current['rounds']} {current['measurement']}"
            bar.update(round(event.get("elapsed", 0.0), 1), round(current["seconds"], 1), stage=stage,
                       detail=f"{event['samples_per_s']:,.1f} samples/s" if "samples_per_s" in event else "")

        rep = run_bench(options, progress=progress)
    failed = regressions(rep, saved, fail_below) if saved else []
    if saved:
        rep["gate"] = {"baseline": baseline, "fail_below": fail_below, "regressions": failed,
                       "baseline_version_id": saved.get("version_id")}
    if save:
        Path(save).write_text(json_text(rep) + "\n")
    if html:
        from dsbuild.bench.html import render

        Path(html).write_text(render(rep))
    if as_json:
        o.json(rep)
    else:
        _render(o, rep)
    for f in failed:
        o.note(("regression ", "red"), f"{f['ratio']}: now {f['now'] if f['now'] is not None else '-'}, saved "
               f"{f['saved']:.3f}, floor {f['floor']:.3f}: {f['problem']}")
    if failed:
        raise CheckFailed(f"{len(failed)} regression(s) against {baseline}", hint="see the report's gate section")
    if saved:
        o.line(styled(("no regression", "green")).plain, f" against {baseline} (floor {fail_below:g} x saved ratios)")


def register(app: typer.Typer) -> None:
    app.command("bench", epilog=EXAMPLES)(bench)
