"""A history of ``bench --model`` runs, and the rule that calls a regression.

``append(report, DIR)`` writes one Parquet file per run into DIR (a folder or an fsspec URL): one row per
figure per scaling point, with the figure's rounds (one value per profiled step), the run's settings,
the dataset version id, the device, the machine and the software versions. Files are never rewritten, so
concurrent runs append without a lock.

**The rule.** A *configuration* is everything that defines what is measured: model, layout, dtype, world
size and per-rank batch, clip shape, loader threads, split and the point's kind (the dataset version is
recorded, not part of it: a new version that slows training is what the history is for). For the latest
run of each configuration and each figure, its rounds are compared with the rounds of the trailing
``window`` runs of the same configuration (at least ``MIN_TRAILING``) by a one-sided Mann-Whitney U test
in the figure's worse direction; the run has **regressed** on that figure when p < ``alpha`` *and* its median
is worse than the trailing runs' median by more than ``min_change`` (of that median; for a part of the
step, of the trailing runs' median step, so a part near zero cannot regress by growing a few ms). The U test makes no assumption on the
shape of step times (long right tails are common); the effect floor keeps a real but tiny shift from
failing CI. Its false-alarm rate on unchanged runs is measured by ``benchmarks/bench_history_false_alarms.py``.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
import uuid
from dataclasses import dataclass

from dsbuild.core.errors import FormatError, UsageError
from dsbuild.core.records import Record

WINDOW = 5  # trailing runs compared with the latest
MIN_TRAILING = 3  # fewer trailing runs: not judged (said so)
ALPHA = 0.01
MIN_CHANGE = 0.05  # the latest median must be this much worse as well
MAX_FILE = 64 << 20  # a history file is a few kB a run
# figure -> (unit, which direction is better)
FIGURES = {
    "step_s": ("s", "lower"),
    "mfu": ("fraction", "higher"),
    "samples_per_s": ("clips/s", "higher"),
    "data_wait_s": ("s", "lower"),
    "compute_s": ("s", "lower"),
    "exposed_comm_s": ("s", "lower"),
}
PARTS = ("data_wait_s", "compute_s", "exposed_comm_s")  # parts of the step: changes in shares of the step


@dataclass(frozen=True, slots=True)
class Judgement(Record):
    config: str
    description: str
    figure: str
    run_id: str
    trailing_runs: int
    medians: tuple[float, ...]  # every run of the configuration, oldest first: the trend
    median: float
    trailing_median: float
    change: float  # worse is positive: (latest - trailing) / trailing in the worse direction
    p_value: float | None
    regressed: bool
    note: str | None


def rounds_of(point) -> dict[str, list[float]]:
    """Each figure's rounds of one point: per profiled step, the job's value (the slowest rank's step)."""
    ranks = point.ranks
    steps = [max(r.step_s[i] for r in ranks) for i in range(min(len(r.step_s) for r in ranks))]
    flops = sum(r.flops for r in ranks)
    peak = sum(r.peak.flops for r in ranks)
    clips = sum(statistics.fmean(r.samples) for r in ranks)
    out = {
        "step_s": steps,
        "mfu": [flops / s / peak for s in steps],
        "samples_per_s": [clips / s for s in steps],
    }
    for part in ("data_wait", "compute", "exposed_comm"):
        out[f"{part}_s"] = [max(getattr(r.parts[i], part) for r in ranks) for i in range(len(steps))]
    return out


def config_of(report, point) -> tuple[str, str]:
    """(id, description) of a point's configuration."""
    o = report.options
    doc = {
        "model": o.model,
        "parallel": o.parallel,
        "dtype": o.dtype,
        "split": o.split,
        "clip_frames": o.clip_frames,
        "resize": list(o.resize),
        "threads": o.threads,
        "point": point.kind,
        "world": point.world,
        "batch_size": point.batch_size,
        "device": report.peak.device,
    }
    text = json.dumps(doc, sort_keys=True)
    desc = (
        f"{o.model} {o.parallel} {o.dtype} {point.kind} {point.world}x{point.batch_size} "
        f"{o.clip_frames}x{o.resize[0]}x{o.resize[1]} on {report.peak.device}"
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16], desc


def rows(report, run_id: str, started_at: str) -> list[dict]:
    out = []
    for p in report.points:
        config, desc = config_of(report, p)
        for figure, values in rounds_of(p).items():
            out.append(
                {
                    "run_id": run_id,
                    "started_at": started_at,
                    "config": config,
                    "description": desc,
                    "model": report.options.model,
                    "params": report.model.params,
                    "figure": figure,
                    "unit": FIGURES[figure][0],
                    "better": FIGURES[figure][1],
                    "rounds": [float(v) for v in values],
                    "median": float(statistics.median(values)),
                    "version_id": report.dataset.version_id,
                    "device": report.device,
                    "machine": report.machine.cpu_model or "",
                    "software": json.dumps(report.software, sort_keys=True),
                    "settings": json.dumps(report.options.to_json(), sort_keys=True),
                }
            )
    return out


def _fs(root: str):
    if "://" in root:
        import fsspec

        fs, path = fsspec.core.url_to_fs(root)
        return fs, path
    from fsspec.implementations.local import LocalFileSystem

    return LocalFileSystem(), root


def append(report, root: str) -> str:
    """Write the run's rows as a new Parquet file in ``root``; its path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    now = time.time()
    started = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
    run_id = f"{started}-{uuid.uuid4().hex[:8]}"  # two runs in one microsecond still get two files
    table = pa.Table.from_pylist(rows(report, run_id, started))
    fs, path = _fs(root)
    fs.makedirs(path, exist_ok=True)
    target = f"{path.rstrip('/')}/run-{run_id}.parquet"
    with fs.open(target + ".tmp", "wb") as f:
        pq.write_table(table, f)
    fs.mv(target + ".tmp", target)
    return target


def read(root: str) -> list[dict]:
    """Every row of the history in ``root``, oldest run first."""
    import pyarrow.parquet as pq

    fs, path = _fs(root)
    if not fs.exists(path):
        raise UsageError(f"history {root}: no such folder", hint="write one with bench --model ... --history DIR")
    out = []
    for name in sorted(fs.glob(f"{path.rstrip('/')}/run-*.parquet")):
        if fs.size(name) > MAX_FILE:
            raise FormatError(f"history file {name}: larger than {MAX_FILE} bytes")
        with fs.open(name, "rb") as f:
            try:
                out.extend(pq.read_table(f).to_pylist())
            except Exception as e:  # pyarrow's errors for a damaged file
                raise FormatError(f"history file {name}: not a Parquet history file ({e})") from None
    for r in out:
        if r.get("figure") not in FIGURES or not isinstance(r.get("rounds"), list) or not r["rounds"]:
            raise FormatError(f"history {root}: a row of run {str(r.get('run_id'))[:40]!r} is not a figure's rounds")
    return sorted(out, key=lambda r: (r["started_at"], r["run_id"]))


def mann_whitney_greater(x: list[float], y: list[float]) -> float:
    """One-sided p-value of the Mann-Whitney U test that ``x`` tends to be larger than ``y``: exact (by the
    count of orderings) without ties and for up to 2,500 pairs, else the normal approximation with the
    tie correction and a continuity correction."""
    n, m = len(x), len(y)
    u = sum((a > b) + 0.5 * (a == b) for a in x for b in y)
    ties = len(set(x) | set(y)) < n + m
    if not ties and n * m <= 2500:
        # counts[k] = orderings of n x's among m y's with U = k (x above y k times): the standard recursion
        counts = _u_counts(n, m)
        total = sum(counts)
        return sum(counts[math.ceil(u - 1e-9) :]) / total
    ranks_all = sorted(x + y)
    groups: dict[float, int] = {}
    for v in ranks_all:
        groups[v] = groups.get(v, 0) + 1
    tie = sum(t**3 - t for t in groups.values())
    sigma = math.sqrt(n * m / 12 * ((n + m + 1) - tie / ((n + m) * (n + m - 1))))
    if sigma == 0:
        return 1.0
    z = (u - n * m / 2 - 0.5) / sigma
    return 0.5 * math.erfc(z / math.sqrt(2))


def _u_counts(n: int, m: int) -> list[int]:
    # f[i][j] = distribution of U for i x's and j y's
    f = {(0, j): [1] for j in range(m + 1)}
    for i in range(1, n + 1):
        f[(i, 0)] = [1]
        for j in range(1, m + 1):
            a, b = f[(i - 1, j)], f[(i, j - 1)]  # the largest is an x (above all j y's) or a y
            size = i * j + 1
            out = [0] * size
            for k, c in enumerate(a):
                out[k + j] += c
            for k, c in enumerate(b):
                out[k] += c
            f[(i, j)] = out
    return f[(n, m)]


def judge(
    history: list[dict], window: int = WINDOW, alpha: float = ALPHA, min_change: float = MIN_CHANGE
) -> list[Judgement]:
    """The rule of the module docstring, for the latest run of every configuration and figure."""
    series: dict[tuple[str, str], list[dict]] = {}
    for r in history:
        series.setdefault((r["config"], r["figure"]), []).append(r)
    out = []
    for (config, figure), runs in sorted(series.items()):
        latest, trailing = runs[-1], runs[:-1][-window:]
        pooled = [v for r in trailing for v in r["rounds"]]
        lower_better = FIGURES[figure][1] == "lower"
        median = statistics.median(latest["rounds"])
        trend = tuple(float(r["median"]) for r in runs)
        if len(trailing) < MIN_TRAILING:
            out.append(
                Judgement(
                    config,
                    latest["description"],
                    figure,
                    latest["run_id"],
                    len(trailing),
                    trend,
                    median,
                    median,
                    0.0,
                    None,
                    False,
                    f"{len(trailing)} trailing run(s): {MIN_TRAILING} needed",
                )
            )
            continue
        before = statistics.median(pooled)
        sign = 1 if lower_better else -1
        # a part of the step changes by a share of the step (a data wait of 2 ms that becomes 9 ms is not a
        # 350% regression); a whole figure by a share of itself
        steps = series.get((config, "step_s"), []) if figure in PARTS else []
        scale = statistics.median(v for r in steps[:-1][-window:] for v in r["rounds"]) if steps[:-1] else before
        change = sign * (median - before) / scale if scale else 0.0
        x, y = (latest["rounds"], pooled) if lower_better else ([-v for v in latest["rounds"]], [-v for v in pooled])
        p = mann_whitney_greater(x, y)
        floor = 1 / math.comb(len(x) + len(y), len(x))  # the smallest p these counts of rounds can give
        note = f"{len(x)} round(s) cannot reach p < {alpha:g}: more --steps" if floor >= alpha else None
        out.append(
            Judgement(
                config,
                latest["description"],
                figure,
                latest["run_id"],
                len(trailing),
                trend,
                median,
                before,
                change,
                p,
                p < alpha and change > min_change,
                note,
            )
        )
    return out
