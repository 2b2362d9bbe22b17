"""`dsbuild bench CATALOG --model NAME`: a real training step on the version's batches, measured.

Rendering only; the run and its figures are in ``dsbuild.bench.train``."""

from __future__ import annotations

from dsbuild.cli.render import Out

PARTS = ("compute", "exposed_comm", "data_wait", "h2d", "other")


def list_models(o: Out) -> None:
    from dsbuild.bench import models

    frames, h, w, actions = models.LIST_SHAPE
    rows = [
        [s.name, f"{models.parameters(s, frames, h, w, actions) / 1e6:.2f} M", s.dim, s.depth, s.heads]
        for s in models.SIZES.values()
    ]
    if o.as_json:
        o.json([dict(zip(("name", "params", "dim", "depth", "heads"), r)) for r in rows])
        return
    o.table(
        ["model", "parameters", "width", "blocks", "heads"],
        rows,
        title=f"parameters at {frames} frames of {h}x{w} and {actions} action dims",
    )


def _ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def render(o: Out, rep) -> None:
    m = rep.model.to_json()
    o.line(
        f"version {o.id(rep.dataset.version_id)}: model {m['name']} ({m['params'] / 1e6:.2f} M parameters), "
        f"{m['parallel']}, {m['dtype']}, on {rep.device} (peak {rep.peak.flops / 1e12:.3g} TFLOP/s per rank, "
        f"{rep.peak.source}: {rep.peak.device})"
    )
    o.table(
        [
            "point",
            "ranks",
            "batch/rank",
            "step ms",
            "by round",
            "MFU counted",
            "MFU 6ND",
            "clips/s",
            "frames/s",
            "efficiency",
        ],
        [
            [
                p.kind,
                p.world,
                p.batch_size,
                _ms(p.step_s),
                "/".join(_ms(s) for s in p.round_step_s or ()),
                f"{p.mfu * 100:.2f}%",
                f"{p.mfu_analytic * 100:.2f}%",
                f"{p.samples_per_s:.2f}",
                f"{p.frames_per_s:.1f}",
                "" if p.efficiency is None else f"{p.efficiency:.2f}",
            ]
            for p in rep.points
        ],
        title=f"one interleaved run: the points take turns over {len(rep.points[0].round_step_s or (0,))} round(s); "
        "the step is the slowest rank's mean over its profiled steps; efficiency, the median of the rounds' "
        "paired ratios",
    )
    for p in rep.points:
        if p.kind == "strong":
            continue
        rows = []
        for r in p.ranks:
            parts = _mean(r)
            rows.append(
                [
                    r.rank,
                    _ms(parts.step),
                    *(_ms(getattr(parts, k)) for k in PARTS),
                    _ms(parts.comm),
                    f"{sum(r.frames) / len(r.frames):g}",
                ]
            )
        o.table(
            ["rank", "step", *PARTS, "comm (all)", "frames/step"],
            rows,
            title=f"{p.kind} point, {p.world} rank(s): mean step in ms (the parts add up to the step)",
        )
        s = p.straggler
        if s is not None:
            o.line(
                ("straggler" if s.flagged else "slowest rank", "red" if s.flagged else "green"),
                f": rank {s.rank}, {_ms(s.excess_s)} ms ({s.share * 100:.0f}% of the step) more own work than the "
                f"other ranks' median, mostly {s.component} (+{_ms(s.component_excess_s)} ms)",
            )
    v = rep.verdict
    o.line(
        ("input-bound" if v.input_bound else "fed", "red" if v.input_bound else "green"),
        f": data wait {v.data_wait_share * 100:.1f}% of the step"
        + (
            f"; a loader thread builds a batch in {_ms(v.batch_build_s)} ms: {v.workers_per_rank} thread(s) per rank "
            f"would feed it ({v.threads} ran)"
            if v.batch_build_s is not None
            else ""
        ),
    )
    if rep.cost is not None:
        c = rep.cost
        o.line(
            f"cost at ${c.price_per_hour:g}/device-hour x {c.devices}: ${c.per_1000_steps:.4g} per 1,000 steps, "
            f"${c.per_epoch:.4g} per epoch ({c.steps_per_epoch:g} steps), {c.data_wait_share * 100:.1f}% of it waiting for data"
        )
    if rep.restart is not None:
        r = rep.restart
        o.line(
            f"restart after SIGKILL of rank {r.killed_rank}: {r.total_s:.2f} s to the first step ("
            + ", ".join(f"{k} {v:.2f} s" for k, v in r.components.items())
            + ")"
        )
        o.line(
            ("exactly once" if r.exactly_once else "NOT exactly once", "green" if r.exactly_once else "red"),
            f": {r.detail}",
        )
    for n in rep.notes:
        o.line(("note ", "yellow"), n)


def _mean(r):
    from dsbuild.bench.train.decompose import mean

    return mean(r.parts)


def run(o: Out, options, save: str | None, html: str | None, history: str | None) -> None:
    from pathlib import Path

    from dsbuild.bench.train.run import run_train
    from dsbuild.cli.render import Progress, json_text
    from dsbuild.core.files import replace_atomically

    with Progress("bench", o) as bar:
        rep = run_train(options, progress=lambda what: bar.update(0, None, stage=what))
    if o.as_json:
        o.json(rep.to_json())
    else:
        render(o, rep)
    if save:
        replace_atomically(Path(save), (json_text(rep.to_json()) + "\n").encode())
    if html:
        from dsbuild.bench.train.html import render as page

        replace_atomically(Path(html), page(rep).encode())
    if history:
        from dsbuild.bench.train.history import append

        o.note(f"history: {append(rep, history)}")
