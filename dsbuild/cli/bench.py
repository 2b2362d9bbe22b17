"""`dsbuild bench`: will the input pipeline keep the accelerators fed on this dataset version?"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from dsbuild.cli.render import console, print_json
from dsbuild.core.errors import UsageError


class LiveView:
    """A rich live panel (measurement, round, current rates) on a terminal; one plain line per measurement
    otherwise (none with --json, which keeps stdout for the report)."""

    def __init__(self, enabled: bool, quiet: bool):
        self.enabled, self.quiet = enabled and console.is_terminal, quiet
        self.live = None
        self.done: list[str] = []
        self.current: dict = {}

    def __enter__(self) -> LiveView:
        if self.enabled:
            from rich.live import Live

            self.live = Live(self._render(), console=console, refresh_per_second=4, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def _render(self):
        from rich.table import Table

        t = Table(title="dsbuild bench", show_edge=False)
        for col in ("measurement", "round", "elapsed", "samples/s", "frames/s", "MB/s"):
            t.add_column(col, justify="right" if col != "measurement" else "left")
        c = self.current
        if c:
            t.add_row(c["measurement"], f"{c['round'] + 1}", f"{c.get('elapsed', 0):.1f}/{c['seconds']:.1f} s",
                      f"{c.get('samples_per_s', 0):,.1f}", f"{c.get('frames_per_s', 0):,.0f}",
                      f"{c.get('mb_per_s', 0):,.1f}")
        for line in self.done[-6:]:
            t.add_row(*line)
        return t

    def __call__(self, event: dict) -> None:
        if event.get("start"):
            if self.current.get("samples_per_s") is not None:
                c = self.current
                self.done.append((c["measurement"], f"{c['round'] + 1}", "done", f"{c['samples_per_s']:,.1f}",
                                  f"{c['frames_per_s']:,.0f}", f"{c['mb_per_s']:,.1f}"))
            self.current = {**event}
            if not self.enabled and not self.quiet:
                console.print(f"round {event['round'] + 1}/{event['rounds']}: {event['measurement']} "
                              f"({event['seconds']:.1f} s)", highlight=False)
        else:
            self.current.update(event)
        if self.live is not None:
            self.live.update(self._render())


def _load_baseline(path: Path) -> dict:
    from dsbuild.bench.report import FORMAT
    from dsbuild.core.jsonio import loads_bounded

    try:
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"--baseline {path}: cannot read ({e.strerror})") from None
    doc = loads_bounded(data, max_bytes=1 << 26, what=str(path))
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("ratios"), dict):
        raise UsageError(f"--baseline {path}: not a {FORMAT} report (write one with --save)")
    return doc


def _print_report(rep: dict) -> None:
    from rich.table import Table

    from dsbuild.bench.report import table_rows

    ds = rep["dataset"]
    console.print(f"version [bold]{rep['version_id'][:12]}[/] ({ds['samples']} samples, {ds['shards']} shards, "
                  f"{ds['shard_bytes'] / 1e6:,.1f} MB); device {rep['config']['device_resolved']}, "
                  f"{rep['config']['rounds']} rounds", highlight=False)
    t = Table(show_edge=False)
    for col in ("figure", "median", "min-max", "ours / baseline"):
        t.add_column(col)
    for row in table_rows(rep):
        t.add_row(*row)
    console.print(t)
    for phase, d in rep["decomposition"].items():
        if not d:
            continue
        c, p = d["consumer"]["fractions"], d["pipeline"]
        if "data_wait" in c:
            parts = (f"data wait {c['data_wait']:.0%} (loader wait {c['wait']:.0%}, h2d {c['h2d']:.0%}), "
                     f"step {c['step']:.0%}, other {c['other']:.0%}")
        else:
            parts = f"wait {c['wait']:.0%}, h2d {c['h2d']:.0%}, other {c['other']:.0%}"
        stages = ", ".join(f"{k} {v * 100:.0f}%" for k, v in p["fractions"].items())
        busy = f"{p['utilisation'] * 100:.0f}%" if p["utilisation"] is not None else "-"
        console.print(f"{phase}: consumer {parts}; {len(p['workers'])} worker thread(s) {busy} busy: {stages}",
                      highlight=False)
    tr = rep["training"]
    if "skipped" not in tr:
        verdict = "[green]fed[/]" if tr["fed"] else "[red]starved[/]"
        interval = rep["batch_interval_ms"]
        console.print(f"{verdict}: the accelerator waited {tr['wait_fraction']['median'] * 100:.1f}% of the time "
                      f"with a {tr['step']['ms']:g} ms step"
                      + (f"; the pipeline delivers a batch every {interval:,.0f} ms per rank" if interval else ""))


def bench(
    ref: str = typer.Argument(..., help="PATH or PATH@VERSION (a tag, id or id prefix)."),
    split: str = typer.Option(None, "--split", help="NAME/SPLIT, e.g. main/train."),
    batch_size: int = typer.Option(8, "--batch-size", help="Samples per batch."),
    workers: int = typer.Option(2, "--workers", help="Loader decode threads per rank."),
    ranks: int = typer.Option(1, "--ranks", help="Simulated data-parallel ranks (processes on this machine)."),
    step_ms: float = typer.Option(50.0, "--step-ms", help="Simulated training step in ms (0: none)."),
    decode: str = typer.Option("frames", "--decode", help="frames or bytes."),
    resize: str = typer.Option(None, "--resize", help="HxW, e.g. 128x128."),
    device: str = typer.Option("auto", "--device", help="auto, cuda or cpu."),
    duration: float = typer.Option(30.0, "--duration", help="Seconds measured in all (split over rounds)."),
    rounds: int = typer.Option(3, "--rounds", help="Interleaved rounds (figures are medians over them)."),
    compare: str = typer.Option("raw,pyav,webdataset", "--compare", help="Baselines: raw,pyav,webdataset or none."),
    seed: int = typer.Option(0, "--seed", help="The loader's seed."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip the loader's per-sample sha256."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    baseline: Path = typer.Option(None, "--baseline", help="A report saved with --save to gate against."),
    fail_below: float = typer.Option(0.9, "--fail-below", help="With --baseline: exit 1 when a ratio is below "
                                                               "this times the saved one."),
    save: Path = typer.Option(None, "--save", help="Write the JSON report to this file."),
    html: Path = typer.Option(None, "--html", help="Write a self-contained HTML page (charts) to this file."),
) -> None:
    """Will the input pipeline keep the accelerators fed? Throughput, latency, data wait and where the
    time goes, against baselines measured in the same run."""
    from dsbuild.bench import BenchOptions, run_bench
    from dsbuild.bench.options import parse_compare, parse_resize
    from dsbuild.bench.report import regressions

    options = BenchOptions(ref=ref, split=split, batch_size=batch_size, workers=workers, ranks=ranks,
                           step_ms=step_ms, decode=decode, resize=parse_resize(resize), device=device,
                           duration=duration, rounds=rounds, compare=parse_compare(compare), seed=seed,
                           verify=not no_verify)
    saved = _load_baseline(baseline) if baseline is not None else None
    with LiveView(enabled=True, quiet=as_json) as view:
        rep = run_bench(options, progress=view)
    failed = []
    if saved is not None:
        failed = regressions(rep, saved, fail_below)
        rep["gate"] = {"baseline": str(baseline), "fail_below": fail_below, "regressions": failed,
                       "baseline_version_id": saved.get("version_id")}
    if save is not None:
        save.write_text(json.dumps(rep, indent=2, sort_keys=True) + "\n")
    if html is not None:
        from dsbuild.bench.html import render

        html.write_text(render(rep))
    if as_json:
        print_json(rep)
    else:
        _print_report(rep)
    if saved is not None:
        if saved.get("version_id") != rep["version_id"]:
            console.print(f"note: the baseline measured version {str(saved.get('version_id'))[:12]}, "
                          f"this run {rep['version_id'][:12]}", highlight=False)
        for f in failed:
            now = f"{f['now']:.3f}" if f["now"] is not None else "-"
            console.print(f"[red]regression[/] {f['ratio']}: {now} (saved {f['saved']:.3f}, floor {f['floor']:.3f}): "
                          f"{f['problem']}", highlight=False)
        if failed:
            raise typer.Exit(1)
        if not as_json:
            console.print(f"[green]no regression[/] against {baseline} (floor {fail_below:g} x saved ratios)")


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
