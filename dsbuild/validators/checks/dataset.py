"""Dataset-level checks: coverage, duplicates, near-duplicates and action balance.

Coverage and duplicates read only the index (no sample bytes); near-duplicates use the perceptual hashes
the content pass computed; action balance uses the per-control usage the sample pass counted.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable

import numpy as np

from dsbuild.core.records import JsonValue
from dsbuild.formats.streams import StreamReport
from dsbuild.lineage.index import IndexRow
from dsbuild.validators.base import Check, Judge, Threshold
from dsbuild.validators.facts import VersionFacts
from dsbuild.validators.model import Bar, CheckResult, Distribution, Table
from dsbuild.validators.view import SampleView

HASH_BITS = 256


def seconds(r: IndexRow) -> float:
    """A sample's window length; 0 for a row without a usable window."""
    return max(0.0, r.t_end - r.t_start) if r.t_start is not None and r.t_end is not None else 0.0


def hours_by(rows: Iterable[IndexRow], value: Callable[[IndexRow], Iterable[str]]) -> dict[str, tuple[int, float]]:
    """{value: (samples, hours)} with values = value(row), sorted by value. Hours are summed as seconds and
    not rounded: a title of exactly the minimum (8 s = 0.0022222 h) rounded to 0.002222 h failed it."""
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for r in rows:
        for v in value(r):
            out[v][0] += 1
            out[v][1] += seconds(r)
    return {k: (n, s / 3600) for k, (n, s) in sorted(out.items())}


def fps_label(fps: float | None) -> str:
    return "unknown" if fps is None else f"{round(fps, 3):g}"


def conditions_of(r: IndexRow) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(r.conditions)]


def _coverage_table(what: str, table: dict[str, tuple[int, float]]) -> Table:
    return Table((what, "samples", "hours"), [[k, n, round(h, 6)] for k, (n, h) in table.items()])


def _coverage(
    j: Judge,
    table: dict[str, tuple[int, float]],
    required: list[str],
    min_hours: float,
    min_samples: int,
    what: str,
    hours_key: str,
) -> CheckResult:
    offenders, breaches = [], []
    missing = [v for v in required if v not in table]
    offenders += [(v, f"required {what} has no samples") for v in missing]
    thin = sorted((v for v, (n, h) in table.items() if h < min_hours or n < min_samples), key=lambda v: table[v][1])
    offenders += [(v, f"{table[v][0]} samples, {table[v][1]:.4f} h") for v in thin]
    if missing:
        breaches.append(f"{len(missing)} required {what}(s) missing")
    if thin:
        breaches.append(f"{len(thin)} {what}(s) under the minimum")
    least = min((h for _, h in table.values()), default=0.0)
    bars = tuple(Bar(k, h) for k, (_, h) in table.items()) + tuple(Bar(v, 0.0) for v in missing)
    return j.result(
        measured=round(least, 6),
        breaches=breaches,
        message=f"{len(table)} {what}(s), least {least:.4f} h",
        offenders=offenders,
        kind=what,
        table=_coverage_table(what, table),
        distribution=Distribution(
            f"hours per {what}", "h", bars=bars, threshold=float(min_hours), threshold_key=hours_key, bad="below"
        ),
    )


def _titles(j: Judge, d: VersionFacts) -> CheckResult:
    return _coverage(
        j,
        hours_by(d.rows, lambda r: [r.title]),
        j["required_titles"],
        j["min_hours_per_title"],
        j["min_samples_per_title"],
        "title",
        "min_hours_per_title",
    )


def _conditions(j: Judge, d: VersionFacts) -> CheckResult:
    return _coverage(
        j,
        hours_by(d.rows, conditions_of),
        j["required_conditions"],
        j["min_hours_per_condition"],
        0,
        "condition",
        "min_hours_per_condition",
    )


def _allowed(j: Judge, key: str, table: dict[str, tuple[int, float]], match, what: str) -> CheckResult:
    allowed = j[key]
    bad = [v for v in table if allowed and not any(match(v, a) for a in allowed)]
    return j.result(
        measured=len(table),
        breaches=[f"{len(bad)} {what}(s) not in {key}"] if bad else [],
        message=f"{len(table)} {what}(s): " + ", ".join(f"{v} ({n})" for v, (n, _) in table.items()),
        offenders=[(v, f"{table[v][0]} samples not allowed") for v in bad],
        kind=what,
        table=_coverage_table(what, table),
        distribution=Distribution(f"samples per {what}", bars=tuple(Bar(k, n) for k, (n, _) in table.items())),
    )


def _resolutions(j: Judge, d: VersionFacts) -> CheckResult:
    table = hours_by(d.rows, lambda r: [f"{r.width}x{r.height}"])
    return _allowed(j, "allowed_resolutions", table, lambda v, a: v == a.strip(), "resolution")


def _fps_match(v: str, a: str) -> bool:
    return v != "unknown" and abs(float(v) - float(a)) < 1e-3


def _frame_rates(j: Judge, d: VersionFacts) -> CheckResult:
    return _allowed(j, "allowed_fps", hours_by(d.rows, lambda r: [fps_label(r.fps)]), _fps_match, "frame rate")


def _duplicates(j: Judge, d: VersionFacts) -> CheckResult:
    """Same sample hash, or the same window of the same source video: the later key is redundant."""
    first: dict[tuple, str] = {}
    offenders = []
    for r in sorted(d.rows, key=lambda r: r.key):
        ids: list[tuple] = [("sha256", r.sha256)]  # a sample hash, and a source window when known
        if r.source_video_sha256:
            ids.append(("window", r.source_video_sha256, r.t_start, r.t_end))
        twin = next((first[i] for i in ids if i in first), None)
        if twin is not None and twin != r.key:
            how = "same sample hash" if ("sha256", r.sha256) in first else "same window of the same source video"
            offenders.append((r.key, f"duplicate of {twin} ({how})"))
        for i in ids:
            first.setdefault(i, r.key)
    return j.fraction("max_duplicate_fraction", offenders, len(d.rows), "samples duplicate another")


def near_duplicate_pairs(keys: list[str], hashes: np.ndarray, max_bits: int) -> dict[str, tuple[int, str]]:
    """key -> (distance, nearest other key) for every clip within ``max_bits`` of another.

    Band search: split the 256 bits into max_bits + 1 bands; two hashes within max_bits differ in at most
    max_bits bands, so they agree exactly on at least one (pigeonhole) and meet in that band's bucket.
    """
    if len(keys) < 2:
        return {}
    hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
    bits = np.unpackbits(hashes.astype(">u8").view(np.uint8).reshape(len(keys), -1), axis=1)
    edges = np.linspace(0, HASH_BITS, max_bits + 2).astype(int)
    best: dict[int, tuple[int, int]] = {}
    for lo, hi in zip(edges[:-1], edges[1:]):
        buckets: dict[bytes, list[int]] = defaultdict(list)
        for i, b in enumerate(np.packbits(bits[:, lo:hi], axis=1)):
            buckets[b.tobytes()].append(i)
        for members in buckets.values():
            if len(members) < 2:
                continue
            idx = np.asarray(members)
            for start in range(0, len(idx), 64):  # bounded memory for huge buckets (e.g. many black clips)
                part = idx[start : start + 64]
                dist = np.bitwise_count(hashes[part][:, None, :] ^ hashes[idx][None, :, :]).sum(axis=2)
                dist[part[:, None] == idx[None, :]] = HASH_BITS + 1
                for a, row in zip(part.tolist(), dist):
                    k = int(np.argmin(row))
                    if row[k] <= max_bits and (a not in best or row[k] < best[a][0]):
                        best[a] = (int(row[k]), int(idx[k]))
    return {keys[a]: (dist, keys[b]) for a, (dist, b) in sorted(best.items())}


def _hash_clip(v: SampleView) -> list[str]:
    """Per sample: decode the clip (once, shared with the content checks) so its perceptual hash exists
    even when every content check is turned off."""
    v.findings()
    return []


def _near_duplicates(j: Judge, d: VersionFacts) -> CheckResult:
    hashed = [(k, m.phash) for k, m in d.clips() if m.phash]
    keys = [k for k, _ in hashed]
    hashes = np.array([h for _, h in hashed], dtype=np.uint64).reshape(len(hashed), 4)
    found = near_duplicate_pairs(keys, hashes, j["near_duplicate_bits"])
    offenders = [(k, f"{dist} bits from {other}") for k, (dist, other) in sorted(found.items(), key=lambda x: x[1][0])]
    return j.fraction(
        "max_near_duplicate_fraction", offenders, len(d.clips()), f"clips have a near-duplicate ({len(hashed)} hashed)"
    )


def action_usage(d: VersionFacts) -> dict[str, float]:
    """control -> share of its frames on which it is active, over every sample that has it."""
    active: dict[str, int] = defaultdict(int)
    frames: dict[str, int] = defaultdict(int)
    for s in d.samples:
        if s.usage is not None:
            for c, a in zip(s.usage.controls, s.usage.active):
                active[c] += a
                frames[c] += s.usage.frames
    return {c: round(active[c] / frames[c], 6) if frames[c] else 0.0 for c in sorted(frames)}


def _action_balance(j: Judge, d: VersionFacts) -> CheckResult:
    usage = action_usage(d)
    if not usage:
        return j.result(measured=None, breaches=[], message="no action arrays to measure")
    low = sorted((c for c, u in usage.items() if u < j["min_action_usage"]), key=usage.__getitem__)
    lo, hi = min(usage.values()), max(usage.values())
    imbalance = hi / lo if lo > 0 else None
    breaches = []
    if low:
        breaches.append(f"{len(low)} control(s) under min_action_usage = {j['min_action_usage']}")
    ratio = f"{imbalance:.1f}" if imbalance is not None else "unbounded"  # a control never used: hi / 0
    if hi > 0 and (imbalance is None or imbalance > j["max_action_imbalance"]):
        breaches.append(f"imbalance {ratio} > max_action_imbalance = {j['max_action_imbalance']}")
    return j.result(
        measured=lo,
        breaches=breaches,
        message=f"{len(usage)} controls, usage {lo:.4f}..{hi:.4f}, imbalance {ratio}",
        offenders=[(c, f"active on {usage[c]:.4%} of frames") for c in low],
        kind="control",
        distribution=Distribution(
            "share of frames on which each control is active",
            bars=tuple(Bar(c, u) for c, u in usage.items()),
            threshold=float(j["min_action_usage"]),
            threshold_key="min_action_usage",
            bad="below",
        ),
    )


def _quarantine(j: Judge, d: VersionFacts) -> CheckResult:
    """Sessions convert left out: a gate that passes a version says what it does not hold."""
    return j.count([(q.session, f"{q.path}: {q.reason}") for q in d.manifest.quarantined], kind="session")


def _dropped_lines(j: Judge, d: VersionFacts) -> CheckResult:
    """The share of each session's stream lines that convert dropped (malformed, wrong field, out of range):
    a stream over the limit is an offender, the counts per stream are in the message and the table."""
    limit = j["max_dropped_fraction"]
    totals: dict[str, list[int]] = {}
    offenders = []
    for rec in d.sessions:
        for kind, (lines, dropped, examples) in StreamReport.recorded_drops(rec.repairs).items():
            total = totals.setdefault(kind, [0, 0])
            total[0] += lines
            total[1] += dropped
            if lines and dropped / lines > limit:
                first = f"; first: {examples[0]}" if examples else ""
                offenders.append((dropped / lines, f"{rec.session_id}/{kind}", f"{dropped} of {lines} lines{first}"))
    offenders.sort(key=lambda o: (-o[0], o[1]))
    counts = ", ".join(f"{k} {dropped} of {lines}" for k, (lines, dropped) in sorted(totals.items()))
    return j.result(
        measured=round(offenders[0][0], 6) if offenders else 0.0,
        breaches=[f"{len(offenders)} session stream(s) over max_dropped_fraction = {limit}"] if offenders else [],
        message=f"lines dropped by convert: {counts or 'no streams'}",
        offenders=[(item, f"{frac:.1%}: {detail}") for frac, item, detail in offenders],
        kind="stream",
        table=Table(
            ("stream", "lines", "dropped", "fraction"),
            JsonValue([[k, n, x, round(x / n, 6) if n else 0.0] for k, (n, x) in sorted(totals.items())]),
        ),
    )


CHECKS = (
    Check(
        "quarantine",
        "dataset",
        "Sessions convert quarantined (left out of the version, each with the file and "
        "the reason): data left out is reported, never silent.",
        (Threshold("max_quarantined_sessions", 0, "count", "every session of the captures made it in"),),
        severity="warn",
        counts="session(s) quarantined by convert",
        run=_quarantine,
    ),
    Check(
        "dropped_lines",
        "dataset",
        "Stream lines convert dropped (malformed, a wrong field, a value out of range), per session and "
        "stream: a version built from mostly-dropped actions trains on no actions.",
        (
            Threshold(
                "max_dropped_fraction",
                0.01,
                "fraction",
                "convert warns above 1% too: a crash loses a line, a wrong logger loses them all",
            ),
        ),
        run=_dropped_lines,
    ),
    Check(
        "titles",
        "dataset",
        "Samples and hours per title; every required title is present and every title has enough data.",
        (
            Threshold("min_hours_per_title", 0.0, "number", "no minimum unless the project sets one"),
            Threshold("min_samples_per_title", 1, "count", "a title that is listed must have data"),
            Threshold("required_titles", [], "strings", "titles the model must see; none by default"),
        ),
        run=_titles,
    ),
    Check(
        "conditions",
        "dataset",
        "Hours per condition value (key=value); required values are present and every value has enough data.",
        (
            Threshold("min_hours_per_condition", 0.0, "number", "no minimum unless the project sets one"),
            Threshold("required_conditions", [], "strings", "key=value pairs, e.g. weather=rain"),
        ),
        run=_conditions,
    ),
    Check(
        "resolutions",
        "dataset",
        "Samples and hours per resolution; only allowed ones (empty = any).",
        (Threshold("allowed_resolutions", [], "strings", "WxH, e.g. 1280x720; any by default"),),
        run=_resolutions,
    ),
    Check(
        "frame_rates",
        "dataset",
        "Samples and hours per frame rate (the stream's nominal rate, as its "
        "container declares it); only allowed ones (empty = any).",
        (Threshold("allowed_fps", [], "strings", 'e.g. "30", "59.94"; any by default'),),
        run=_frame_rates,
    ),
    Check(
        "duplicates",
        "dataset",
        "Samples with the same sample hash, or the same window of the same source "
        "video (a capture converted twice under two session ids).",
        (Threshold("max_duplicate_fraction", 0.001, "fraction", "one in a thousand is noise; more skews training"),),
        run=_duplicates,
    ),
    Check(
        "near_duplicates",
        "dataset",
        "Clips whose perceptual hash (dHash of 4 sampled frames, 256 bits) is "
        "within near_duplicate_bits of another clip's.",
        (
            Threshold(
                "max_near_duplicate_fraction", 0.05, "fraction", "menus and replays look alike; report, don't block"
            ),
            Threshold(
                "near_duplicate_bits", 12, "count", "of 256; re-encodes differ by <8, different clips by ~100", (0, 64)
            ),
        ),  # past a quarter of the bits, unrelated clips match
        severity="warn",
        level="full",
        sample=_hash_clip,
        run=_near_duplicates,
    ),
    Check(
        "action_balance",
        "dataset",
        "Share of frames on which each control is active (|value| >= 0.5); a "
        "control no one uses, or one dwarfing another, is reported.",
        (
            Threshold(
                "min_action_usage", 0.001, "fraction", "a control active on under 0.1% of frames is barely learnable"
            ),
            Threshold("max_action_imbalance", 1000.0, "number", "most-used / least-used control share", (1, math.inf)),
        ),  # a ratio of the most used to the least: never below 1
        severity="warn",
        run=_action_balance,
    ),
)
