"""Dataset-level checks: coverage, duplicates, near-duplicates and action balance.

Coverage and duplicates read only the index (no sample bytes); near-duplicates use the perceptual hashes
the content pass computed; action balance uses the per-control usage the sample pass counted.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np

from dsbuild.validators.checks.common import judge
from dsbuild.validators.model import CheckResult
from dsbuild.validators.spec import AcceptanceSpec

HASH_BITS = 256


def hours_by(rows: list[dict], value) -> dict[str, dict]:
    """{value: {"samples", "hours"}} with value = value(row), sorted by value."""
    out: dict[str, dict] = defaultdict(lambda: {"samples": 0, "hours": 0.0})
    for r in rows:
        for v in value(r):
            out[v]["samples"] += 1
            out[v]["hours"] += max(0.0, (r["t_end"] or 0.0) - (r["t_start"] or 0.0)) / 3600  # nulls: 0 h
    return {k: {"samples": v["samples"], "hours": round(v["hours"], 6)} for k, v in sorted(out.items())}


def fps_label(fps: float | None) -> str:
    return "unknown" if fps is None else f"{round(fps, 3):g}"


def conditions_of(row: dict) -> list[str]:
    try:
        doc = json.loads(row["conditions"] or "{}")
    except ValueError:
        return []
    return [f"{k}={v}" for k, v in sorted(doc.items())] if isinstance(doc, dict) else []


def _coverage(spec: AcceptanceSpec, name: str, table: dict[str, dict], required: list[str], min_hours: float,
              min_samples: int, what: str) -> CheckResult:
    offenders, breaches = [], []
    missing = [v for v in required if v not in table]
    offenders += [(v, f"required {what} has no samples") for v in missing]
    thin = sorted((v for v, t in table.items() if t["hours"] < min_hours or t["samples"] < min_samples),
                  key=lambda v: table[v]["hours"])
    offenders += [(v, f"{table[v]['samples']} samples, {table[v]['hours']:.4f} h") for v in thin]
    if missing:
        breaches.append(f"{len(missing)} required {what}(s) missing")
    if thin:
        breaches.append(f"{len(thin)} {what}(s) under the minimum")
    least = min((t["hours"] for t in table.values()), default=0.0)
    return judge(spec, name, measured=round(least, 6), breaches=breaches,
                 message=f"{len(table)} {what}(s), least {least:.4f} h", offenders=offenders, kind=what,
                 details={"per_value": table})


def titles_check(spec: AcceptanceSpec, rows: list[dict]) -> CheckResult:
    table = hours_by(rows, lambda r: [r["title"]])
    return _coverage(spec, "titles", table, spec["required_titles"], spec["min_hours_per_title"],
                     spec["min_samples_per_title"], "title")


def conditions_check(spec: AcceptanceSpec, rows: list[dict]) -> CheckResult:
    table = hours_by(rows, conditions_of)
    return _coverage(spec, "conditions", table, spec["required_conditions"], spec["min_hours_per_condition"], 0,
                     "condition")


def _allowed(spec: AcceptanceSpec, name: str, key: str, table: dict[str, dict], match, what: str) -> CheckResult:
    allowed = spec[key]
    bad = [v for v in table if allowed and not any(match(v, a) for a in allowed)]
    return judge(spec, name, measured=len(table), breaches=[f"{len(bad)} {what}(s) not in {key}"] if bad else [],
                 message=f"{len(table)} {what}(s): " + ", ".join(f"{v} ({t['samples']})" for v, t in table.items()),
                 offenders=[(v, f"{table[v]['samples']} samples not allowed") for v in bad], kind=what,
                 details={"per_value": table})


def resolutions_check(spec: AcceptanceSpec, rows: list[dict]) -> CheckResult:
    table = hours_by(rows, lambda r: [f"{r['width']}x{r['height']}"])
    return _allowed(spec, "resolutions", "allowed_resolutions", table, lambda v, a: v == a.strip(), "resolution")


def frame_rates_check(spec: AcceptanceSpec, rows: list[dict]) -> CheckResult:
    table = hours_by(rows, lambda r: [fps_label(r["fps"])])

    def match(v: str, a: str) -> bool:
        try:
            return v != "unknown" and abs(float(v) - float(a)) < 1e-3
        except ValueError:
            return False
    return _allowed(spec, "frame_rates", "allowed_fps", table, match, "frame rate")


def duplicates_check(spec: AcceptanceSpec, rows: list[dict]) -> CheckResult:
    """Same sample hash, or the same window of the same source video: the later key is redundant."""
    first: dict[tuple, str] = {}
    offenders = []
    for r in sorted(rows, key=lambda r: r["key"]):
        ids = [("sha256", r["sha256"])]
        if r["source_video_sha256"]:
            ids.append(("window", r["source_video_sha256"], r["t_start"], r["t_end"]))
        twin = next((first[i] for i in ids if i in first), None)
        if twin is not None and twin != r["key"]:
            how = "same sample hash" if ("sha256", r["sha256"]) in first else "same window of the same source video"
            offenders.append((r["key"], f"duplicate of {twin} ({how})"))
        for i in ids:
            first.setdefault(i, r["key"])
    n, total = len(offenders), len(rows)
    frac = n / total if total else 0.0
    limit = spec["max_duplicate_fraction"]
    return judge(spec, "duplicates", measured=round(frac, 6),
                 breaches=[f"fraction {frac:.4g} > max_duplicate_fraction = {limit}"] if frac > limit else [],
                 message=f"{n} of {total} samples duplicate another", offenders=offenders)


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
                part = idx[start:start + 64]
                dist = np.bitwise_count(hashes[part][:, None, :] ^ hashes[idx][None, :, :]).sum(axis=2)
                dist[part[:, None] == idx[None, :]] = HASH_BITS + 1
                for a, row in zip(part.tolist(), dist):
                    j = int(np.argmin(row))
                    if row[j] <= max_bits and (a not in best or row[j] < best[a][0]):
                        best[a] = (int(row[j]), int(idx[j]))
    return {keys[a]: (d, keys[b]) for a, (d, b) in sorted(best.items())}


def near_duplicates_check(spec: AcceptanceSpec, facts: list[dict]) -> CheckResult:
    hashed = [(f["key"], f["video"]["phash"]) for f in facts if f.get("video") and f["video"].get("phash")]
    keys = [k for k, _ in hashed]
    hashes = np.array([h for _, h in hashed], dtype=np.uint64).reshape(len(hashed), 4)
    found = near_duplicate_pairs(keys, hashes, spec["near_duplicate_bits"])
    offenders = [(k, f"{d} bits from {other}") for k, (d, other) in sorted(found.items(), key=lambda x: x[1][0])]
    total = len(facts)
    frac = len(found) / total if total else 0.0
    limit = spec["max_near_duplicate_fraction"]
    return judge(spec, "near_duplicates", measured=round(frac, 6),
                 breaches=[f"fraction {frac:.4g} > max_near_duplicate_fraction = {limit}"] if frac > limit else [],
                 message=f"{len(found)} of {total} clips have a near-duplicate ({len(hashed)} hashed)",
                 offenders=offenders)


def action_usage(facts: list[dict]) -> dict[str, float]:
    active: dict[str, int] = defaultdict(int)
    frames: dict[str, int] = defaultdict(int)
    for f in facts:
        u = f.get("usage")
        if not u:
            continue
        for c, a in zip(u["controls"], u["active"]):
            active[c] += a
            frames[c] += u["frames"]
    return {c: round(active[c] / frames[c], 6) if frames[c] else 0.0 for c in sorted(frames)}


def action_balance_check(spec: AcceptanceSpec, facts: list[dict]) -> CheckResult:
    usage = action_usage(facts)
    if not usage:
        return judge(spec, "action_balance", measured=None, breaches=[], message="no action arrays to measure")
    low = sorted((c for c, u in usage.items() if u < spec["min_action_usage"]), key=usage.get)
    lo, hi = min(usage.values()), max(usage.values())
    imbalance = hi / lo if lo > 0 else None
    breaches = []
    if low:
        breaches.append(f"{len(low)} control(s) under min_action_usage = {spec['min_action_usage']}")
    ratio = f"{imbalance:.1f}" if imbalance is not None else "unbounded"  # a control never used: hi / 0
    if hi > 0 and (imbalance is None or imbalance > spec["max_action_imbalance"]):
        breaches.append(f"imbalance {ratio} > max_action_imbalance = {spec['max_action_imbalance']}")
    return judge(spec, "action_balance", measured=lo, breaches=breaches,
                 message=f"{len(usage)} controls, usage {lo:.4f}..{hi:.4f}, imbalance {ratio}",
                 offenders=[(c, f"active on {usage[c]:.4%} of frames") for c in low], kind="control",
                 details={"usage": usage, "imbalance": imbalance})
