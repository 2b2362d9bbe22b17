"""Inline SVG charts drawn by hand (no JavaScript, no fonts or files from the network).

Every chart carries its legend: what a bar is, and, where a threshold applies, the dashed threshold
line and the colour of the values that break it. Labels are escaped: they are capture text.
"""

from __future__ import annotations

from html import escape

import numpy as np

OK = "#4c78a8"
BAD = "#d62728"
LINE = "#222"
MAX_BARS = 30  # beyond this a chart stops being readable; the rest are summed into one line
OFF_SCALE = 3.0  # a threshold this many times the largest bar is drawn at the chart's edge
CHAR_W = 6.5  # px per character of the 11px labels, rounded up: what a label is assumed to need
LEGEND_ROW = 16  # px of a legend line


def _num(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}".rstrip("0").rstrip(".")
    return f"{v:.3g}"


def _u(unit: str) -> str:
    return f" {unit}" if unit else ""


def _breaks(v: float, threshold: float | None, bad: str) -> bool:
    return threshold is not None and (v < threshold if bad == "below" else v > threshold)


def text_extent(x: float, text: str, anchor: str = "start") -> tuple[float, float]:
    """The horizontal span a label is assumed to take (``CHAR_W`` a character) at ``x`` with ``anchor``."""
    w = CHAR_W * len(text)
    left = {"start": x, "middle": x - w / 2, "end": x - w}[anchor]
    return left, left + w


def legend(
    x: int, y: int, what: str, threshold: float | None, threshold_key: str | None, bad: str, unit: str, width: int
) -> tuple[str, int]:
    """The legend: the bar colour, and the threshold line and failing colour when there is one, with its
    parts moved to a line of their own where they would run past ``width``. Returns the SVG and the height
    it takes below ``y`` (0 for one line)."""
    parts = [
        f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{OK}"/>',
        f'<text x="{x + 14}" y="{y}" class="cl">{escape(what)}</text>',
    ]
    if threshold is None:
        return "".join(parts), 0
    side = f"{'under' if bad == 'below' else 'over'} the threshold"
    key = f"{threshold_key or 'threshold'} = {_num(threshold)}{_u(unit)}"
    pieces = [(14 + CHAR_W * len(side) + 16, "bad"), (26 + CHAR_W * len(key), "key")]
    cx, cy = x + 24 + CHAR_W * len(what), y
    for need, piece in pieces:
        if cx + need > width - 4 and cx > x:
            cx, cy = x, cy + LEGEND_ROW
        if piece == "bad":
            parts += [
                f'<rect x="{cx:.0f}" y="{cy - 9}" width="10" height="10" fill="{BAD}"/>',
                f'<text x="{cx + 14:.0f}" y="{cy}" class="cl">{escape(side)}</text>',
            ]
        else:
            parts += [
                f'<line x1="{cx:.0f}" y1="{cy - 4}" x2="{cx + 20:.0f}" y2="{cy - 4}" stroke="{LINE}" '
                f'stroke-dasharray="4 3" stroke-width="2"/>',
                f'<text x="{cx + 26:.0f}" y="{cy}" class="cl">{escape(key)}</text>',
            ]
        cx += need
    return "".join(parts), cy - y


def _open(title: str, width: int, height: int) -> str:
    return (
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}">'
    )


def _close(parts: list[str], title: str, width: int, height: int, key: tuple[str, int]) -> str:
    """The chart (``parts[0]`` its opening tag) with its legend, grown by the legend's extra lines."""
    svg, extra = key
    return "".join([_open(title, width, height + extra), *parts[1:], svg, "</svg>"])


def bar_chart(
    title: str,
    items: list[tuple[str, float]],
    unit: str = "",
    width: int = 560,
    *,
    what: str = "value",
    threshold: float | None = None,
    threshold_key: str | None = None,
    bad: str = "below",
) -> str:
    """Horizontal bars, one per (label, value), largest first when there are too many to show; a dashed
    vertical line at ``threshold``, bars on its ``bad`` side in red."""
    items = [(str(k), float(v)) for k, v in items]
    if len(items) > MAX_BARS:
        items = sorted(items, key=lambda x: -x[1])
        rest = items[MAX_BARS - 1 :]
        items = items[: MAX_BARS - 1] + [(f"{len(rest)} more", sum(v for _, v in rest))]
    label_w, row, top = 170, 20, 26
    height = top + row * max(1, len(items)) + 30
    plot_w = width - label_w - 80
    biggest = max([v for _, v in items], default=0.0)
    # A threshold far beyond every value would squash the bars to nothing: draw it at the edge, off scale.
    off_scale = threshold is not None and biggest > 0 and threshold > OFF_SCALE * biggest
    vmax = (biggest * 1.1 if off_scale else max(biggest, threshold or 0.0)) or 1
    parts = [_open(title, width, height), f'<text x="4" y="16" class="ct">{escape(title)}</text>']
    if not items:
        parts.append(f'<text x="{label_w}" y="{top + 14}" class="cl">no data</text>')
    for i, (label, v) in enumerate(items):
        y = top + i * row
        w = max(0.0, v / vmax * plot_w)
        short = label if len(label) <= 24 else label[:23] + "…"  # fits label_w at CHAR_W a character
        colour = BAD if _breaks(v, threshold, bad) else OK
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 14}" class="cl" text-anchor="end">{escape(short)}'
            f"<title>{escape(label)}</title></text>"
        )
        parts.append(f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" fill="{colour}"/>')
        value = f"{_num(v)}{_u(unit)}"
        if text_extent(label_w + w + 4, value)[1] <= width - 2:
            parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 14}" class="cv">{escape(value)}</text>')
        else:  # a long bar leaves no room after it: the value goes inside its end
            parts.append(
                f'<text x="{label_w + w - 4:.1f}" y="{y + 14}" class="cv" text-anchor="end" '
                f'style="fill:#fff">{escape(value)}</text>'
            )
    if threshold is not None:
        x = label_w + (plot_w if off_scale else threshold / vmax * plot_w)
        parts.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + row * max(1, len(items))}" '
            f'stroke="{LINE}" stroke-dasharray="4 3" stroke-width="2"/>'
        )
        if off_scale:
            parts.append(
                f'<text x="{x - 4:.1f}" y="{top - 4}" class="cv" text-anchor="end">threshold off scale '
                f"(at {escape(_num(threshold))}{escape(_u(unit))}) →</text>"
            )
    return _close(parts, title, width, height, legend(8, height - 8, what, threshold, threshold_key, bad, unit, width))


def histogram(
    title: str,
    values: list[float],
    unit: str = "",
    bins: int = 12,
    width: int = 560,
    *,
    what: str = "samples per bin",
    threshold: float | None = None,
    threshold_key: str | None = None,
    bad: str = "below",
) -> str:
    """Vertical bars of a numeric distribution with the bin edges underneath; a dashed line at
    ``threshold`` and the bins on its ``bad`` side in red."""
    height, left, bottom, top = 210, 40, 52, 26
    parts = [_open(title, width, height), f'<text x="4" y="16" class="ct">{escape(title)}</text>']
    if not values:
        parts.append(f'<text x="{left}" y="{top + 30}" class="cl">no data</text></svg>')
        return "".join(parts)
    a = np.asarray(values, dtype=np.float64)
    lo, hi = float(a.min()), float(a.max())
    if threshold is not None:
        lo, hi = min(lo, threshold), max(hi, threshold)
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
        colour = BAD if _breaks((edges[i] + edges[i + 1]) / 2, threshold, bad) else OK
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{top + plot_h - h:.1f}" width="{max(bw - 2, 1):.1f}" '
            f'height="{h:.1f}" fill="{colour}"><title>{_num(edges[i])}–{_num(edges[i + 1])}{escape(_u(unit))}: '
            f"{int(c)}</title></rect>"
        )
    # the outer edges' labels are anchored inwards, so they stay inside the chart however long they are
    for i, anchor in ((0, "start"), (len(counts) // 2, "middle"), (len(counts), "end")):
        x = left + i * bw
        parts.append(
            f'<text x="{x:.1f}" y="{top + plot_h + 14}" class="cv" text-anchor="{anchor}">'
            f"{escape(_num(edges[i]))}{escape(_u(unit))}</text>"
        )
    if threshold is not None:
        x = left + (threshold - lo) / (hi - lo) * plot_w
        parts.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" stroke="{LINE}" '
            f'stroke-dasharray="4 3" stroke-width="2"/>'
        )
    parts.append(
        f'<text x="{left + plot_w:.1f}" y="{top + plot_h + 28}" class="cv" text-anchor="end">'
        f"{len(values)} values</text>"
    )
    return _close(parts, title, width, height, legend(8, height - 8, what, threshold, threshold_key, bad, unit, width))
