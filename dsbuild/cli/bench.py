"""`dsbuild bench`: will the input pipeline keep the accelerators fed on this dataset version?

Flags and rendering only; measuring, baselines and the regression gate live in ``dsbuild.bench``."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, QUIET, REF, choice, report_files, seed_option
from dsbuild.cli.render import Out, Progress

EXAMPLES = """\b
Examples:
  dsbuild bench catalog --split main/train --resize 96x96 --duration 20 --save base.json
  dsbuild bench catalog --split main/train --resize 96x96 --duration 20 --baseline base.json
  dsbuild bench catalog --decode bytes --verify shard --html bench.html
  dsbuild bench catalog --model tiny --ranks 1,2 --parallel fsdp --history runs/
  dsbuild bench history runs/
Exit: 0 measured (no regression), 1 regression against --baseline, 2 bad option or incomparable baseline,
130 interrupted (the rounds finished so far are reported, and saved with --save)."""


def _render(o: Out, rep) -> None:
    from dsbuild.bench import tables

    first, *rest = tables.headline(rep)
    split = f" split {rep.dataset.split}" if rep.dataset.split else ""
    o.line(f"version {o.id(rep.dataset.version_id)}{split}: {first}")
    for line in rest:
        o.line(line)
    if rep.ours is None:
        return
    o.table(
        list(tables.COMPARISON),
        tables.comparison_rows(rep),
        title=f"{rep.unit} over rounds; ours / run is computed per round, then its median",
    )
    for b in rep.baselines:
        if b.skipped is not None:
            o.line(("skipped ", "yellow"), f"{b.name}: {b.skipped}")
    o.table(list(tables.OURS), tables.ours_rows(rep))
    fed = tables.verdict(rep)
    if fed is not None:
        o.line((fed[0], "green" if fed[0] == "fed" else "red"), f": {fed[1]}")
    stage = rep.stages.get("training") or rep.stages.get("throughput")
    busy = stage.read + stage.decode + stage.collate
    if busy > 0:
        o.line(
            "worker time: "
            + ", ".join(f"{s} {getattr(stage, s) / busy * 100:.0f}%" for s in ("read", "decode", "collate"))
        )
    if stage.wall > 0:
        o.line(
            "consumer time: "
            + ", ".join(f"{s} {getattr(stage, s) / stage.wall * 100:.0f}%" for s in ("wait", "h2d", "step", "other"))
        )
    for note in rep.ours.notes:
        o.line(("note ", "yellow"), note)
    if rep.ours.corrupt:
        o.line(("corrupt ", "red"), f"{rep.ours.corrupt} damaged sample(s) were replaced")
    if rep.rank_work is not None:
        from dsbuild.bench import balance

        w = rep.rank_work
        o.table(
            list(balance.COLUMNS),
            balance.rows(w),
            title=f"frames per data-parallel rank per step, {w.dp} ranks, the plan's first {w.steps} steps (means); "
            "straggler cost: step time beyond an even split if a rank's time follows its frames",
        )
    g = rep.gate
    if g is not None:
        o.table(
            list(tables.GATE),
            tables.gate_rows(g),
            title=f"gate against {g.baseline_file}: a ratio dropped when below {g.fail_below:g} x saved and by more "
            "than the spread (the larger IQR of the two runs); ours regressed if it dropped against all",
        )
        for d in g.differences:
            o.line(("allowed difference ", "yellow"), d)
        for d in g.machine_differences:
            o.line(("note ", "yellow"), d)


def _world(text: str) -> int:
    """--ranks without --model: one count (a list is a scaling sweep of --model)."""
    from dsbuild.bench.train.options import parse_ranks
    from dsbuild.core.errors import UsageError

    counts = parse_ranks(text)
    if len(counts) > 1:
        raise UsageError(f"--ranks {text}: a list of rank counts is a scaling sweep, which needs --model")
    return counts[0]


def bench(
    ref: str = REF,
    folder: str = typer.Argument(None, metavar="[DIR]", help="`bench history DIR`: the history to judge."),
    split: str = typer.Option(None, "--split", metavar="NAME/SPLIT", help="One split of a split set, e.g. main/train."),
    batch_size: int = typer.Option(8, "--batch-size", min=1, metavar="N", help="Samples per batch."),
    threads: str = typer.Option(
        "2", "--threads", metavar="N|N,M", help="Loader threads per rank; a list is a scaling sweep (1,2,4)."
    ),
    workers: str = typer.Option(
        None,
        "--workers",
        metavar="N|N,M",
        help="Loader worker processes per rank instead of threads; a list is a scaling sweep (1,2,4,8).",
    ),
    ranks: str = typer.Option(
        "1", "--ranks", metavar="N|N,M", help="Data-parallel ranks (processes); with --model a list is a scaling sweep."
    ),
    step_ms: float = typer.Option(50.0, "--step-ms", min=0, metavar="MS", help="Simulated training step (0: none)."),
    decode: str = typer.Option(
        "frames",
        "--decode",
        metavar="frames|bytes",
        callback=choice("--decode", ("frames", "bytes")),
        help="Deliver decoded frames (compared with a bare PyAV loop) or encoded clips "
        "(compared with raw reads, sha256, webdataset and the peers).",
    ),
    decode_backend: str = typer.Option(
        "pyav",
        "--decode-backend",
        metavar="pyav|torchcodec|nvdec|auto",
        callback=choice("--decode-backend", ("pyav", "torchcodec", "nvdec", "auto")),
        help="Video decoder of frames mode (nvdec: the GPU through PyAV's FFmpeg; auto: the fastest measured, PyAV today).",
    ),
    resize: str = typer.Option(None, "--resize", metavar="HxW", help="Resize frames, e.g. 128x128."),
    verify: str = typer.Option(
        "sample",
        "--verify",
        metavar="sample|shard|none",
        callback=choice("--verify", ("sample", "shard", "none")),
        help="The loader's verification: a hash per sample read (BLAKE3), per shard once, or none.",
    ),
    device: str = typer.Option(
        "auto",
        "--device",
        metavar="auto|cuda|cpu",
        callback=choice("--device", ("auto", "cuda", "cpu")),
        help="Where batches go (auto: cuda if present, else cpu; numpy without torch).",
    ),
    duration: float = typer.Option(
        30.0,
        "--duration",
        min=0.1,
        metavar="S",
        help="Wall seconds of all rounds and baselines together (start-up not included).",
    ),
    rounds: int = typer.Option(
        5,
        "--rounds",
        min=1,
        metavar="N",
        help="Interleaved rounds (the gate needs >= 3); with --model, the rounds the --steps are cut into.",
    ),
    compare: str = typer.Option(
        "auto",
        "--compare",
        metavar="auto|none|A,B",
        help="Baselines: pyav, pyav-procs (frames; --workers runs: pyav-procs); raw, sha256, webdataset, litdata, mosaic (bytes).",
    ),
    seed: int = seed_option("The loader's seed."),
    baseline: str = typer.Option(
        None, "--baseline", metavar="FILE", help="A report saved with --save to gate against."
    ),
    fail_below: float = typer.Option(
        None,
        "--fail-below",
        metavar="R",
        help="With --baseline: exit 1 when a ratio's median falls below R x the saved "
        "one by more than the runs' spread (default 0.9).",
    ),
    allow_different: bool = typer.Option(
        False, "--allow-different", help="With --baseline: judge even if settings or data differ (noted)."
    ),
    model: str = typer.Option(
        None, "--model", metavar="NAME|list", help="Train a world model of this size on the batches (list: the sizes)."
    ),
    parallel: str = typer.Option(
        "ddp",
        "--parallel",
        metavar="ddp|fsdp|tp=T,cp=C",
        help="With --model: ddp or fsdp. Without: the loader's model-parallel layout over --ranks "
        "(tp=, cp=, order=; pp=, pp_data=both|split, targets=FIELD+FIELD are parsed, pp > 1 is not measured).",
    ),
    dtype: str = typer.Option(
        "bf16", "--dtype", metavar="bf16|fp32", callback=choice("--dtype", ("bf16", "fp32")), help="With --model."
    ),
    steps: int = typer.Option(5, "--steps", min=1, metavar="N", help="With --model: profiled steps per rank."),
    warmup: int = typer.Option(2, "--warmup", min=0, metavar="N", help="With --model: steps before the profiled ones."),
    clip_frames: int = typer.Option(8, "--clip-frames", min=2, metavar="N", help="With --model: frames per clip."),
    inject_delay: str = typer.Option(
        None, "--inject-delay", metavar="RANK[:data]:MS", help="With --model: slow one rank (its step or its data)."
    ),
    price_per_hour: float = typer.Option(
        None, "--price-per-hour", min=0, metavar="USD", help="With --model: per device, for the cost figures."
    ),
    timeout: float = typer.Option(120.0, "--timeout", min=1, metavar="S", help="With --model: collective timeout."),
    restart: bool = typer.Option(
        False, "--restart", help="With --model: also kill a rank (SIGKILL), restart the job and time each part."
    ),
    history: str = typer.Option(
        None, "--history", metavar="DIR", help="With --model: append this run to a history (Parquet; DIR may be a URL)."
    ),
    save: str = typer.Option(None, "--save", metavar="FILE", help="Write the JSON report to FILE."),
    html: str = typer.Option(None, "--html", metavar="FILE", help="Write a self-contained HTML page to FILE."),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Measure whether the loader keeps the accelerators fed.

    Throughput, latency, data wait and where the time goes, against baselines doing the same work,
    measured in the same interleaved rounds within one wall budget (--duration)."""
    from pathlib import Path

    from dsbuild.bench import Against, BenchInterrupted, BenchOptions, enforce, load_report, run_bench
    from dsbuild.bench.options import parse_compare, parse_resize
    from dsbuild.bench.tables import num
    from dsbuild.cli.render import json_text
    from dsbuild.core.errors import UsageError
    from dsbuild.core.files import replace_atomically
    from dsbuild.lineage.catalog import parse_ref

    o = Out(as_json, quiet)
    if ref == "history":
        from dsbuild.cli import bench_history

        return bench_history.show(o, folder, html)
    if folder is not None:
        raise UsageError(f"bench takes one catalog, not also {folder!r}", hint="bench history DIR judges a history")
    if model is not None:
        from dsbuild.cli import bench_model

        if model == "list":
            return bench_model.list_models(o)
        from dsbuild.bench.train.options import TrainOptions, parse_inject, parse_ranks

        if parallel not in ("ddp", "fsdp"):
            raise UsageError(f"--parallel with --model is ddp or fsdp, not {parallel!r}")

        train = TrainOptions(
            ref=ref,
            model=model,
            split=split,
            ranks=parse_ranks(ranks),
            parallel=parallel,
            dtype=dtype,
            batch_size=batch_size,
            clip_frames=clip_frames,
            resize=parse_resize(resize) or (64, 64),
            threads=_one(threads, "--threads"),
            steps=steps,
            rounds=rounds,
            warmup=warmup,
            seed=seed,
            inject=parse_inject(inject_delay),
            timeout_s=timeout,
            price_per_hour=price_per_hour,
            restart=restart,
        )
        return bench_model.run(o, train, save, html, history)
    from dsbuild.bench.sweep import parse_counts

    thread_counts = parse_counts(threads, "--threads")
    worker_counts = None if workers is None else parse_counts(workers, "--workers")
    if worker_counts is not None and len(thread_counts) > 1:
        raise UsageError("--workers and a list of --threads: a sweep is of one of them")
    options = BenchOptions(
        ref=ref,
        split=split,
        batch_size=batch_size,
        threads=(worker_counts or thread_counts)[0],
        workers=None if worker_counts is None else worker_counts[0],
        ranks=_world(ranks),
        step_ms=step_ms,
        decode=decode,
        decode_backend=decode_backend,
        resize=parse_resize(resize),
        verify=verify,
        device=device,
        duration=duration,
        rounds=rounds,
        compare=parse_compare(compare),
        seed=seed,
        parallel=None if parallel == "ddp" else parallel,  # (ddp: the default, every rank a data-parallel one)
    )
    if not baseline and (fail_below is not None or allow_different):  # (were ignored without a word)
        raise UsageError(
            f"{'--fail-below' if fail_below is not None else '--allow-different'} needs --baseline FILE",
            hint="save a baseline with --save FILE first, then gate against it",
        )
    files = report_files({"--save": save, "--html": html}, catalog=parse_ref(ref)[0])
    save, html = files["--save"], files["--html"]
    if len(worker_counts or thread_counts) > 1:
        if baseline:
            raise UsageError("--baseline gates one run, not a sweep", hint="give one --workers or --threads count")
        mode = "thread" if worker_counts is None else "process"
        return _sweep(o, options, mode, worker_counts or thread_counts, save, html)
    against = (
        Against(load_report(baseline), baseline, 0.9 if fail_below is None else fail_below, allow_different)
        if baseline
        else None
    )
    interrupted = None
    with Progress("bench", o) as bar:

        def progress(e) -> None:
            stage = f"round {e.round + 1}/{e.rounds}: {e.what}" if e.round is not None else f"start-up: {e.what}"
            bar.update(
                round(e.elapsed, 1),
                e.duration,
                stage=stage,
                detail=f"{num(e.rate)} {e.unit}" if e.rate is not None else "",
            )

        try:
            rep = run_bench(options, progress=progress, against=against)
        except BenchInterrupted as e:
            rep, interrupted = e.report, e
    if as_json:  # the results first: a report file that cannot be written then loses nothing
        o.json(rep.to_json())
    else:
        _render(o, rep)
    # atomically: a failed write (a full disk) leaves the previous baseline or page whole, never half of one
    if save:
        replace_atomically(Path(save), (json_text(rep.to_json()) + "\n").encode())
    if html:
        from dsbuild.bench.html import render

        replace_atomically(Path(html), render(rep).encode())
    if interrupted is not None:
        o.note(
            f"kept {rep.time.rounds_done} finished round(s) of {rep.time.rounds_planned}"
            + (f"; saved to {save}" if save else "")
        )
        raise interrupted.signal  # Ctrl-C: exit 130; SIGTERM: 143
    enforce(rep, against)
    if rep.gate is not None:
        held = [v.baseline for v in rep.gate.verdicts if not v.dropped]
        o.line(("no regression", "green"), f" against {baseline}: ours held against {', '.join(held)}")


def _one(text: str, flag: str) -> int:
    """One count of a flag that takes a list only for a sweep without --model."""
    from dsbuild.bench.sweep import parse_counts
    from dsbuild.core.errors import UsageError

    counts = parse_counts(text, flag)
    if len(counts) > 1:
        raise UsageError(f"{flag} {text}: a list is a scaling sweep of the loader, not of --model")
    return counts[0]


def _sweep(o: Out, options, mode: str, counts: list[int], save: str | None, html: str | None) -> None:
    """`--workers 1,2,4` / `--threads 1,2,4`: the scaling sweep (``dsbuild.bench.sweep``)."""
    from pathlib import Path

    from dsbuild.bench import run_bench
    from dsbuild.bench import sweep as sweeps
    from dsbuild.cli.render import json_text
    from dsbuild.core.files import replace_atomically

    with Progress("bench", o) as bar:

        def at(r: int, n: int, rounds: int) -> None:
            bar.update(r, rounds, stage=f"round {r + 1}/{rounds}: N={n} {mode} workers")

        sweep = sweeps.run_sweep(options, mode, counts, lambda opts: run_bench(opts), at)
    if o.as_json:
        o.json(sweep.to_json())
    else:
        what = "worker processes" if mode == "process" else "threads"
        o.table(
            sweeps.columns(sweep),
            sweeps.rows(sweep),
            title=f"scaling with {what}, baselines at the same N; medians over rounds",
        )
        for p in sweep.points:
            for note in p.notes:
                o.line(("note ", "yellow"), f"N={p.n}: {note}")
    if save:
        replace_atomically(Path(save), (json_text(sweep.to_json()) + "\n").encode())
    if html:
        replace_atomically(Path(html), sweeps.html(sweep).encode())
    if sweep.interrupted:
        raise KeyboardInterrupt


def register(app: typer.Typer) -> None:
    app.command("bench", epilog=EXAMPLES)(bench)
