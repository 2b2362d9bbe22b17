"""`dsbuild validate`: the CI gate. Exit 0 accepted, 1 rejected (a check failed), 2 usage or input error."""

from __future__ import annotations

import typer

from dsbuild.cli.params import EXECUTOR, JSON, QUIET, RAY_ADDRESS, REF, WORKERS, choice
from dsbuild.cli.render import Out, Progress, styled

EXAMPLES = """\b
Examples:
  dsbuild validate catalog --split-set main --level full --acceptance sample_data/acceptance.toml \\
      --save validate.json --junit validate.xml --html validate.html
  dsbuild validate s3://datasets/cat@gold --json > validate.json
Exit: 0 accepted, 1 rejected (a fail-severity check missed its threshold), 2 bad input or spec, 3 storage.
Reports (--save/--junit/--html) are written also when the version is rejected."""

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
SHOWN = 3  # offenders per check on the terminal; --save/--json/--html/--junit carry up to max_offenders


def _write(path: str, write, what: str) -> None:
    """``write(path)``; an OSError is a StorageError naming the file (exit 3)."""
    from pathlib import Path

    from dsbuild.core.errors import StorageError

    try:
        write(Path(path))
    except OSError as e:
        raise StorageError(f"{path}: cannot write the {what} ({e.strerror or e})",
                           hint="check the folder and its permissions") from None


def _render(o: Out, report, show_defaults: bool) -> None:
    from dsbuild.validators.report import format_value

    if show_defaults:
        o.line("acceptance spec: built-in defaults (--acceptance FILE changes them; sample_data/acceptance.toml lists "
               "every key): " + " · ".join(f"{k} = {v}" for k, v in report.spec["thresholds"].items()))
    rows = []
    for c in report.checks:
        worst = [f"{x.item}: {x.detail}" for x in c.offenders[:SHOWN]]
        if c.offender_count > SHOWN:
            worst.append(f"… {c.offender_count - SHOWN} more")
        rows.append((c.name, styled((c.status.upper(), STYLE[c.status])),
                     "-" if c.status == "skip" else format_value(c.measured, digits=4), format_value(c.threshold, digits=4),
                     " | ".join([c.message, *worst])))
    o.table(["check", "status", "measured", "threshold", "result / worst offenders"], rows,
            title=f"dsbuild validate {o.id(report.version_id)} · level {report.level}"
                  + (f" · split set {report.split}" if report.split else ""), wide=("check", "status"))
    n, s = report.counts(), report.summary
    o.line((report.verdict.upper(), "bold green" if report.accepted else "bold red"),
           f"  {n['pass']} pass, {n['warn']} warn, {n['fail']} fail, {n['skip']} skipped · {s.get('samples', 0)} samples, "
           f"{s.get('hours', 0):.3f} h · {s.get('seconds', {}).get('total', 0):.2f} s")


def validate(
    ref: str = REF,
    split_set: str = typer.Option(None, "--split-set", metavar="NAME", help="Split set of the version: adds the leakage "
                                                                            "and coverage checks."),
    acceptance: str = typer.Option(None, "--acceptance", metavar="FILE", help="Acceptance spec (TOML); default: "
                                                                               "built-in thresholds, printed."),
    level: str = typer.Option("structural", "--level", metavar="structural|full",
                              callback=choice("--level", ("structural", "full")),
                              help="structural: bytes, hashes, layout (no decoding); full: also decode every clip."),
    workers: int = WORKERS,
    executor: str = EXECUTOR,
    ray_address: str = RAY_ADDRESS,
    save: str = typer.Option(None, "--save", metavar="FILE", help="Write the JSON report to FILE."),
    junit: str = typer.Option(None, "--junit", metavar="FILE", help="Write JUnit XML to FILE (one testcase per check)."),
    html: str = typer.Option(None, "--html", metavar="FILE", help="Write a self-contained HTML report to FILE."),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Check a version against an acceptance spec (the CI gate).

    Structure, content, coverage, duplicates and split leakage."""
    from pathlib import Path

    from dsbuild.core.errors import CheckFailed
    from dsbuild.lineage.catalog import open_catalog, parse_ref
    from dsbuild.validators import ValidateOptions, load_spec, to_json, to_junit, write_html
    from dsbuild.validators import validate as run_validate

    o = Out(as_json, quiet)
    spec = load_spec(Path(acceptance) if acceptance else None)  # first: a bad spec is exit 2 before any work
    path, version = parse_ref(ref)
    catalog = open_catalog(path)
    options = ValidateOptions(level=level, split=split_set, workers=workers, executor=executor, ray_address=ray_address)
    with Progress("validate", o) as bar:
        report = run_validate(catalog, version, spec, options,
                              progress=lambda done, total: bar.update(done, total, stage="samples"))
    if save:
        _write(save, lambda p: p.write_text(to_json(report), encoding="utf-8"), "JSON report")
    if junit:
        _write(junit, lambda p: p.write_text(to_junit(report), encoding="utf-8"), "JUnit report")
    if html:
        _write(html, lambda p: write_html(report, p, catalog=catalog), "HTML report")
    if as_json:
        o.json(report.to_json())
    else:
        _render(o, report, show_defaults=acceptance is None)
    if not report.accepted:
        failed = [c.name for c in report.checks if c.status == "fail"]
        raise CheckFailed(f"version {report.version_id[:12]} rejected: {len(failed)} check(s) failed "
                          f"({', '.join(failed)})")


def register(app: typer.Typer) -> None:
    app.command("validate", epilog=EXAMPLES)(validate)
