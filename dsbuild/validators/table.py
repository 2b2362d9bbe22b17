"""The report for a terminal or a CI log: a rich table and a one-line verdict.

Everything is built from ``rich.text.Text`` pieces, never from markup strings: titles, players, keys and
spec values such as ``[/]``, ``[bold red]x`` or ``["weather=rain"]`` print literally. The table keeps to
three columns so it reads at 80 columns; a passing check takes one line, skipped checks share one row
per reason.
"""

from __future__ import annotations

from collections import defaultdict

from dsbuild.core.jsonio import clean, clip_text
from dsbuild.validators.model import CheckResult, Report
from dsbuild.validators.report import format_value

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
SHOWN = 3  # offenders per check in the table; JSON, JUnit and HTML carry up to the spec's max_offenders
ITEM_CHARS = 100  # a capture-derived item or detail is cut here in the table (the full text is in the JSON)


def _result_text(c: CheckResult, shown: int):
    from rich.text import Text

    out = Text(clean(clip_text(c.message, 300)))
    if c.status == "pass":
        return out
    limits = f" · {format_value(c.threshold, digits=4)}" if c.threshold else ""
    out.append(f"\nmeasured {format_value(c.measured, digits=4)}{limits}", style="dim")
    for o in c.offenders[:shown]:
        out.append(
            f"\n  {clean(clip_text(o.item, ITEM_CHARS))}: {clean(clip_text(o.detail, ITEM_CHARS))}",
            style="red" if c.status == "fail" else "yellow",
        )
    if c.offender_count > shown:
        out.append(f"\n  … {c.offender_count - shown} more", style="dim")
    return out


def report_table(report: Report, shown: int = SHOWN):
    """A rich renderable of every check: status, message, measured value and thresholds, worst offenders."""
    from rich.table import Table
    from rich.text import Text

    title = Text(f"dsbuild validate {report.version_id} · level {report.level}")
    if report.split:
        title.append(f" · split {report.split}")
    table = Table(title=title, show_lines=False, expand=False)
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("result", overflow="fold")
    skipped: dict[str, list[str]] = defaultdict(list)
    for c in report.checks:
        if c.status == "skip":
            skipped[c.message].append(c.name)
            continue
        table.add_row(Text(c.name), Text(c.status.upper(), style=STYLE[c.status]), _result_text(c, shown))
    for why, names in skipped.items():
        table.add_row(
            Text(f"{len(names)} checks" if len(names) > 1 else names[0]),
            Text("SKIP", style=STYLE["skip"]),
            Text(clean(f"{why}: {', '.join(names)}"), style="dim"),
        )
    return table


def verdict_line(report: Report) -> str:
    """One plain line (no markup) for a log: the verdict, counts, failed checks, size and time."""
    n = report.counts()
    failed = [c.name for c in report.checks if c.failed]
    s = report.summary
    return (
        f"{report.verdict.upper()} {report.version_id[:12]} (level {report.level}): "
        f"{n['fail']} fail{' (' + ', '.join(failed) + ')' if failed else ''}, {n['warn']} warn, "
        f"{n['pass']} pass, {n['skip']} skipped · {s.samples} samples, {s.hours:.3f} h · "
        f"{s.seconds.get('total', 0):.2f} s"
    )
