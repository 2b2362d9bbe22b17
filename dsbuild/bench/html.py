"""The report as one self-contained HTML page: inline SVG and CSS, no scripts, fonts or network; every
text from the report (paths, names, notes) is escaped.

  1. the figures (the same tables as the command prints)
  2. throughput over time, sampled every second: one line per reader, slices placed where they ran
  3. ours against each baseline: the median per-round ratio with its q1-q3, and parity
  4. the data wait: a histogram with p50 / p90 / p99
  5. where the time goes: the consumer's and each loader thread's wall time by stage
  6. with several data-parallel ranks: their work per step, as drawn and balanced (``bench.balance``)
"""

from __future__ import annotations

from html import escape

from dsbuild.bench import svg, tables
from dsbuild.bench.measure import UNITS
from dsbuild.bench.stats import percentiles, sampled_rates

STAGE_COLOURS = {
    "wait": "#d62728",
    "h2d": "#9467bd",
    "step": "#2ca02c",
    "other": "#c7c7c7",
    "read": "#1f77b4",
    "decode": "#ff7f0e",
    "collate": "#17becf",
    "idle": "#e8e8e8",
}
NAMES = {"ours": "ours", "ours+step": "ours, training loop"}


def _table(columns, rows) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _timeline(rep) -> str:
    column = 2 if rep.options.decode == "frames" else 3
    scale = UNITS[rep.options.decode][1]
    series: dict[str, list] = {}
    for m in rep.rounds:
        points = [(p[0], p[column] * scale) for p in m.points]
        seg = sampled_rates(points, offset=m.start_s)
        if seg:
            series.setdefault(NAMES.get(m.name, m.name), []).append(seg)
    return svg.lines(series, "seconds since the rounds began", rep.unit, "throughput over time")


def _ratios(rep) -> str:
    rows = [(b.name, b.ratio.median, b.ratio.q1, b.ratio.q3) for b in rep.baselines if b.ratio is not None]
    return svg.ratio_bars(rows, "ours against each baseline")


def _waits(rep) -> str:
    marks = percentiles(list(rep.waits_ms)) or {}
    marks.pop("max", None)
    return svg.histogram(list(rep.waits_ms), marks, f"data wait {rep.waits_of} (ms)", "data wait histogram")


def _stages(rep) -> str:
    rows = []
    for phase, st in rep.stages.items():
        if st.wall > 0:
            rows.append((f"{phase}: consumer", {k: getattr(st, k) / st.wall for k in ("wait", "h2d", "step", "other")}))
        for name, w in st.workers.items():
            if w.wall > 0:
                rows.append(
                    (f"{phase}: {name}", {k: getattr(w, k) / w.wall for k in ("read", "decode", "collate", "idle")})
                )
    return svg.stacked(rows, STAGE_COLOURS, "stage decomposition")


def _rank_work(w) -> str:
    """The per-rank spread: the text report's table, and the least and busiest rank's mean work drawn."""
    from dsbuild.bench import balance

    deals = [("as drawn", w.drawn), ('balance="frames"', w.balanced)]
    return (
        f"<h2>Work per data-parallel rank</h2><p>{escape(w.unit)} per rank per step, {w.dp} ranks, the plan's "
        f"first {w.steps} steps (means); straggler cost: step time beyond an even split if a rank's time follows "
        f"its {escape(w.unit)}.</p>"
        + _table(balance.COLUMNS, balance.rows(w))
        + svg.ranges([(n, s.min, s.max) for n, s in deals if s is not None], w.unit, "work per data-parallel rank")
    )


def render(rep) -> str:
    """The page as a string."""
    ds, m = rep.dataset, rep.machine
    lines = "<br>".join(escape(x) for x in tables.headline(rep))
    packages = ", ".join(f"{k} {v}" for k, v in m.packages.items() if v)
    machine = (
        f"{m.cpu_count} CPUs ({m.cpu_model or 'unknown model'}), GPU {m.gpu or 'none'}, Python {m.python}; {packages}"
    )
    parts = [
        f"<h1>dsbuild bench</h1><p>version <code>{escape(ds.version_id)}</code> of "
        f"<code>{escape(rep.options.ref)}</code>{escape(' split ' + ds.split if ds.split else '')}, "
        f"started {escape(rep.started_at)}<br>{lines}<br>{escape(machine)}</p>"
    ]
    if rep.ours is None:
        parts.append("<p>No round finished: there are no figures.</p>")
    else:
        skipped = "".join(
            f"<li>{escape(b.name)}: skipped, {escape(b.skipped)}</li>" for b in rep.baselines if b.skipped
        )
        described = "".join(
            f"<li><b>{escape(b.name)}</b>: {escape(b.description)}"
            f"{escape(' (' + b.version + ')') if b.version else ''}</li>"
            for b in rep.baselines
            if not b.skipped
        )
        fed = tables.verdict(rep)
        if fed is not None:
            colour = "#1a7f37" if fed[0] == "fed" else "#cf222e"
            parts.append(f'<p class="verdict"><b style="color:{colour}">{fed[0]}</b>: {escape(fed[1])}</p>')
        parts += [
            f"<h2>Figures ({escape(rep.unit)})</h2>",
            _table(tables.COMPARISON, tables.comparison_rows(rep)),
            f"<ul>{described}{skipped}</ul>",
            _table(tables.OURS, tables.ours_rows(rep)),
        ]
        if rep.gate is not None:
            parts += [
                f"<h2>Gate against {escape(rep.gate.baseline_file)}</h2>",
                _table(tables.GATE, tables.gate_rows(rep.gate)),
            ]
        if rep.rank_work is not None:
            parts.append(_rank_work(rep.rank_work))
        parts += [
            "<h2>Throughput over time</h2><p>Sampled every second; each line is one reader, each segment "
            "one of its slices, placed where it ran in the interleaved rounds.</p>",
            _timeline(rep),
            "<h2>Ours against each baseline</h2><p>The median over rounds of ours / baseline, each ratio "
            "taken within one round; the whisker spans the ratios' q1-q3.</p>",
            _ratios(rep),
            f"<h2>Data wait</h2><p>Time the loop blocked on the loader, {escape(rep.waits_of)}.</p>",
            _waits(rep),
            "<h2>Where the time goes</h2><p>From the loader's own per-thread timestamps, summed over rounds: "
            "the consumer's wall time (wait, host-to-device copy, step, the rest) and each loader thread's "
            "(read, decode, collate, idle).</p>",
            _stages(rep),
        ]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dsbuild bench {escape(ds.version_id[:12])}</title>
<style>body{{font-family:sans-serif;max-width:{svg.WIDTH + 40}px;margin:2em auto;color:#222}}
table{{border-collapse:collapse;margin:0.5em 0}}td,th{{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left}}
code{{font-size:90%}}svg{{display:block;margin:0.5em 0}}</style></head><body>
{"".join(parts)}
</body></html>
"""
