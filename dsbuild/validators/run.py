"""Running a validation: the proven manifest and index -> lineage.verify (every shard hashed, every
locator checked, in threads) beside one pass over every sample (``core.executor.run_tasks``: local
processes or Ray) -> each registered check's ``run`` -> the Report. On a local catalog the two overlap
(the pass re-reads the units of any shard the hashing finds damaged); an object store's shards are
hashed first, as that fills the cache the pass reads.

The library decides no exit code: ``Report.accepted`` (or ``Report.raise_if_rejected()``, which raises
``CheckFailed``) is what a caller gates on. Mistakes of the caller (unknown version or split set) are
``UsageError``s; a catalog that is not what it claims (edited manifest, altered index, damaged split set)
is a ``LineageError``; a damaged shard or sample is a finding, never an exception.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from dsbuild.core.errors import DsbuildError, FormatError, LineageError, UsageError
from dsbuild.core.executor import ExecutorSpec, run_tasks
from dsbuild.formats import get_format
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.index import IndexRow, rows_from_table
from dsbuild.lineage.verify import verify
from dsbuild.validators.base import LEVELS, Check, Judge
from dsbuild.validators.checks.dataset import seconds
from dsbuild.validators.checks.splits import read_split
from dsbuild.validators.facts import VersionFacts
from dsbuild.validators.model import CheckResult, Report, Summary, per_sample
from dsbuild.validators.registry import CHECKS
from dsbuild.validators.samplepass import UnitResult, inspect_unit, make_units
from dsbuild.validators.spec import AcceptanceSpec, default_spec

# Below this much work, forking workers costs more than it saves and the pass runs in this process.
POOL_MIN = {"structural": 64 << 20, "full": 600}  # shard bytes / frames
Progress = Callable[[int, int, str], None]  # (done, total, stage): "shards" (hashing) and "samples", at once


@dataclass(frozen=True)
class ValidateOptions:
    level: str = "structural"  # structural is fast enough for every commit; full decodes every clip
    split: str | None = None  # a split set of the version: adds the leakage and coverage checks
    threads: int = 0  # shards lineage.verify hashes at once; 0 = one per executor worker (hashlib frees the GIL)

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise UsageError(f"level {str(self.level)[:40]!r}: use {' or '.join(LEVELS)}")
        if not isinstance(self.threads, int) or self.threads < 0:
            raise UsageError(f"threads must be a whole number >= 0 (0 = one per worker), not {self.threads!r}")
        if self.split is not None and (not isinstance(self.split, str) or not self.split.strip()):
            # an unset $SPLIT in a CI line must not turn the leakage checks off and pass the gate
            raise UsageError("split set name is empty", hint="name the split set, or leave --split-set out")


def _reporter(progress: Progress | None, stage: str) -> Callable[[int, int], None] | None:
    """``progress`` for one stage, serialised (lineage.verify reports from its hashing threads)."""
    if progress is None:
        return None
    lock = threading.Lock()

    def report(done: int, total: int) -> None:
        with lock:
            progress(done, total, stage)

    return report


def _missing(facts: VersionFacts) -> set[str]:
    """Shards lineage.verify found missing (their samples are lost, not read)."""
    return {p["shard"] for p in facts.verify if p.get("problem") == "missing" and "sample" not in p}


class _Beside:
    """``work(stop)`` in a thread: ``wait()`` joins it and re-raises its error; ``cancel()`` sets ``stop``
    (lineage.verify then ends at its next 4 MiB) and joins it, its outcome no longer wanted."""

    def __init__(self, work: Callable[[threading.Event], None]):
        self.stop = threading.Event()
        self.failed: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(work,), name="dsbuild-validate-shards", daemon=True)

    def _run(self, work) -> None:
        try:
            work(self.stop)
        except BaseException as e:
            self.failed.append(e)

    def wait(self) -> None:
        self.thread.join()
        if self.failed:
            raise self.failed[0]

    def cancel(self) -> None:
        self.stop.set()
        if self.thread.ident is not None:
            self.thread.join()


def _sample_pass(
    catalog: Catalog,
    facts: VersionFacts,
    spec: AcceptanceSpec,
    executor: ExecutorSpec,
    progress: Progress | None,
    alongside: Callable[[threading.Event], None] | None = None,
) -> None:
    """Read every sample once (``inspect_unit`` in the workers).

    With ``alongside`` (the shard hashing), the pass does not wait for the shards' verdict: the hashing
    runs in a thread beside the workers, units read every present shard as if it were sound, and once
    the hashing is done a shard found damaged has its units read again (to name the damaged samples)."""
    m = facts.manifest
    by_shard: dict[str, list[IndexRow]] = defaultdict(list)
    for r in facts.rows:
        by_shard[r.shard].append(r)
    skip = _missing(facts)
    paths: dict[str, str] = {}
    for rec in m.shards:
        if rec.path in skip:
            continue
        try:
            path = str(catalog.shard_file(rec, proven=True))  # (a cached copy damaged locally: fetched again)
        except FileNotFoundError:
            continue  # missing: lineage.verify names it and its samples are lost with it (reported once)
        except (DsbuildError, OSError) as e:  # e.g. an object store's bytes fail the cache's sha256 check
            facts.lost += [
                (r.key, f"in shard {rec.path}, which cannot be read ({str(e)[:160]})") for r in by_shard[rec.path]
            ]
            skip.add(rec.path)
            continue
        paths[rec.path] = path
    work = sum(s.bytes for s in m.shards) if facts.level == "structural" else sum(r.frames or 0 for r in facts.rows)
    if executor.kind == "local" and work < POOL_MIN[facts.level]:
        executor = ExecutorSpec(workers=1)
    units = make_units(by_shard, paths, m.shard_format, facts.level, spec, set(facts.bad_shards()), executor.count)
    results: list[UnitResult | None] = [None] * len(units)
    total, done = sum(len(u.rows) for u in units), 0
    report = _reporter(progress, "samples")
    if report:
        report(0, total)

    def collect(i: int, result: UnitResult) -> None:
        nonlocal done
        results[i] = result
        done += len(result.samples)
        if report:
            report(done, total)

    beside = _Beside(alongside) if alongside else None
    try:
        run_tasks(
            inspect_unit,
            units,
            executor,
            collect,
            describe=lambda u: f"shard {u.shard}",
            started=beside.thread.start if beside else None,
        )
    except BaseException:
        if beside:  # a failed pass (a dead worker, Ctrl-C) ends the hashing too, at its next 4 MiB
            beside.cancel()
        raise
    if beside:
        beside.wait()
    bad, missing = facts.bad_shards(), _missing(facts)
    # Units of shards the hashing found damaged while the pass read them: gone, or read again (in
    # workers, as the first time) to name the damaged samples
    redo = [i for i, unit in enumerate(units) if unit.shard in bad and not unit.shard_damaged]
    for i in redo:
        results[i] = None
    again = [i for i in redo if units[i].shard not in missing]
    run_tasks(
        inspect_unit,
        [replace(units[i], shard_damaged=True) for i in again],
        executor,
        lambda k, result: results.__setitem__(again[k], result),
        describe=lambda u: f"shard {u.shard}",
    )
    for shard in sorted(missing - skip):  # (each lost sample once: one found unreadable above is named there)
        facts.lost += [(r.key, f"lost with missing shard {shard}") for r in by_shard[shard]]
    facts.samples = sorted((s for r in results if r for s in r.samples), key=lambda s: s.key)
    facts.unsafe = sorted(x for r in results if r for x in r.unsafe)


def _result(check: Check, spec: AcceptanceSpec, facts: VersionFacts) -> CheckResult:
    j = Judge(check, spec)
    if spec.severity_of(check.name) == "off":
        return j.skipped("turned off by the acceptance spec")
    if check.level == "full" and facts.level != "full":
        return j.skipped("needs level full")
    if check.needs_split and facts.split is None:
        return j.skipped("needs a split set")
    return check.run(j, facts)


def validate(
    catalog: Catalog | Path | str,
    version: str | None = None,
    spec: AcceptanceSpec | None = None,
    options: ValidateOptions = ValidateOptions(),
    *,
    executor: ExecutorSpec = ExecutorSpec(),
    progress: Progress | None = None,
) -> Report:
    """Validate one version (a tag, id, unique prefix, or None for the newest) against ``spec`` (the
    defaults when None). ``progress(done, total, stage)`` is called as shards are hashed and samples read."""
    started = time.monotonic()
    catalog = catalog if isinstance(catalog, Catalog) else Catalog.open(catalog)
    version_id = catalog.resolve(version)
    spec = spec or default_spec()
    m = catalog.manifest(version_id)
    try:
        get_format(m.shard_format)
    except FormatError as e:
        raise LineageError(
            f"{catalog.url}: version {version_id[:12]}: {e}",
            hint="it was written by another dsbuild; validate it with that one",
        ) from None
    facts = VersionFacts(version_id, options.level, m, rows_from_table(catalog.index(version_id)))
    facts.sessions = list(catalog.sessions(version_id).sessions)
    if options.split is not None:
        facts.split = read_split(catalog, version_id, options.split)
    timings = {}

    def check_shards(stop: threading.Event | None = None) -> None:
        began = time.monotonic()
        facts.verify = verify(
            catalog,
            version_id,
            threads=options.threads or executor.count,
            progress=_reporter(progress, "shards"),
            stop=stop,
        ).problems
        timings["shards"] = round(time.monotonic() - began, 3)

    # A local catalog's shards are hashed while the samples are read (hashlib and the decoders free the
    # GIL); an object store's are hashed first, since the hashing fills the shard cache the pass reads.
    remote = catalog.root is None
    if remote:
        check_shards()
    t = time.monotonic()
    _sample_pass(catalog, facts, spec, executor, progress, None if remote else check_shards)
    timings["samples"] = round(time.monotonic() - t, 3)
    t = time.monotonic()
    checks = tuple(_result(c, spec, facts) for c in CHECKS)
    timings["checks"] = round(time.monotonic() - t, 3)
    timings["total"] = round(time.monotonic() - started, 3)
    durations = [seconds(r) for r in facts.rows]
    summary = Summary(
        samples=len(facts.rows),
        shards=len(m.shards),
        bytes=sum(s.bytes for s in m.shards),
        hours=round(sum(durations) / 3600, 6),
        shard_format=m.shard_format,
        checked_content=sum(s.content for s in facts.samples),
        decoded_frames=sum(c.decoded for _, c in facts.clips()),
        seconds=timings,
        durations=per_sample("clip window length", durations, "s"),
    )
    return Report(catalog.url, version_id, options.level, options.split, spec.source, spec.to_json(), checks, summary)
