"""``bench --model --html`` and ``bench history --html``: self-contained pages (inline SVG, no scripts,
every text escaped), drawn with ``dsbuild.bench.svg``."""

from __future__ import annotations

from html import escape

from dsbuild.bench import svg
from dsbuild.bench.train.decompose import PARTS, mean

COLOURS = {
    "compute": "#2ca02c",
    "exposed_comm": "#1f77b4",
    "data_wait": "#d62728",
    "h2d": "#9467bd",
    "other": "#c7c7c7",
}
STYLE = (
    f"body{{font-family:sans-serif;max-width:{svg.WIDTH + 40}px;margin:2em auto;color:#222}}"
    "table{border-collapse:collapse;margin:0.5em 0}td,th{padding:3px 10px;border-bottom:1px solid #ddd;"
    "text-align:left}svg{display:block;margin:0.5em 0}"
)


def _table(columns, rows) -> str:
    head = "".join(f"<th>{escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _page(title: str, parts: list[str]) -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>\n"
    )


def render(rep) -> str:
    m = rep.model.to_json()
    parts = [
        f"<h1>{escape(m['name'])} ({m['params'] / 1e6:.2f} M parameters), {escape(m['parallel'])}, "
        f"{escape(m['dtype'])}</h1>",
        f"<p>version <code>{escape(str(rep.dataset.version_id))}</code>, device {escape(rep.device)}, peak "
        f"{rep.peak.flops / 1e12:.3g} TFLOP/s per rank ({escape(rep.peak.source)}: {escape(rep.peak.device)})</p>",
        _table(
            ["point", "ranks", "batch/rank", "step ms", "MFU counted", "MFU 6ND", "efficiency"],
            [
                [
                    p.kind,
                    p.world,
                    p.batch_size,
                    f"{p.step_s * 1000:.1f}",
                    f"{p.mfu * 100:.2f}%",
                    f"{p.mfu_analytic * 100:.2f}%",
                    "" if p.efficiency is None else f"{p.efficiency:.2f}",
                ]
                for p in rep.points
            ],
        ),
        "<h2>Where each rank's step goes</h2><p>Mean step over the profiled window; the parts add up to it.</p>",
    ]
    rows = []
    for p in rep.points:
        for r in p.ranks:
            mp = mean(r.parts)
            rows.append(
                (
                    f"{p.kind} {p.world}x{p.batch_size} rank {r.rank} ({mp.step * 1000:.0f} ms)",
                    {k: getattr(mp, k) / mp.step if mp.step > 0 else 0.0 for k in PARTS},
                )
            )
    parts.append(svg.stacked(rows, COLOURS, "step decomposition per rank"))
    scaled = [p for p in rep.points if p.efficiency is not None]
    if scaled:
        parts += [
            "<h2>Scaling efficiency</h2>",
            svg.lines(
                {
                    kind: [[(float(p.world), p.efficiency or 0.0) for p in scaled if p.kind == kind]]
                    for kind in ("weak", "strong")
                },
                "ranks",
                "efficiency",
                "scaling efficiency",
            ),
        ]
    return _page(f"dsbuild bench --model {m['name']}", parts)


def history_page(rows: list[dict], judged) -> str:
    flagged = {(j.config, j.figure): j for j in judged if j.regressed}
    parts = ["<h1>Training benchmark history</h1>"]
    for j in judged:
        runs = [r for r in rows if r["config"] == j.config and r["figure"] == j.figure]
        series = {j.figure: [[(float(i + 1), float(r["median"])) for i, r in enumerate(runs)]]}
        if (j.config, j.figure) in flagged:
            series["regressed"] = [[(float(len(runs)), float(runs[-1]["median"]))]]
        parts += [
            f"<h2>{escape(j.description)}: {escape(j.figure)}"
            f"{' - REGRESSED' if (j.config, j.figure) in flagged else ''}</h2>",
            svg.lines(series, "run", j.figure, f"{j.description} {j.figure}"),
        ]
    return _page("dsbuild bench history", parts)
