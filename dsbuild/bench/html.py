"""A self-contained HTML page of a bench report: the figures, the step-time decomposition as stacked bars,
and throughput over time. Inline SVG and CSS only: no scripts, no fonts, no network."""

from __future__ import annotations

from html import escape

from dsbuild.bench.report import table_rows

COLOURS = {"wait": "#d62728", "data_wait": "#d62728", "h2d": "#9467bd", "step": "#2ca02c", "other": "#c7c7c7",
           "read": "#1f77b4", "decode": "#ff7f0e", "collate": "#17becf", "idle": "#e5e5e5"}
LINE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
WIDTH = 760


def _bars(rows: list[tuple[str, dict[str, float]]]) -> str:
    """Horizontal 100% stacked bars: rows of (label, {segment: fraction of wall})."""
    left, bar_w, h, gap, per_line = 210, WIDTH - 230, 22, 10, 5
    used = list(dict.fromkeys(name for _, parts in rows for name, frac in parts.items() if frac > 0))
    legend_lines = -(-len(used) // per_line)
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
            f'height="{len(rows) * (h + gap) + 20 + 18 * legend_lines}" font-family="sans-serif" font-size="12">')]
    for i, (label, parts) in enumerate(rows):
        y = i * (h + gap) + 4
        out.append(f'<text x="{left - 8}" y="{y + h * 0.7}" text-anchor="end">{escape(label)}</text>')
        x = float(left)
        for name, frac in parts.items():
            w = max(0.0, min(1.0, frac)) * bar_w
            if w <= 0:
                continue
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{h}" fill="{COLOURS.get(name, "#777")}">'
                       f'<title>{escape(name)}: {frac * 100:.1f}%</title></rect>')
            if w > 34:
                ink = "#333" if name in ("idle", "other") else "#fff"
                out.append(f'<text x="{x + w / 2:.1f}" y="{y + h * 0.7}" text-anchor="middle" fill="{ink}">'
                           f'{frac * 100:.0f}%</text>')
            x += w
    for j, name in enumerate(used):
        x, y = left + (j % per_line) * 100, len(rows) * (h + gap) + 14 + 18 * (j // per_line)
        out.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{COLOURS.get(name, "#777")}"/>'
                   f'<text x="{x + 16}" y="{y + 10}">{escape(name.replace("_", " "))}</text>')
    out.append("</svg>")
    return "".join(out)


def _decomposition_rows(rep: dict) -> list[tuple[str, dict[str, float]]]:
    rows = []
    for phase, d in rep["decomposition"].items():
        if not d:
            continue
        c = d["consumer"]
        wall = c["wall"] or 1.0
        if "data_wait" in c:  # training: data_wait already holds the loader's wait and h2d
            parts = {"data_wait": c["data_wait"] / wall, "step": c["step"] / wall, "other": max(0, c["other"]) / wall}
        else:
            parts = {"wait": c["wait"] / wall, "h2d": c["h2d"] / wall, "other": max(0, c["other"]) / wall}
        rows.append((f"{phase}: consumer", parts))
        for name, w in d["pipeline"]["workers"].items():
            ww = w["wall"] or 1.0
            parts = {s: w[s] / ww for s in ("read", "decode", "collate")}
            parts["idle"] = max(0.0, 1 - sum(parts.values()))
            rows.append((f"{phase}: {name}", parts))
    return rows


def _lines(series: list[list[list[float]]], unit: str) -> str:
    """Throughput over time: one polyline per round, shared axes."""
    pts = [p for s in series for p in s]
    if not pts:
        return "<p>(no timeline: too few batches)</p>"
    h, left, bottom, top = 260, 60, 30, 10
    tmax = max(p[0] for p in pts) or 1.0
    ymax = max(p[1] for p in pts) * 1.1 or 1.0
    plot_w, plot_h = WIDTH - left - 20, h - bottom - top

    def xy(t: float, v: float) -> str:
        return f"{left + t / tmax * plot_w:.1f},{top + plot_h - v / ymax * plot_h:.1f}"

    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{h}" font-family="sans-serif" '
            'font-size="11">'),
           f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#333"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#333"/>']
    for k in range(5):
        v = ymax * k / 4
        y = top + plot_h - plot_h * k / 4
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{v:,.3g}</text>'
                   f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#eee"/>')
        t = tmax * k / 4
        out.append(f'<text x="{left + plot_w * k / 4:.1f}" y="{h - 10}" text-anchor="middle">{t:.2g} s</text>')
    for i, s in enumerate(series):
        if s:
            colour = LINE_COLOURS[i % len(LINE_COLOURS)]
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
                       f'points="{" ".join(xy(t, v) for t, v in s)}"><title>round {i + 1}</title></polyline>')
    out.append(f'<text x="{left + 6}" y="{top + 12}">{escape(unit)}, one line per round</text></svg>')
    return "".join(out)


def render(rep: dict) -> str:
    """The page as a string."""
    rows = "".join(f"<tr><td>{escape(a)}</td><td>{escape(b)}</td><td>{escape(c)}</td><td>{escape(d)}</td></tr>"
                   for a, b, c, d in table_rows(rep))
    ds, cfg, m = rep["dataset"], rep["config"], rep["machine"]
    setup = (f"batch {cfg['batch_size']}, {cfg['workers']} workers, {cfg['ranks']} rank(s), step {cfg['step_ms']:g} ms, "
             f"decode {cfg['decode']}, resize {cfg['resize'] or 'none'}, device {cfg['device_resolved']}, "
             f"{cfg['rounds']} rounds of {cfg['slice_s']:.2f} s slices")
    machine = (f"{m['cores']} cores, {(m['memory_bytes'] or 0) / 2**30:.1f} GiB, GPU {m['gpu'] or 'none'}; "
               + ", ".join(f"{k} {v}" for k, v in rep["versions"].items() if v))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dsbuild bench {escape(rep['version_id'][:12])}</title>
<style>body{{font-family:sans-serif;max-width:{WIDTH + 40}px;margin:2em auto;color:#222}}
table{{border-collapse:collapse}}td,th{{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left}}
code{{font-size:90%}}</style></head><body>
<h1>dsbuild bench</h1>
<p>version <code>{escape(rep['version_id'])}</code> of <code>{escape(ds['ref'])}</code>
{escape(('split ' + ds['split']) if ds['split'] else '')}: {ds['samples']} samples in {ds['shards']} shards
({ds['shard_bytes'] / 1e6:,.1f} MB, {escape(ds['format'])}).</p>
<p>{escape(setup)}.<br>{escape(machine)}.<br>started {escape(rep['started_at'])}.</p>
<h2>Figures</h2>
<table><tr><th>figure</th><th>median</th><th>min&ndash;max over rounds</th><th>ours / baseline</th></tr>
{rows}</table>
<h2>Where the time goes</h2>
<p>Consumer: the training loop's wall time (waiting for data, host-to-device copy, the step, the rest).
Workers: each loader thread's wall time in read, decode, collate, or idle. From the loader's own timestamps.</p>
{_bars(_decomposition_rows(rep))}
<h2>Throughput over time</h2>
{_lines(rep['timeline'], 'samples/s')}
</body></html>
"""
