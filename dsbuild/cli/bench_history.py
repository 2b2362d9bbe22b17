"""`dsbuild bench history DIR`: each configuration's trend, and the latest run judged against its trailing
runs (the rule is in ``dsbuild.bench.train.history``); exit 1 on a regression so CI can gate on it."""

from __future__ import annotations

from dsbuild.cli.render import Out


def _num(x: float) -> str:
    return f"{x:.4g}"


def show(o: Out, root: str | None, html: str | None) -> None:
    from dsbuild.bench.train import history
    from dsbuild.core.errors import CheckFailed, UsageError

    if not root:
        raise UsageError("bench history needs the history folder: dsbuild bench history DIR")
    judged = history.judge(history.read(root))
    if not judged:
        raise UsageError(f"history {root}: no runs yet", hint="write one with bench --model ... --history DIR")
    if o.as_json:
        o.json([j.to_json() for j in judged])
    else:
        o.table(
            [
                "configuration",
                "figure",
                "runs",
                "medians, oldest first",
                "trailing",
                "latest",
                "change",
                "p",
                "verdict",
            ],
            [
                [
                    j.description,
                    j.figure,
                    len(j.medians),
                    " ".join(_num(m) for m in j.medians[-8:]),
                    _num(j.trailing_median),
                    _num(j.median),
                    f"{j.change * 100:+.1f}%",
                    "" if j.p_value is None else f"{j.p_value:.2g}",
                    j.note or ("REGRESSED" if j.regressed else "ok"),
                ]
                for j in judged
            ],
            title=f"the latest run against its {history.WINDOW} trailing runs: regressed when a one-sided "
            f"Mann-Whitney U test on the rounds gives p < {history.ALPHA:g} and the median is "
            f"{history.MIN_CHANGE * 100:g}% worse or more",
        )
    if html:
        from pathlib import Path

        from dsbuild.bench.train.html import history_page
        from dsbuild.core.files import replace_atomically

        replace_atomically(Path(html), history_page(history.read(root), judged).encode())
    bad = [j for j in judged if j.regressed]
    if bad:
        raise CheckFailed(
            f"regression in {len(bad)} figure(s): "
            + "; ".join(f"{j.description}: {j.figure} {j.change * 100:+.1f}% (p={j.p_value:.2g})" for j in bad[:5])
            + ("; ..." if len(bad) > 5 else "")
        )
