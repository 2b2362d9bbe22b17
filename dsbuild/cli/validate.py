"""`dsbuild validate`: the CI gate. Exit 0 accepted, 1 rejected (a check failed), 2 usage or input error."""

from __future__ import annotations

from pathlib import Path

import typer

from dsbuild.cli.render import console, print_json

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
SHOWN = 3  # offenders per check in the terminal table; --json/--html/--junit carry up to max_offenders


def _fmt(v: object) -> str:
    from dsbuild.validators.report import format_value

    return format_value(v, digits=4, sep="\n")


def _render(report, show_defaults: bool) -> None:
    from rich.table import Table
    from rich.text import Text

    if show_defaults:
        t = report.spec["thresholds"]
        console.print("acceptance spec: built-in defaults (--acceptance FILE to change them; "
                      "sample_data/acceptance.toml lists every key)", highlight=False)
        console.print("  " + " · ".join(f"{k} = {v}" for k, v in t.items()), highlight=False, style="dim")
    table = Table(title=f"dsbuild validate {report.version_id[:12]} · level {report.level}"
                  + (f" · split {report.split}" if report.split else ""), show_lines=False)
    for col in ("check", "status", "measured", "threshold", "result / worst offenders"):
        table.add_column(col, overflow="fold")
    for c in report.checks:
        lines = Text(c.message)
        for o in c.offenders[:SHOWN]:
            lines.append(f"\n  {o.item}: {o.detail}", style="red" if c.status == "fail" else "yellow")
        if c.offender_count > SHOWN:
            lines.append(f"\n  … {c.offender_count - SHOWN} more", style="dim")
        table.add_row(c.name, Text(c.status.upper(), style=STYLE[c.status]),
                      "-" if c.status == "skip" else _fmt(c.measured), _fmt(c.threshold), lines)
    console.print(table)
    n = report.counts()
    s = report.summary
    colour = "bold green" if report.accepted else "bold red"
    console.print(Text(report.verdict.upper(), style=colour)
                  + Text(f"  {n['pass']} pass, {n['warn']} warn, {n['fail']} fail, {n['skip']} skipped · "
                         f"{s.get('samples', 0)} samples, {s.get('hours', 0):.3f} h · "
                         f"{s.get('seconds', {}).get('total', 0):.2f} s"))


def _write(path: Path, text: str, what: str) -> None:
    from dsbuild.core.errors import UsageError

    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{path}: cannot write the {what} ({e.strerror})") from None


def validate(
    ref: str = typer.Argument(..., help="Catalog folder or fsspec URL, optionally PATH@VERSION (id, unique "
                                        "prefix or tag; default: the newest version)."),
    split: str = typer.Option(None, "--split", help="Split set NAME of the version: adds the leakage and "
                                                    "coverage checks."),
    acceptance: Path = typer.Option(None, "--acceptance", help="Acceptance spec (TOML). Default: built-in "
                                                               "thresholds, printed."),
    level: str = typer.Option("structural", "--level", help="structural: bytes, hashes, layout (fast, no "
                                                            "decoding); full: also decode every clip and read "
                                                            "every array."),
    workers: int = typer.Option(0, "--workers", help="Processes for the per-sample pass (0 = one per core)."),
    executor: str = typer.Option("local", "--executor", help="local (process pool) or ray (one task per shard)."),
    ray_address: str = typer.Option(None, "--ray-address", help="Ray cluster address (default: a local Ray)."),
    as_json: bool = typer.Option(False, "--json", help="Print the full report as JSON on stdout."),
    junit: Path = typer.Option(None, "--junit", help="Write JUnit XML here (one testcase per check)."),
    html: Path = typer.Option(None, "--html", help="Write a self-contained HTML report here."),
) -> None:
    """Check a version against an acceptance spec: structure, content, coverage, duplicates, split leakage."""
    from dsbuild.core.errors import UsageError
    from dsbuild.lineage.catalog import open_catalog, parse_ref
    from dsbuild.validators import ValidateOptions, load_spec, to_junit, write_html
    from dsbuild.validators import validate as run_validate
    from dsbuild.validators.spec import LEVELS

    if level not in LEVELS:
        raise UsageError(f"--level {level!r}: use structural or full")
    if workers < 0:
        raise UsageError("--workers must be >= 0 (0 = one per core)")
    spec = load_spec(acceptance)  # first: a bad spec is exit 2 before any work
    path, version = parse_ref(ref)
    catalog = open_catalog(path)
    options = ValidateOptions(level=level, split=split, workers=workers, executor=executor, ray_address=ray_address)
    if console.is_terminal and not as_json:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        with Progress(TextColumn("validating"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=console, transient=True) as bar:
            task = bar.add_task("samples", total=None)
            report = run_validate(catalog, version, spec, options,
                                  progress=lambda done, total: bar.update(task, completed=done, total=total))
    else:
        report = run_validate(catalog, version, spec, options)
    if junit:
        _write(junit, to_junit(report), "JUnit report")
    if html:
        try:
            write_html(report, html, catalog=catalog)
        except OSError as e:
            raise UsageError(f"{html}: cannot write the HTML report ({e.strerror})") from None
    if as_json:
        print_json(report.to_json())
    else:
        _render(report, show_defaults=acceptance is None)
    if not report.accepted:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
