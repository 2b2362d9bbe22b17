"""The HTML report: one self-contained page (inline CSS, inline SVG, base64 JPEG strips; no scripts, no
network). It shows the verdict and the check table; for every failing or warning check the visual that
explains it (the distribution with its threshold marked, a thumbnail strip of each offending clip, the
check's table or its offenders); coverage (hours per title and condition, split x title); the version's
distributions; and the acceptance spec. Every capture-derived string is HTML-escaped.
"""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path

from dsbuild.core.files import replace_atomically
from dsbuild.validators.charts import bar_chart, histogram
from dsbuild.validators.model import CheckResult, Distribution, Report, Table
from dsbuild.validators.report import format_value
from dsbuild.validators.thumbs import STRIPS_PER_CHECK, clip_strips

SHOWN_OFFENDERS = 5  # per check in the table; the rest fold into a <details>
MAX_ROWS = 200  # rows of a check's table or offender list on the page

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px} h3{font-size:15px;margin:4px 0}
.verdict{display:inline-block;padding:6px 14px;border-radius:6px;font-weight:700;color:#fff;font-size:16px}
.accepted{background:#2e7d32}.rejected{background:#c62828}
.meta{color:#555;margin:6px 0 14px} code{font-size:12px}
table{border-collapse:collapse;background:#fff} th,td{border:1px solid #ddd;padding:5px 8px;
vertical-align:top;text-align:left} th{background:#f0f0f0} .wide{width:100%}
.status{font-weight:700;text-transform:uppercase;font-size:12px;padding:2px 6px;border-radius:4px;color:#fff}
.s-pass{background:#2e7d32}.s-warn{background:#ef6c00}.s-fail{background:#c62828}.s-skip{background:#9e9e9e}
.off{font-size:12px;color:#444;margin:0;padding-left:16px}
.legend{font-size:12px;color:#555;margin:6px 0}
.charts{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}.chart{background:#fff;border:1px solid #ddd}
.ct{font-weight:700;font-size:13px}.cl,.cv{font-size:11px;fill:#333}
.card{background:#fff;border:1px solid #ddd;border-left:6px solid #c62828;padding:10px 14px;margin:12px 0}
.card.warn{border-left-color:#ef6c00}
.strips{display:flex;flex-direction:column;gap:8px;margin:8px 0}.strip{font-size:12px}
.strip img{display:block;image-rendering:pixelated;border:1px solid #ddd}
.nothumb{width:480px;height:40px;background:#eee;display:flex;align-items:center;justify-content:center;color:#777}
"""


def _fmt(v: object) -> str:
    return format_value(v, dash="–")


def _status(status: str) -> str:
    return f'<span class="status s-{escape(status)}">{escape(status)}</span>'


def _check_rows(report: Report) -> str:
    rows = []
    for c in report.checks:
        items = [f"<li><code>{escape(o.item)}</code>: {escape(o.detail)}</li>" for o in c.offenders]
        offs, more = "".join(items[:SHOWN_OFFENDERS]), ""
        if len(items) > SHOWN_OFFENDERS:
            more = (
                f"<details><summary>{len(items) - SHOWN_OFFENDERS} more</summary>"
                f"<ul class=off>{''.join(items[SHOWN_OFFENDERS:])}</ul></details>"
            )
        if c.offender_count > len(c.offenders):
            more += f"<div class=off>{c.offender_count} in all</div>"
        link = f' · <a href="#visual-{escape(c.name)}">why</a>' if c.status in ("fail", "warn") else ""
        rows.append(
            f'<tr id="check-{escape(c.name)}"><td><b>{escape(c.name)}</b><br>'
            f"<small>{escape(c.stage)}</small></td><td>{_status(c.status)}</td>"
            f"<td>{escape(_fmt(c.measured))}</td><td>{escape(_fmt(c.threshold))}</td>"
            f"<td>{escape(c.message)}{link}<ul class=off>{offs}</ul>{more}</td></tr>"
        )
    return "".join(rows)


def chart(d: Distribution, title: str | None = None) -> str:
    """The distribution as a histogram (per-sample values) or bars (labelled), threshold marked."""
    title = title or d.label
    if d.sampled_from:
        title += f" (every {d.sampled_from / len(d.values):.1f}th of {d.sampled_from})"
    if d.bars:
        return bar_chart(
            title,
            [(b.label, b.value) for b in d.bars],
            d.unit,
            what=d.label,
            threshold=d.threshold,
            threshold_key=d.threshold_key,
            bad=d.bad,
        )
    return histogram(
        title,
        list(d.values),
        d.unit,
        what="count per bin",
        threshold=d.threshold,
        threshold_key=d.threshold_key,
        bad=d.bad,
    )


def table_html(t: Table, cls: str = "") -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in t.rows[:MAX_ROWS])
    more = f"<p>and {len(t.rows) - MAX_ROWS} more rows (see the JSON report)</p>" if len(t.rows) > MAX_ROWS else ""
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}'


def _with_strips(c: CheckResult, strips: dict[str, bytes | None]) -> list:
    return [o for o in c.offenders if o.kind == "sample" and o.item in strips][:STRIPS_PER_CHECK]


def _strips(c: CheckResult, strips: dict[str, bytes | None]) -> str:
    shown = _with_strips(c, strips)
    if not shown:
        return ""
    out = []
    for o in shown:
        picture = strips[o.item]
        img = (
            f'<img alt="frames of {escape(o.item)}" src="data:image/jpeg;base64,{base64.b64encode(picture).decode()}">'
            if picture
            else '<div class="nothumb">no frame decodes</div>'
        )
        out.append(f'<div class="strip">{img}<code>{escape(o.item)}</code>: {escape(o.detail)}</div>')
    return (
        '<div class="legend">Each strip: four frames spread from the first to the last of an offending '
        f'clip, left to right.</div><div class="strips">{"".join(out)}</div>'
    )


def _offender_table(c: CheckResult, strips: dict[str, bytes | None]) -> str:
    """The offenders that no strip shows."""
    shown = {o.item for o in _with_strips(c, strips)}
    rest = [[o.item, o.kind, o.detail] for o in c.offenders if o.item not in shown]
    return table_html(Table(("offender", "kind", "what is wrong"), rest)) if rest else ""


def _visual(c: CheckResult, strips: dict[str, bytes | None]) -> str:
    """Why a check failed or warned: its distribution, strips of its clips, and its table or offenders."""
    parts = []
    if c.distribution is not None and (c.distribution.values or c.distribution.bars):
        parts.append(f'<div class="charts">{chart(c.distribution)}</div>')
    parts.append(_strips(c, strips))
    parts.append(table_html(c.table) if c.table is not None and c.table.rows else _offender_table(c, strips))
    cls = "card warn" if c.status == "warn" else "card"
    return (
        f'<section class="{cls}" id="visual-{escape(c.name)}"><h3>{escape(c.name)} {_status(c.status)}</h3>'
        f"<p>{escape(c.message)}</p>{''.join(parts)}</section>"
    )


def _coverage(report: Report) -> str:
    parts = []
    for name, title in (
        ("titles", "Hours per title"),
        ("conditions", "Hours per condition (key=value)"),
        ("resolutions", "Samples per resolution"),
        ("frame_rates", "Samples per frame rate (fps)"),
    ):
        c = _find(report, name)
        if c is not None and c.distribution is not None:
            parts.append(chart(c.distribution, title))
    out = f'<div class="charts">{"".join(parts)}</div>'
    cov = _find(report, "split_coverage")
    if report.split and cov is not None and cov.table is not None:
        out += (
            f"<h3>Split {escape(report.split)}: samples and hours per split and title</h3>"
            '<div class="legend">One row per title of the version, one column per split; an empty cell '
            "(0) is a title that split cannot measure.</div>" + table_html(cov.table)
        )
    return out


def _distributions(report: Report) -> str:
    parts = [chart(report.summary.durations, "Clip window length")]
    for name in ("black_clips", "frozen_clips", "fps", "duration", "action_balance"):
        c = _find(report, name)
        if c is not None and c.distribution is not None and (c.distribution.values or c.distribution.bars):
            parts.append(chart(c.distribution))
    return f'<div class="charts">{"".join(parts)}</div>'


def _find(report: Report, name: str) -> CheckResult | None:
    try:
        c = report.check(name)
    except KeyError:
        return None
    return None if c.status == "skip" else c


def render_html(report: Report, strips: dict[str, bytes | None] | None = None) -> str:
    s = report.summary
    counts = report.counts()
    bad = [c for c in report.checks if c.status in ("fail", "warn")]
    visuals = "".join(_visual(c, strips or {}) for c in bad) or "<p>No check failed or warned.</p>"
    spec_rows = "".join(
        f"<tr><td>{escape(k)}</td><td>{escape(_fmt(v))}</td></tr>" for k, v in report.spec["thresholds"].items()
    )
    sev_rows = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in report.spec["severity"].items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>dsbuild validate: {escape(report.verdict)} {escape(report.version_id[:12])}</title>
<style>{CSS}</style></head><body>
<h1>dsbuild validate <span class="verdict {report.verdict}" id="verdict">{report.verdict.upper()}</span></h1>
<div class="meta">catalog <code>{escape(report.catalog)}</code> · version <code>{escape(report.version_id)}</code> ·
level <b>{escape(report.level)}</b> · split <b>{escape(report.split or "–")}</b> ·
spec <code>{escape(report.spec_source)}</code><br>
{s.samples} samples · {s.shards} shards · {s.bytes:,} bytes · {s.hours:.4f} hours ·
{counts["pass"]} pass, {counts["warn"]} warn, {counts["fail"]} fail, {counts["skip"]} skipped ·
{s.seconds.get("total", 0):.2f} s</div>
<h2>Checks</h2>
<div class="legend">{_status("pass")} within its thresholds · {_status("warn")} missed them, reported only ·
{_status("fail")} missed them: rejects the version · {_status("skip")} not run (the message says why)</div>
<table class="wide"><thead><tr><th>check</th><th>status</th><th>measured</th><th>threshold</th>
<th>result and worst offenders</th></tr></thead>
<tbody>{_check_rows(report)}</tbody></table>
<h2>Why: failing and warning checks</h2>
<div class="legend">Charts mark each threshold with a dashed line; values on its failing side are red.</div>
{visuals}
<h2>Coverage</h2>{_coverage(report)}
<h2>Distributions</h2>{_distributions(report)}
<h2>Acceptance spec</h2><div class="charts">
<table><tr><th>threshold</th><th>value</th></tr>{spec_rows}</table>
<table><tr><th>check</th><th>severity</th></tr>{sev_rows}</table></div>
</body></html>
"""


def html_page(report: Report, *, catalog=None, thumbs: bool = True) -> bytes:
    """The page; ``thumbs`` decodes strips of the offending clips (from ``catalog``, or the catalog the
    report names)."""
    return render_html(report, clip_strips(report, catalog) if thumbs else None).encode("utf-8")


def write_html(report: Report, path: Path | str, *, catalog=None, thumbs: bool = True) -> Path:
    """Write the page (``html_page``) atomically."""
    path = Path(path)
    replace_atomically(path, html_page(report, catalog=catalog, thumbs=thumbs))
    return path
