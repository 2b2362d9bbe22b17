"""Inline SVG charts for the HTML report: lines, bars with whiskers, ranges, a histogram and stacked bars, each
with axes and a legend. Pure functions returning markup; every text goes through ``html.escape``."""

from __future__ import annotations

import math
from html import escape

from dsbuild.bench.tables import num

WIDTH = 820
FONT = 'font-family="sans-serif" font-size="12"'
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


def _svg(height: float, body: list[str], label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(label)}" width="{WIDTH}" '
        f'height="{height:.0f}" {FONT}>' + "".join(body) + "</svg>"
    )


def legend(items: list[tuple[str, str, str]], y: float, x0: float = 60) -> tuple[list[str], float]:
    """Legend entries (label, colour, 'line' | 'box') laid out in rows from ``y``; returns (markup, height)."""
    out, x, row = [], x0, 0
    for label, colour, kind in items:
        w = 30 + 7 * len(label)
        if x + w > WIDTH - 10 and x > x0:
            x, row = x0, row + 1
        yy = y + row * 18
        mark = (
            f'<line x1="{x}" y1="{yy + 6}" x2="{x + 18}" y2="{yy + 6}" stroke="{colour}" stroke-width="3"/>'
            if kind == "line"
            else f'<rect x="{x + 3}" y="{yy}" width="12" height="12" fill="{colour}"/>'
        )
        out.append(mark + f'<text x="{x + 24}" y="{yy + 10}">{escape(label)}</text>')
        x += w
    return out, (row + 1) * 18 + 4 if items else 0


def _ticks(top: float) -> list[float]:
    """About five round tick values from 0 to ``top``."""
    if top <= 0:
        return [0.0]
    step = 10 ** math.floor(math.log10(top / 5))
    for k in (1, 2, 5, 10):
        if top / (step * k) <= 6:
            step *= k
            break
    return [i * step for i in range(int(top / step) + 1)]


class Plot:
    """A plotting area with x and y axes (linear, from 0) and labels."""

    def __init__(self, xmax: float, ymax: float, xlabel: str, ylabel: str, height: float = 260):
        self.left, self.top, self.right, self.height = 70, 12, 20, height
        self.w, self.h = WIDTH - self.left - self.right, height - 40 - self.top
        self.xmax, self.ymax = xmax or 1.0, (ymax or 1.0) * 1.08
        self.body = [
            f'<line x1="{self.left}" y1="{self.top + self.h}" x2="{self.left + self.w}" '
            f'y2="{self.top + self.h}" stroke="#333"/>',
            f'<line x1="{self.left}" y1="{self.top}" x2="{self.left}" y2="{self.top + self.h}" stroke="#333"/>',
        ]
        for v in _ticks(self.ymax):
            y = self.y(v)
            self.body.append(
                f'<line x1="{self.left}" y1="{y:.1f}" x2="{self.left + self.w}" y2="{y:.1f}" stroke="#eee"/>'
                f'<text x="{self.left - 5}" y="{y + 4:.1f}" text-anchor="end">{num(v)}</text>'
            )
        for v in _ticks(self.xmax):
            self.body.append(
                f'<text x="{self.x(v):.1f}" y="{self.top + self.h + 16}" text-anchor="middle">{num(v)}</text>'
            )
        self.body.append(
            f'<text x="{self.left + self.w / 2}" y="{self.top + self.h + 32}" text-anchor="middle">'
            f"{escape(xlabel)}</text>"
            f'<text transform="translate(14,{self.top + self.h / 2}) rotate(-90)" text-anchor="middle">'
            f"{escape(ylabel)}</text>"
        )

    def x(self, v: float) -> float:
        return self.left + v / self.xmax * self.w

    def y(self, v: float) -> float:
        return self.top + self.h - v / self.ymax * self.h

    def svg(self, entries: list[tuple[str, str, str]], label: str) -> str:
        marks, lh = legend(entries, self.height + 2)
        return _svg(self.height + lh + 4, self.body + marks, label)


def lines(series: dict[str, list[list[tuple[float, float]]]], xlabel: str, ylabel: str, label: str) -> str:
    """One colour per name; each name has segments (polylines) of (x, y) points."""
    pts = [p for segs in series.values() for seg in segs for p in seg]
    if not pts:
        return "<p>(nothing to plot: no measurement lasted a second)</p>"
    plot = Plot(max(p[0] for p in pts), max(p[1] for p in pts), xlabel, ylabel)
    entries = []
    for i, (name, segs) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        entries.append((name, colour, "line"))
        for seg in segs:
            coords = " ".join(f"{plot.x(x):.1f},{plot.y(y):.1f}" for x, y in seg)
            plot.body.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}">'
                f"<title>{escape(name)}</title></polyline>"
            )
            for x, y in seg:
                plot.body.append(f'<circle cx="{plot.x(x):.1f}" cy="{plot.y(y):.1f}" r="2.5" fill="{colour}"/>')
    return plot.svg(entries, label)


def ratio_bars(rows: list[tuple[str, float, float, float]], label: str) -> str:
    """Horizontal bars: (name, median, q1, q3) of ours / baseline, a whisker for q1-q3, a line at parity."""
    if not rows:
        return "<p>(no baseline ran)</p>"
    left, bar_h, gap = 130, 24, 12
    top = max(max(r[1:]) for r in rows)
    xmax = max(1.2, top * 1.15)
    w = WIDTH - left - 80
    x = lambda v: left + v / xmax * w  # noqa: E731
    height = len(rows) * (bar_h + gap) + 24
    body = []
    for i, (name, mid, q1, q3) in enumerate(rows):
        y = 8 + i * (bar_h + gap)
        colour = "#2ca02c" if mid >= 1 else "#d62728"
        body.append(
            f'<text x="{left - 8}" y="{y + 16}" text-anchor="end">{escape(name)}</text>'
            f'<rect x="{left}" y="{y}" width="{x(mid) - left:.1f}" height="{bar_h}" fill="{colour}" '
            f'opacity="0.8"><title>ours / {escape(name)}: {mid:.3g}</title></rect>'
            f'<line x1="{x(q1):.1f}" y1="{y + bar_h / 2}" x2="{x(q3):.1f}" y2="{y + bar_h / 2}" '
            f'stroke="#222" stroke-width="2"/>'
            f'<text x="{x(max(mid, q3)) + 6:.1f}" y="{y + 16}">{mid:.3g}x</text>'
        )
    body.append(
        f'<line x1="{x(1):.1f}" y1="2" x2="{x(1):.1f}" y2="{height - 20}" stroke="#222" '
        f'stroke-dasharray="4 3"/><text x="{x(1):.1f}" y="{height - 6}" text-anchor="middle">1x (parity)</text>'
    )
    marks, lh = legend(
        [
            ("ours faster (median >= 1)", "#2ca02c", "box"),
            ("ours slower", "#d62728", "box"),
            ("q1-q3 of per-round ratios", "#222", "line"),
        ],
        height + 4,
    )
    return _svg(height + lh + 6, body + marks, label)


def ranges(rows: list[tuple[str, float, float]], unit: str, label: str) -> str:
    """Horizontal bars from 0 to each row's (name, low, high) high, the part below low darker: the least and
    the busiest rank's work side by side, so an even deal is a bar with little light end."""
    if not rows:
        return "<p>(nothing to plot)</p>"
    left, bar_h, gap = 200, 22, 10
    xmax = max(r[2] for r in rows) * 1.15 or 1.0
    w = WIDTH - left - 20
    x = lambda v: left + v / xmax * w  # noqa: E731
    body = []
    for i, (name, low, high) in enumerate(rows):
        y = 6 + i * (bar_h + gap)
        body.append(
            f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{escape(name)}</text>'
            f'<rect x="{left}" y="{y}" width="{x(high) - left:.1f}" height="{bar_h}" fill="{PALETTE[1]}" '
            f'opacity="0.45"><title>busiest rank: {num(high)} {escape(unit)}</title></rect>'
            f'<rect x="{left}" y="{y}" width="{x(low) - left:.1f}" height="{bar_h}" fill="{PALETTE[0]}">'
            f"<title>least-loaded rank: {num(low)} {escape(unit)}</title></rect>"
            f'<text x="{x(high) + 6:.1f}" y="{y + 15}">{num(low)} - {num(high)}</text>'
        )
    height = len(rows) * (bar_h + gap) + 8
    marks, lh = legend(
        [(f"least-loaded rank ({unit})", PALETTE[0], "box"), (f"busiest rank ({unit})", PALETTE[1], "box")],
        height + 2,
        x0=left,
    )
    return _svg(height + lh + 4, body + marks, label)


def histogram(values: list[float], marks: dict[str, float], xlabel: str, label: str, bins: int = 24) -> str:
    """Counts per bin of ``values``, with vertical lines at the named ``marks`` (e.g. percentiles)."""
    if not values:
        return "<p>(no data waits were recorded)</p>"
    hi = max(values) or 1.0
    width = hi / bins
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int(v / width))] += 1
    plot = Plot(hi, max(counts), xlabel, "count")
    for i, c in enumerate(counts):
        if c:
            x0, x1 = plot.x(i * width), plot.x((i + 1) * width)
            plot.body.append(
                f'<rect x="{x0:.1f}" y="{plot.y(c):.1f}" width="{max(1.0, x1 - x0 - 1):.1f}" '
                f'height="{plot.y(0) - plot.y(c):.1f}" fill="{PALETTE[0]}"><title>{c}</title></rect>'
            )
    entries = [("count per bin", PALETTE[0], "box")]
    for i, (name, v) in enumerate(marks.items()):
        colour = PALETTE[3 + i % 5]
        plot.body.append(
            f'<line x1="{plot.x(v):.1f}" y1="{plot.top}" x2="{plot.x(v):.1f}" y2="{plot.y(0):.1f}" '
            f'stroke="{colour}" stroke-width="2" stroke-dasharray="5 3"/>'
        )
        entries.append((f"{name} {num(v)}", colour, "line"))
    return plot.svg(entries, label)


def stacked(rows: list[tuple[str, dict[str, float]]], colours: dict[str, str], label: str) -> str:
    """100% stacked horizontal bars: (row label, {part: share of the row's total})."""
    if not rows:
        return "<p>(no stage times were recorded)</p>"
    left, bar_h, gap = 220, 22, 8
    w = WIDTH - left - 20
    body = []
    for i, (name, parts) in enumerate(rows):
        y = 6 + i * (bar_h + gap)
        body.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{escape(name)}</text>')
        x = float(left)
        for part, share in parts.items():
            pw = max(0.0, min(1.0, share)) * w
            if pw <= 0:
                continue
            body.append(
                f'<rect x="{x:.1f}" y="{y}" width="{pw:.1f}" height="{bar_h}" fill="{colours[part]}">'
                f"<title>{escape(part)}: {share * 100:.1f}%</title></rect>"
            )
            if pw > 36:
                body.append(
                    f'<text x="{x + pw / 2:.1f}" y="{y + 15}" text-anchor="middle" fill="#111">'
                    f"{share * 100:.0f}%</text>"
                )
            x += pw
    height = len(rows) * (bar_h + gap) + 8
    used = list(dict.fromkeys(p for _, parts in rows for p, s in parts.items() if s > 0))
    marks, lh = legend([(p, colours[p], "box") for p in used], height + 2, x0=left)
    return _svg(height + lh + 4, body + marks, label)
