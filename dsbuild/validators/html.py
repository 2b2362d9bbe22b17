"""The HTML report: one self-contained page (inline CSS, inline SVG, base64 PNG thumbnails; no scripts,
no network). It shows the verdict, the check table, distributions of the version and the offenders.
"""

from __future__ import annotations

import base64
from collections import defaultdict
from html import escape
from pathlib import Path

from dsbuild.validators.charts import bar_chart, histogram
from dsbuild.validators.model import Report
from dsbuild.validators.report import format_value

MAX_THUMBS = 24  # offender thumbnails on the page (each ~10-20 KB of base64)
SHOWN_OFFENDERS = 5  # per check in the table; the rest fold into a <details>

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px}
.verdict{display:inline-block;padding:6px 14px;border-radius:6px;font-weight:700;color:#fff;font-size:16px}
.accepted{background:#2e7d32}.rejected{background:#c62828}
.meta{color:#555;margin:6px 0 14px} code{font-size:12px}
table{border-collapse:collapse;background:#fff;width:100%} th,td{border:1px solid #ddd;padding:5px 8px;
vertical-align:top;text-align:left} th{background:#f0f0f0}
.status{font-weight:700;text-transform:uppercase;font-size:12px;padding:2px 6px;border-radius:4px;color:#fff}
.s-pass{background:#2e7d32}.s-warn{background:#ef6c00}.s-fail{background:#c62828}.s-skip{background:#9e9e9e}
.off{font-size:12px;color:#444;margin:0;padding-left:16px}
.charts{display:flex;flex-wrap:wrap;gap:16px}.chart{background:#fff;border:1px solid #ddd}
.ct{font-weight:700;font-size:13px}.cl,.cv{font-size:11px;fill:#333}
.gallery{display:flex;flex-wrap:wrap;gap:12px}.thumb{background:#fff;border:1px solid #ddd;padding:6px;width:170px;
font-size:11px}.thumb img{display:block;max-width:160px;image-rendering:pixelated}.nothumb{width:160px;height:90px;
background:#eee;display:flex;align-items:center;justify-content:center;color:#777}
"""


def _fmt(v: object) -> str:
    return format_value(v, dash="–")


def _check_rows(report: Report) -> str:
    rows = []
    for c in report.checks:
        items = [f"<li><code>{escape(o.item)}</code>: {escape(o.detail)}</li>" for o in c.offenders]
        offs, more = "".join(items[:SHOWN_OFFENDERS]), ""
        if len(items) > SHOWN_OFFENDERS:
            more = (f"<details><summary>{len(items) - SHOWN_OFFENDERS} more</summary>"
                    f"<ul class=off>{''.join(items[SHOWN_OFFENDERS:])}</ul></details>")
        if c.offender_count > len(c.offenders):
            more += f"<div class=off>{c.offender_count} in all</div>"
        rows.append(f'<tr id="check-{escape(c.name)}"><td><b>{escape(c.name)}</b><br>'
                    f"<small>{escape(c.stage)}</small></td>"
                    f'<td><span class="status s-{c.status}">{c.status}</span></td>'
                    f"<td>{escape(_fmt(c.measured))}</td><td>{escape(_fmt(c.threshold))}</td>"
                    f"<td>{escape(c.message)}<ul class=off>{offs}</ul>{more}</td></tr>")
    return "".join(rows)


def _per_value(report: Report, name: str) -> dict:
    try:
        return report.check(name).details.get("per_value", {})
    except KeyError:
        return {}


def _charts(report: Report) -> str:
    s = report.summary
    charts = [histogram("Clip duration", s.get("durations", []), " s")]
    for name, title in (("resolutions", "Samples per resolution"), ("frame_rates", "Samples per frame rate (fps)")):
        charts.append(bar_chart(title, [(k, v["samples"]) for k, v in _per_value(report, name).items()]))
    for name, title in (("titles", "Hours per title"), ("conditions", "Hours per condition")):
        charts.append(bar_chart(title, [(k, v["hours"]) for k, v in _per_value(report, name).items()], " h"))
    usage = s.get("action_usage", {})
    charts.append(bar_chart("Action usage (share of frames active)", [(k, 100 * v) for k, v in usage.items()], "%"))
    if s.get("motion"):
        charts.append(histogram("Motion (largest gray change between sampled frames)", s["motion"]))
    return "".join(charts)


def _gallery(report: Report, thumbs: dict[str, bytes | None]) -> str:
    checks_of: dict[str, list[str]] = defaultdict(list)
    detail: dict[str, str] = {}
    for c in report.checks:
        if c.status in ("fail", "warn"):
            for o in c.offenders:
                if o.kind == "sample":
                    checks_of[o.item].append(c.name)
                    detail.setdefault(o.item, o.detail)
    if not checks_of:
        return "<p>No sample failed or warned.</p>"
    cards = []
    for key in list(checks_of)[:MAX_THUMBS]:
        png = thumbs.get(key)
        img = (f'<img alt="{escape(key)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">' if png
               else '<div class="nothumb">no frame decodes</div>')
        cards.append(f'<div class="thumb">{img}<code>{escape(key)}</code><br><b>{escape(", ".join(checks_of[key]))}</b>'
                     f"<br>{escape(detail[key])}</div>")
    more = len(checks_of) - MAX_THUMBS
    return f'<div class="gallery">{"".join(cards)}</div>' + (f"<p>and {more} more samples</p>" if more > 0 else "")


def render_html(report: Report, thumbs: dict[str, bytes | None] | None = None) -> str:
    s = report.summary
    counts = report.counts()
    spec_rows = "".join(f"<tr><td>{escape(k)}</td><td>{escape(_fmt(v))}</td></tr>"
                        for k, v in report.spec["thresholds"].items())
    sev_rows = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in report.spec["severity"].items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>dsbuild validate: {escape(report.verdict)} {escape(report.version_id[:12])}</title>
<style>{CSS}</style></head><body>
<h1>dsbuild validate <span class="verdict {report.verdict}" id="verdict">{report.verdict.upper()}</span></h1>
<div class="meta">catalog <code>{escape(report.catalog)}</code> · version <code>{escape(report.version_id)}</code> ·
level <b>{escape(report.level)}</b> · split <b>{escape(report.split or "–")}</b> ·
spec <code>{escape(report.spec_source)}</code><br>
{s.get("samples", 0)} samples · {s.get("shards", 0)} shards · {s.get("bytes", 0):,} bytes ·
{s.get("hours", 0):.4f} hours ·
{counts["pass"]} pass, {counts["warn"]} warn, {counts["fail"]} fail, {counts["skip"]} skipped ·
{s.get("seconds", {}).get("total", 0):.2f} s</div>
<h2>Checks</h2>
<table><thead><tr><th>check</th><th>status</th><th>measured</th><th>threshold</th>
<th>result and worst offenders</th></tr></thead>
<tbody>{_check_rows(report)}</tbody></table>
<h2>Distributions</h2><div class="charts">{_charts(report)}</div>
<h2>Offenders</h2>{_gallery(report, thumbs or {})}
<h2>Acceptance spec</h2><div class="charts">
<table style="width:auto"><tr><th>threshold</th><th>value</th></tr>{spec_rows}</table>
<table style="width:auto"><tr><th>check</th><th>severity</th></tr>{sev_rows}</table></div>
</body></html>
"""


def offender_thumbnails(report: Report, catalog=None, limit: int = MAX_THUMBS) -> dict[str, bytes | None]:
    """Thumbnails of the first sample offenders of failed or warned checks, read from the catalog
    (``catalog``, or the one the report names)."""
    import pyarrow as pa

    from dsbuild.core.errors import DsbuildError
    from dsbuild.lineage.catalog import open_catalog
    from dsbuild.lineage.index import read_index
    from dsbuild.validators.png import thumbnail
    from dsbuild.validators.reading import read_samples

    keys = []
    for c in report.checks:
        if c.status in ("fail", "warn"):
            keys += [o.item for o in c.offenders if o.kind == "sample" and o.item not in keys]
    keys = keys[:limit]
    if not keys:
        return {}
    try:
        cat = catalog or open_catalog(report.catalog)
        m = cat.manifest(report.version_id)
        rows = [r for r in read_index(cat.version_dir(report.version_id) / m.index["path"]).to_pylist()
                if r["key"] in set(keys)]
    except (DsbuildError, OSError, KeyError, TypeError, pa.ArrowException):
        # the version is damaged and the report says how; the page is still written, without thumbnails
        return {}
    by_shard: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_shard[r["shard"]].append(r)
    out: dict[str, bytes | None] = {}
    for shard, srows in sorted(by_shard.items()):
        try:
            local = cat.shard_file(shard)
        except (DsbuildError, OSError):
            continue
        for row, d in read_samples(local, m.shard_format, srows):
            out[row["key"]] = thumbnail(d.video) if d.video else None
    return out


def write_html(report: Report, path: Path | str, thumbs: bool = True, catalog=None) -> Path:
    """Write the page; ``thumbs`` decodes one frame of each offending sample (from ``catalog`` if given)."""
    path = Path(path)
    path.write_text(render_html(report, offender_thumbnails(report, catalog) if thumbs else None),
                    encoding="utf-8")
    return path
