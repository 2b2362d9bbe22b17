"""`dsbuild validate`: the CI gate. Exit 0 accepted, 1 rejected (a check failed), 2 usage or input, 3 storage."""

from __future__ import annotations

import typer

from dsbuild.cli.params import EXECUTOR, JSON, QUIET, RAY_ADDRESS, REF, WORKERS, choice, report_files
from dsbuild.cli.render import Out, Progress, to_stderr

EXAMPLES = """\b
Examples:
  dsbuild validate catalog --split-set main --level full --acceptance sample_data/acceptance.toml \\
      --save validate.json --junit validate.xml --html validate.html
  dsbuild validate s3://datasets/cat@gold --json > validate.json
Exit: 0 accepted, 1 rejected (a fail-severity check missed its threshold), 2 bad input or spec, 3 storage.
Reports (--save/--junit/--html) are written also when the version is rejected."""
SHOWN = 3  # offenders per check in piped output; --save/--json/--html/--junit carry up to max_offenders


def _write(path: str, data: bytes, what: str) -> None:
    """Replace the file at ``path`` with ``data`` atomically; an OSError is a StorageError naming the file
    (exit 3)."""
    from pathlib import Path

    from dsbuild.core.errors import StorageError
    from dsbuild.core.files import replace_atomically

    try:
        replace_atomically(Path(path), data)
    except OSError as e:
        raise StorageError(
            f"{path}: cannot write the {what} ({e.strerror or e})", hint="check the folder and its permissions"
        ) from None


def _render(o: Out, report) -> None:
    from dsbuild.validators import report_table, verdict_line
    from dsbuild.validators.report import format_value

    if report.spec_source == "defaults":
        o.line(
            "acceptance spec: built-in defaults (--acceptance FILE changes them; sample_data/acceptance.toml "
            "lists every key)"
        )
    if o.console is not None:
        o.console.print(report_table(report))
    else:
        o.table(
            ["check", "status", "message", "measured", "threshold", "worst offenders"],
            [
                (
                    c.name,
                    c.status.upper(),
                    c.message,
                    "-" if c.status == "skip" else format_value(c.measured),
                    format_value(c.threshold),
                    " | ".join(f"{x.item}: {x.detail}" for x in c.offenders[:SHOWN])
                    + (f" | … {c.offender_count - SHOWN} more" if c.offender_count > SHOWN else ""),
                )
                for c in report.checks
            ],
        )
    o.line((verdict_line(report), "bold green" if report.accepted else "bold red"))


def validate(
    ref: str = REF,
    split_set: str = typer.Option(
        None, "--split-set", metavar="NAME", help="Split set of the version: adds the leakage and coverage checks."
    ),
    acceptance: str = typer.Option(
        None, "--acceptance", metavar="FILE", help="Acceptance spec (TOML); default: built-in thresholds."
    ),
    level: str = typer.Option(
        "structural",
        "--level",
        metavar="structural|full",
        callback=choice("--level", ("structural", "full")),
        help="structural: bytes, hashes, layout (no decoding); full: also decode every clip.",
    ),
    workers: int = WORKERS,
    executor: str = EXECUTOR,
    ray_address: str = RAY_ADDRESS,
    save: str = typer.Option(None, "--save", metavar="FILE", help="Write the JSON report to FILE (the table stays)."),
    junit: str = typer.Option(
        None, "--junit", metavar="FILE", help="Write JUnit XML to FILE (one testcase per check)."
    ),
    html: str = typer.Option(None, "--html", metavar="FILE", help="Write a self-contained HTML report to FILE."),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Check a version against an acceptance spec (the CI gate).

    Structure, content, coverage, duplicates and split leakage."""
    from dsbuild.core.executor import ExecutorSpec
    from dsbuild.lineage.catalog import open_catalog, parse_ref
    from dsbuild.validators import ValidateOptions, load_spec, verdict_line
    from dsbuild.validators import validate as run_validate

    o = Out(as_json, quiet)
    spec = load_spec(acceptance)  # first: a bad spec or report path is exit 2 before any work
    path, version = parse_ref(ref)
    files = report_files(
        {"--save": save, "--junit": junit, "--html": html}, inputs={"--acceptance": acceptance}, catalog=path
    )
    save_to, junit_to, html_to = files["--save"], files["--junit"], files["--html"]
    catalog = open_catalog(path)
    with Progress("validate", o) as bar:
        report = run_validate(
            catalog,
            version,
            spec,
            ValidateOptions(level=level, split=split_set),
            executor=ExecutorSpec(executor, workers, ray_address),
            progress=lambda done, total, stage: bar.update(done, total, stage=stage),
        )
    from dsbuild.validators import html_page, to_json, to_junit  # (after the pass: its workers need none)

    if as_json:  # the verdict first: a report file that cannot be written then loses nothing
        o.json(report.to_json())
        if not quiet:  # a job that sends stdout to a file still logs the verdict (docs/ci-gate.md)
            to_stderr(verdict_line(report))
    elif not quiet:
        _render(o, report)
    # Every report made first (the HTML decodes clips: the slow one), then each file replaced atomically in
    # turn: a failed write never leaves half a report where a good one was, and an interrupt leaves the
    # previous set unless it lands between two renames
    made = [
        (path, what, make())
        for path, what, make in (
            (save_to, "JSON report", lambda: to_json(report).encode()),
            (junit_to, "JUnit report", lambda: to_junit(report).encode()),
            (html_to, "HTML report", lambda: html_page(report, catalog=catalog)),
        )
        if path
    ]
    for path, what, data in made:
        _write(path, data, what)
    report.raise_if_rejected()


def register(app: typer.Typer) -> None:
    app.command("validate", epilog=EXAMPLES)(validate)
