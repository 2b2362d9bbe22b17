"""Running a validation: manifest -> shards + locators (lineage.verify) -> one pass over every sample (in
``workers`` processes) -> dataset checks -> split checks -> one CheckResult per registered check.

``lineage.verify`` (every shard hashed, every locator checked) runs in a thread beside the sample pass
(hashlib releases the GIL), so structural validation costs about what ``dsbuild verify`` costs.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Callable

import numpy as np

from dsbuild.core.errors import DsbuildError, UsageError
from dsbuild.lineage.catalog import Catalog, open_catalog
from dsbuild.validators.checks import dataset as ds
from dsbuild.validators.checks.common import count_check, fraction_check, judge, skipped
from dsbuild.validators.checks.content import video_problems
from dsbuild.validators.checks.splits import load_split, split_checks
from dsbuild.validators.checks.structural import check_manifest, check_shards, key_order_problems
from dsbuild.validators.inspect import damaged_samples, inspect_unit, make_units
from dsbuild.validators.model import CheckResult, Report
from dsbuild.validators.spec import CHECKS, LEVELS, AcceptanceSpec, default_spec

# Below this much work a process pool costs more to start (~0.3 s per worker: interpreter, numpy, PyAV)
# than it saves, so the pass runs in this process. Structural work runs at ~1 GB/s per process (read,
# parse, no hashing); decoding at a few hundred frames/s.
POOL_MIN = {"structural": 1 << 30, "full": 600}  # shard bytes / frames

# How each per-sample check names what it counts.
_WHAT = {"index": "index row(s) disagree with their sample", "members": "sample(s) malformed",
         "keys": "key problem(s)", "decode": "clip(s) fail to decode",
         "frame_count": "clip(s) with a wrong frame count",
         "fps": "clip(s) with a wrong frame rate", "resolution": "clip(s) with a wrong resolution",
         "duration": "clip(s) with a wrong duration", "audio": "clip(s) with wrong audio",
         "actions": "bad action array(s)", "telemetry": "bad telemetry array(s)",
         "timestamps": "bad timestamp array(s)", "action_events": "sample(s) with bad action events",
         "text": "sample(s) with bad text events"}


@dataclass(frozen=True)
class ValidateOptions:
    level: str = "structural"  # structural is fast enough for every commit; full decodes every clip
    split: str | None = None  # a split set name: adds leakage and coverage checks
    workers: int = 0  # processes for the sample pass; 0 = one per core (like convert)
    threads: int = 4  # shards hashed at once (lineage.verify's default)
    executor: str = "local"  # local processes, or ray: one Ray task per shard unit
    ray_address: str | None = None  # None: start a local Ray


def _pass(units, workers: int, progress: Callable[[int, int], None] | None,
          options: ValidateOptions = ValidateOptions()) -> list[dict]:
    results = []
    if options.executor == "ray":
        from dsbuild.core.executor import ray_map

        slots: list = [None] * len(units)

        def store(i: int, r: dict) -> None:
            slots[i] = r
            if progress:
                progress(sum(x is not None for x in slots), len(units))

        ray_map(inspect_unit, units, address=options.ray_address, num_cpus=workers, on_result=store)
        return slots
    if options.executor != "local":
        raise UsageError(f"--executor must be local or ray, not {options.executor!r}")
    if workers <= 1 or len(units) <= 1:
        for i, u in enumerate(units):
            results.append(inspect_unit(u))
            if progress:
                progress(i + 1, len(units))
        return results
    # spawn: workers start clean (no inherited threads from pyarrow or a progress display)
    with ProcessPoolExecutor(max_workers=min(workers, len(units)), mp_context=get_context("spawn")) as pool:
        for i, r in enumerate(pool.map(inspect_unit, units)):
            results.append(r)
            if progress:
                progress(i + 1, len(units))
    return results


def _sample_checks(spec: AcceptanceSpec, names: list[str], facts: list[dict],
                   extra: dict[str, list]) -> list[CheckResult]:
    """One check per name over the per-sample problems; a sample counts once per check, its details joined."""
    by_check: dict[str, dict[str, list[str]]] = {n: {} for n in names}
    pairs = [(n, item, d) for n in names for item, d in extra.get(n, [])]
    pairs += [(check, f["key"], d) for f in facts for check, d in f["problems"]]
    for check, item, detail in pairs:
        if check in by_check:
            details = by_check[check].setdefault(item, [])
            if detail not in details:
                details.append(detail)
    out = []
    for n in names:
        offenders = [(item, "; ".join(ds)) for item, ds in by_check[n].items()]
        if n in ("black_clips", "frozen_clips"):
            key = "max_black_fraction" if n == "black_clips" else "max_frozen_fraction"
            checked = sum(1 for f in facts if f.get("video"))
            what = "decoded clips are " + ("black" if n == "black_clips" else "frozen")
            out.append(fraction_check(spec, n, key, offenders, checked, what))
        else:
            out.append(count_check(spec, n, offenders, what=_WHAT.get(n, "problem(s)")))
    return out


def validate(catalog: Catalog | Path | str, version_id: str | None = None, spec: AcceptanceSpec | None = None,
             options: ValidateOptions = ValidateOptions(),
             progress: Callable[[int, int], None] | None = None) -> Report:
    """Validate one version against ``spec`` (defaults when None). Raises only for usage errors."""
    started = time.monotonic()
    catalog = catalog if isinstance(catalog, Catalog) else open_catalog(catalog)
    version_id = catalog.resolve(version_id)
    spec = spec or default_spec()
    workers = options.workers or os.cpu_count() or 1
    if options.level not in LEVELS:
        raise UsageError(f"--level {options.level!r}: use structural or full")
    split = load_split(catalog, version_id, options.split) if options.split else None  # missing: exit 2 now
    results: dict[str, CheckResult] = {}
    timings: dict[str, float] = {}
    summary: dict = {"samples": 0, "shards": 0, "bytes": 0, "hours": 0.0}

    def finish() -> Report:
        checks = []
        for c in CHECKS:
            r = results.get(c.name)
            if spec.severity_of(c.name) == "off":
                r = skipped(spec, c.name, "turned off by the acceptance spec")
            elif r is None and c.level == "full" and options.level != "full":
                r = skipped(spec, c.name, "needs --level full")
            elif r is None and c.needs_split and not options.split:
                r = skipped(spec, c.name, "needs --split NAME")
            elif r is None:
                r = skipped(spec, c.name, "not run: the manifest check failed")
            checks.append(r)
        summary["seconds"] = {**timings, "total": round(time.monotonic() - started, 3)}
        where = catalog.remote.url if catalog.remote is not None else str(catalog.root)
        return Report(where, version_id, options.level, options.split, spec.source, spec.to_json(),
                      tuple(checks), summary)

    t = time.monotonic()
    facts = check_manifest(catalog, version_id)
    results["manifest"] = judge(spec, "manifest", measured=len(facts.problems),
                                breaches=[f"{len(facts.problems)} problem(s)"] if facts.problems else [],
                                message=facts.problems[0][1] if facts.problems
                                else "manifest, index and content id are consistent",
                                offenders=facts.problems, kind="file")
    timings["manifest"] = round(time.monotonic() - t, 3)
    if facts.fatal:
        return finish()
    m, rows = facts.manifest, facts.rows
    summary.update(samples=len(rows), shards=len(m.shards), bytes=sum(s.bytes for s in m.shards),
                   hours=round(sum(map(_seconds, rows)) / 3600, 6),
                   shard_format=m.shard_format, durations=[round(_seconds(r), 3) for r in rows])
    dropped = {s.get("session_id") for s in m.sessions
               if isinstance(s, dict) and isinstance(s.get("repairs"), dict) and s["repairs"].get("audio_not_carried")}

    t = time.monotonic()
    paths = _local_paths(catalog, m.shards)
    units = make_units(paths, m.shard_format, rows, options.level, dropped)
    work = summary["bytes"] if options.level == "structural" else sum(r["frames"] or 0 for r in rows)
    if work < POOL_MIN[options.level] and options.executor == "local":
        workers = 1
    with ThreadPoolExecutor(max_workers=1) as hasher:
        shard_future = hasher.submit(check_shards, catalog, version_id, options.threads)
        unit_results = _pass(units, workers, progress, options)
        shards = shard_future.result()
    timings["samples"] = round(time.monotonic() - t, 3)
    samples = sorted((s for u in unit_results for s in u["samples"]), key=lambda f: f["key"])
    unsafe = sorted(x for u in unit_results for x in u["unsafe"])
    if options.level == "full":
        for f in samples:
            if f["video"] is not None:
                f["problems"] += video_problems(f["video"], f["expect"], spec, f["audio_expected"])

    results["shard_hashes"] = _shard_result(spec, shards.bad, samples, rows, paths, m)
    structural = ["index", "members", "keys"]
    content = [c.name for c in CHECKS if c.stage == "content"] if options.level == "full" else []
    extra = {"index": shards.locators, "keys": key_order_problems(rows)}
    for r in _sample_checks(spec, structural + content, samples, extra):
        results[r.name] = r
    results["unsafe_members"] = count_check(spec, "unsafe_members", unsafe, what="unsafe member(s)", kind="member")

    t = time.monotonic()
    for r in (ds.titles_check(spec, rows), ds.conditions_check(spec, rows), ds.resolutions_check(spec, rows),
              ds.frame_rates_check(spec, rows), ds.duplicates_check(spec, rows),
              ds.action_balance_check(spec, samples)):
        results[r.name] = r
    if options.level == "full":
        results["near_duplicates"] = ds.near_duplicates_check(spec, samples)
        summary["decoded_frames"] = sum(f["video"]["decoded"] for f in samples if f.get("video"))
        motion = [f["video"]["motion"] for f in samples if f.get("video") and f["video"]["motion"] is not None]
        summary["motion"] = [round(x, 3) for x in motion]
    if options.split:
        for r in split_checks(spec, split, options.split, rows):
            results[r.name] = r
    timings["dataset"] = round(time.monotonic() - t, 3)
    summary["checked_content"] = sum(1 for f in samples if f["content"])
    summary["action_usage"] = ds.action_usage(samples)
    summary["duration_stats"] = _stats(summary["durations"])
    return finish()


def _shard_result(spec: AcceptanceSpec, bad_shards: dict[str, str], samples: list[dict], rows: list[dict],
                  paths: dict, m) -> CheckResult:
    """Damaged shards first, then the samples inside them (re-read once more, hashing each, to name them)."""
    bad = sorted(bad_shards.items())
    damaged = [(f["key"], d, "sample") for f in samples for c, d in f["problems"] if c == "shard_hashes"]
    for shard, why in bad:
        srows = [r for r in rows if r["shard"] == shard]
        if why == "missing":
            damaged += [(r["key"], f"lost with missing shard {shard}", "sample") for r in srows]
        else:
            damaged += damaged_samples(paths.get(shard, (None, ""))[0], shard, m.shard_format, srows)
    limit = spec["max_bad_shards"]
    return judge(spec, "shard_hashes", measured=len(bad),
                 breaches=[f"{len(bad)} > max_bad_shards = {limit}"] if len(bad) > limit else [],
                 message=f"{len(bad)} of {len(m.shards)} shards missing, truncated or altered"
                         + (f"; {len(damaged)} sample(s) inside them damaged" if damaged else ""),
                 offenders=bad + sorted(damaged), kind="shard")


def _seconds(r: dict) -> float:
    """A sample's window length; 0 for a row without a usable window (the index check reports it)."""
    t0, t1 = r.get("t_start"), r.get("t_end")
    return max(0.0, t1 - t0) if isinstance(t0, float) and isinstance(t1, float) else 0.0


def _local_paths(catalog: Catalog, shards) -> dict[str, tuple[str | None, str]]:
    """shard -> (a local file holding it, or None and why not). Remote catalogs fetch into their cache."""
    out = {}
    for s in shards:
        if catalog.remote is None:
            out[s.path] = (str(catalog.root / s.path), "")
            continue
        try:
            out[s.path] = (str(catalog.shard_file(s.path)), "")
        except (DsbuildError, OSError) as e:  # e.g. the stored bytes fail the cache's sha256 check
            out[s.path] = (None, f"shard cannot be fetched ({e})")
    return out


def _stats(values: list[float]) -> dict:
    if not values:
        return {}
    a = np.asarray(values)
    return {"min": float(a.min()), "median": float(np.median(a)), "max": float(a.max())}
