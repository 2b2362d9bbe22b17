"""Inline SVG charts drawn by hand (no JavaScript, no fonts or files from the network)."""

from __future__ import annotations

from html import escape

import numpy as np

BAR = "#4c78a8"
MAX_BARS = 30  # beyond this a chart stops being readable; the rest are summed into one line


def _num(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}".rstrip("0").rstrip(".")
    return f"{v:.3g}"


def bar_chart(title: str, items: list[tuple[str, float]], unit: str = "", width: int = 520) -> str:
    """Horizontal bars, one per (label, value), largest first when there are too many to show."""
    items = [(str(k), float(v)) for k, v in items]
    if len(items) > MAX_BARS:
        items = sorted(items, key=lambda x: -x[1])
        rest = items[MAX_BARS - 1:]
        items = items[:MAX_BARS - 1] + [(f"{len(rest)} more", sum(v for _, v in rest))]
    label_w, row, top = 170, 20, 26
    height = top + row * max(1, len(items)) + 8
    plot_w = width - label_w - 70
    vmax = max((v for _, v in items), default=0) or 1
    parts = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="{escape(title)}">',
             f'<text x="4" y="16" class="ct">{escape(title)}</text>']
    if not items:
        parts.append(f'<text x="{label_w}" y="{top + 14}" class="cl">no data</text>')
    for i, (label, v) in enumerate(items):
        y = top + i * row
        w = max(0.0, v / vmax * plot_w)
        short = label if len(label) <= 26 else label[:25] + "…"
        parts.append(f'<text x="{label_w - 6}" y="{y + 14}" class="cl" text-anchor="end">{escape(short)}'
                     f'<title>{escape(label)}</title></text>')
        parts.append(f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" fill="{BAR}"/>')
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 14}" class="cv">{escape(_num(v))}{escape(unit)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def histogram(title: str, values: list[float], unit: str = "", bins: int = 12, width: int = 520) -> str:
    """Vertical bars of a numeric distribution with the bin edges underneath."""
    height, left, bottom, top = 190, 40, 34, 26
    parts = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="{escape(title)}">', f'<text x="4" y="16" class="ct">{escape(title)}</text>']
    if not values:
        parts.append(f'<text x="{left}" y="{top + 30}" class="cl">no data</text></svg>')
        return "".join(parts)
    a = np.asarray(values, dtype=np.float64)
    lo, hi = float(a.min()), float(a.max())
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    counts, edges = np.histogram(a, bins=bins, range=(lo, hi))
    plot_w, plot_h = width - left - 10, height - top - bottom
    bw = plot_w / len(counts)
    cmax = int(counts.max()) or 1
    parts.append(f'<text x="{left - 4}" y="{top + 10}" class="cv" text-anchor="end">{cmax}</text>')
    parts.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#888"/>')
    for i, c in enumerate(counts):
        h = c / cmax * plot_h
        x = left + i * bw
        parts.append(f'<rect x="{x + 1:.1f}" y="{top + plot_h - h:.1f}" width="{max(bw - 2, 1):.1f}" '
                     f'height="{h:.1f}" fill="{BAR}"><title>{_num(edges[i])}–{_num(edges[i + 1])}{escape(unit)}: '
                     f'{int(c)}</title></rect>')
    for i in (0, len(counts) // 2, len(counts)):
        x = left + i * bw
        parts.append(f'<text x="{x:.1f}" y="{height - 16}" class="cv" text-anchor="middle">'
                     f'{escape(_num(edges[i]))}{escape(unit)}</text>')
    parts.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 2}" class="cv" text-anchor="middle">'
                 f'{len(values)} values</text></svg>')
    return "".join(parts)
