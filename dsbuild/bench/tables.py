"""The report's figures as table rows of text, shared by the command's output and the HTML page.

Each column means one thing: a median, an interquartile range (q1-q3), a min-max range, or a ratio.
"""

from __future__ import annotations

COMPARISON = ("run", "median", "q1-q3", "min-max", "ours / run (median)", "ours / run q1-q3")
OURS = ("ours", "median", "q1-q3", "min-max")


def num(x: float | None) -> str:
    """Readable without scientific notation: 12,345 / 123.4 / 1.23 / 0.0123."""
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def _mid(s, k: float = 1.0) -> str:
    return num(s.median * k) if s else "-"


def _range(s, a: str, b: str, k: float = 1.0) -> str:
    return f"{num(getattr(s, a) * k)}-{num(getattr(s, b) * k)}" if s else "-"


def comparison_rows(rep) -> list[tuple[str, ...]]:
    """Ours and every baseline that ran, in the report's unit, with the ratio ours / baseline."""
    f = rep.ours.figure
    rows: list[tuple[str, ...]] = [("ours", _mid(f), _range(f, "q1", "q3"), _range(f, "min", "max"), "-", "-")]
    for b in rep.baselines:
        if b.skipped is None:
            rows.append(
                (
                    b.name,
                    _mid(b.figure),
                    _range(b.figure, "q1", "q3"),
                    _range(b.figure, "min", "max"),
                    _mid(b.ratio),
                    _range(b.ratio, "q1", "q3"),
                )
            )
    return rows


def ours_rows(rep) -> list[tuple[str, ...]]:
    """Our loader's other figures (each a median over rounds with its ranges)."""
    us = rep.ours
    figures = [
        ("samples/s", us.samples_per_s, 1.0),
        ("frames/s", us.frames_per_s, 1.0),
        ("MB/s", us.mb_per_s, 1.0),
        ("time to first batch (s)", us.first_batch_s, 1.0),
        ("resume to first batch (s)", us.resume_s, 1.0),
        ("open the version (s)", us.open_s, 1.0),
    ]
    if rep.training:
        figures.append(("training loop waiting for data (%)", rep.training.wait_fraction, 100.0))
    return [(name, _mid(s, k), _range(s, "q1", "q3", k), _range(s, "min", "max", k)) for name, s, k in figures if s]


def gate_rows(gate) -> list[tuple[str, ...]]:
    return [
        (
            v.baseline,
            num(v.saved.median),
            num(v.now.median),
            num(v.floor),
            num(v.noise),
            "dropped" if v.dropped else "held",
        )
        for v in gate.verdicts
    ]


GATE = ("ours / baseline", "saved median", "now median", "floor", "spread", "verdict")


def headline(rep) -> list[str]:
    """The lines that say what was measured, on what, and how the budget was kept."""
    ds, opt, t = rep.dataset, rep.options, rep.time
    decoder = f", decoder: {rep.ours.decoder_note}" if rep.ours and rep.ours.decoder_note else ""
    return [
        f"{ds.samples} samples, {ds.bytes / 1e6:,.1f} MB in {ds.shards} shards ({ds.shard_format}), "
        f"{', '.join(ds.resolutions)}",
        f"{opt.decode} mode, {opt.threads} thread(s) x {opt.ranks} rank(s), batch {opt.batch_size}, resize "
        f"{'x'.join(map(str, opt.resize)) if opt.resize else 'none'}, verify {opt.verify}, device "
        f"{rep.resolved.device}{decoder}",
        f"{t.rounds_done} of {t.rounds_planned} rounds in {t.measured_s:.1f} s of a {t.duration_s:g} s budget "
        f"(+{t.startup_s:.1f} s start-up)"
        + (", interrupted" if t.interrupted else "")
        + ("; one round: its ranges are one value, no spread" if t.rounds_done == 1 else ""),
    ]


def verdict(rep) -> tuple[str, str] | None:
    """Whether the training loop was fed: ("fed" or "starved", the sentence that says by how much), or None
    for a run without a training step. The text report and the HTML page both say it."""
    tr = rep.training
    if tr is None:
        return None
    return (
        "fed" if tr.fed else "starved",
        f"with a {tr.step.ms:g} ms step ({tr.step.kind}) the loop waited {tr.wait_fraction.median * 100:.1f}% "
        f"of the time (fed below {tr.fed_below * 100:g}%)",
    )
