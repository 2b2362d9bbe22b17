"""`verify`: prove a version's bytes are what its id says, link by link.

    version id  == sha256(manifest bytes)
    index       == the manifest's pin (sha256, bytes, rows)
    shard name  == its recorded sha256; its bytes == its recorded BLAKE3 (sha256 where a version predates
                   it), size as recorded. The BLAKE3 is pinned by the version id like everything in the
                   manifest; that a name is the sha256 of its bytes is proven where bytes are stored
                   under it (convert hashes what it writes, push and pull check both hashes, an object
                   store's reads are checked against the name)
    every index entry lies inside its shard and frames exactly its own sample
    every array member is, by its .npy header, the array the index records (dtype, order, shape)

Shards are hashed in a thread pool (the hashes release the GIL), several at once; entry checks are
arithmetic over the index plus the format's cheap framing proof, grouped by shard (linear in rows), and
the array members' headers (a few hundred bytes a sample, read as the shard's hash finishes: from the
page cache, not a second pass over its bytes).
Every problem names the file and what is wrong; missing or damaged shards name the command that heals.
"""

from __future__ import annotations

import os
import random
import shlex
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from dsbuild.core.errors import DsbuildError, FormatError, LineageError, StorageError
from dsbuild.core.files import open_regular
from dsbuild.core.hashing import CHUNK
from dsbuild.core.records import JsonValue
from dsbuild.formats import Entry, get_format
from dsbuild.formats.sample import array_shapes
from dsbuild.formats.shards import Shapes, array_problems, check_shard, shard_problems
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.index import LOCATOR_COLUMNS, entries_by_shard
from dsbuild.lineage.manifest import MAX_SESSIONS_BYTES, Manifest, ShardRecord

NOT_A_FILE = "not a regular file"  # a shard's name taken by a FIFO, a folder, a device or a link: never read
BAD_ARRAY = "bad array"  # a sample's .npy member is not the array its index row records (a damaged sample)
SHAPE_COLUMNS = ("key", "frames", "n_controls", "n_channels")  # what ``index_shapes`` reads


def index_shapes(table) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Each sample's array members' shapes (``array_shapes``), by key, from an index table holding
    ``SHAPE_COLUMNS`` (a null, in a forged index, counts as 0: no array matches it)."""
    cols = table.select(list(SHAPE_COLUMNS)).to_pydict()
    return {
        k: array_shapes(f or 0, c or 0, ch or 0)
        for k, f, c, ch in zip(cols["key"], cols["frames"], cols["n_controls"], cols["n_channels"])
    }


@dataclass
class VerifyReport:
    version_id: str
    shards_checked: int = 0
    bytes_checked: int = 0
    samples_checked: int = 0
    problems: list[dict] = field(default_factory=list)
    heal: str | None = None  # the command that rewrites missing or damaged shards

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {
            "version_id": self.version_id,
            "ok": self.ok,
            "shards_checked": self.shards_checked,
            "bytes_checked": self.bytes_checked,
            "samples_checked": self.samples_checked,
            "problems": self.problems,
            "heal": self.heal,
        }


class Stopped(Exception):
    """``verify``'s ``stop`` was set: its caller no longer needs the answer."""


def _go_on(stop: threading.Event | None, path: str) -> None:
    if stop is not None and stop.is_set():
        raise Stopped(path)


def _unreadable(catalog: Catalog, rec: ShardRecord, e: Exception) -> dict:
    """The problem to report for a shard that could not be read, or raise when the cause is not the data:
    an object store's reads fail for the network, the credentials or a full local cache (exit 3, like
    any command that cannot reach its data), never for damage, which the sizes and hashes find."""
    if (
        catalog.root is None
        and isinstance(e, (StorageError, OSError))
        and not isinstance(e, (LineageError, FileNotFoundError))
    ):
        raise StorageError(
            f"{catalog.url}/{rec.path}: cannot read ({str(e)[:200]})",
            hint="check the network, the credentials and free space in the cache, then run again "
            "(the shard itself was not found damaged)",
        ) from None
    return {"shard": rec.path, "problem": "unreadable", "detail": str(e)[:200]}


def _hash_shard(catalog: Catalog, rec: ShardRecord, stop: threading.Event | None = None) -> dict | None:
    _go_on(stop, rec.path)
    try:
        size = catalog.store.size(rec.path)
    except (OSError, DsbuildError) as e:
        return _unreadable(catalog, rec, e)
    if size is None:
        if catalog.root is not None and os.path.lexists(catalog.root / rec.path):  # a FIFO, folder, link, device
            return {"shard": rec.path, "problem": NOT_A_FILE, "detail": "present, but not a regular file"}
        return {"shard": rec.path, "problem": "missing"}
    if size != rec.bytes:
        return {"shard": rec.path, "problem": "size changed", "detail": f"{size} bytes, expected {rec.bytes}"}
    h = rec.proof()
    try:
        if catalog.root is not None:
            with open_regular(catalog.root / rec.path, catalog.root) as f:
                h.feed(f, lambda: _go_on(stop, rec.path))
        else:  # an object store: stream it by ranges, without caching what may be damaged
            for start in range(0, rec.bytes, CHUNK):
                h.update(catalog.store.read_range(rec.path, start, min(rec.bytes, start + CHUNK)))
                _go_on(stop, rec.path)
    except PermissionError as e:
        raise _not_allowed(catalog, rec, e) from None
    except (OSError, DsbuildError) as e:
        return _unreadable(catalog, rec, e)
    if not h.ok():
        return {"shard": rec.path, "problem": "altered", "detail": h.mismatch()}
    return None


def _hashed(problem: dict | None) -> bool:
    """Whether ``_hash_shard`` read the whole shard: only those bytes count as checked."""
    return problem is None or problem["problem"] == "altered"


def _check_entries(catalog: Catalog, m: Manifest, rec: ShardRecord, entries: list[Entry], shapes: Shapes) -> list[dict]:
    fmt = get_format(m.shard_format)
    try:
        # (an object store's cached copy is proven first: damage on local disk is the cache's, never the
        # version's, and is fetched again)
        path = catalog.shard_file(rec, proven=True)
        found = shard_problems(fmt, path, entries, rec.bytes)
        framed = [e for e in entries if e.key not in {key for key, _ in found}]
        arrays = array_problems(fmt, path, framed, shapes)
    except PermissionError as e:
        raise _not_allowed(catalog, rec, e) from None
    except (OSError, DsbuildError) as e:
        return [_unreadable(catalog, rec, e)]
    return [
        {"sample": key, "shard": rec.path, "problem": kind, "detail": why}
        for kind, pairs in (("bad locator", found), (BAD_ARRAY, arrays))
        for key, why in pairs
    ]


def check_shards(
    catalog: Catalog,
    version_id: str,
    records: list[ShardRecord] | None = None,
    entries: dict[str, list[Entry]] | None = None,
) -> None:
    """Refuse (CorruptDataError, exit 3) the version if one of its shards (``records``: those of them) fails
    the format's shard-safety check (``formats.shards.check_shard``, array headers included): what
    exports, ``shards`` and ``pull`` run before they link, list or copy a shard on; ``verify`` reports the
    same problems. ``entries``: the index's entries by shard, if read."""
    m = catalog.manifest(version_id)
    fmt = get_format(m.shard_format)
    columns = SHAPE_COLUMNS if entries is not None else (*LOCATOR_COLUMNS, *SHAPE_COLUMNS)
    table = catalog.index(version_id, list(dict.fromkeys(columns)))
    shapes = index_shapes(table)
    if entries is None:
        entries = entries_by_shard(table)
    for rec in m.shards if records is None else records:
        try:
            path = catalog.shard_file(rec, proven=True)
        except FileNotFoundError:
            raise LineageError(
                f"{catalog.url}/{rec.path}: the shard is missing",
                hint=f"`dsbuild verify {catalog.url}` names the command that heals it",
            ) from None
        check_shard(fmt, path, rec.path, entries.get(rec.path, []), rec.bytes, shapes=shapes)


def _not_allowed(catalog: Catalog, rec: ShardRecord, e: OSError) -> StorageError:
    """A shard this user may not read: the environment (exit 3), not damage to report (exit 1)."""
    return StorageError(
        f"{catalog.url}/{rec.path}: cannot read ({e.strerror or e})",
        hint="check the permissions of the catalog's files",
    )


def _index_entries(
    catalog: Catalog, m: Manifest, version_id: str, report: VerifyReport
) -> tuple[dict[str, list[Entry]], Shapes]:
    """The index's entries by shard and its samples' array shapes, after the checks that need no shard
    bytes (problems go to ``report``)."""
    try:  # proven by its hash only: its records are parsed by the commands that use them
        catalog.pinned_file(version_id, m.sessions, MAX_SESSIONS_BYTES)
    except LineageError as e:
        report.problems.append({"sessions": m.sessions.path, "problem": "altered or missing", "detail": str(e)})
    table = catalog.index(version_id, list(dict.fromkeys([*LOCATOR_COLUMNS, *SHAPE_COLUMNS])))
    if table.num_rows != m.index.rows:
        report.problems.append(
            {"index": m.index.path, "problem": f"{table.num_rows} rows, manifest says {m.index.rows}"}
        )
    by_shard = entries_by_shard(table)
    report.problems += [
        {"manifest": "stats", "problem": "does not make sense", "detail": why}
        for why in stats_problems(m, catalog.index(version_id, ["frames", "t_start", "t_end"]))
    ]
    known = {s.path for s in m.shards}
    for shard in sorted(set(by_shard) - known):
        report.problems += [
            {"sample": e.key, "problem": "index names a shard the manifest lacks", "detail": shard}
            for e in by_shard[shard]
        ]
    keys = [e.key for es in by_shard.values() for e in es]
    if len(set(keys)) != len(keys):
        report.problems.append({"index": m.index.path, "problem": f"{len(keys) - len(set(keys))} duplicated key(s)"})
    for s in m.shards:
        if len(by_shard.get(s.path, ())) != s.samples:
            report.problems.append(
                {
                    "shard": s.path,
                    "problem": f"manifest says {s.samples} samples, index has {len(by_shard.get(s.path, ()))}",
                }
            )
    return by_shard, index_shapes(table)


def stats_problems(m: Manifest, index) -> list[str]:
    """What does not make sense in the manifest's summary statistics (and its config's clip length): a
    value that is not finite or is negative, or one that disagrees with what it summarises (the shards,
    the session records, the quarantine and ``index``: a table with the ``frames``, ``t_start`` and
    ``t_end`` columns). A forged manifest, re-pinned, claimed 1e308 hours."""
    import math

    import pyarrow.compute as pc

    st, out = m.stats, []
    numbers = {f"stats.{k}": v for k, v in st.to_json().items() if k != "samples_per_title"}
    config = m.config if isinstance(m.config, dict) else {}
    if "clip_seconds" in config:
        numbers["config.clip_seconds"] = config["clip_seconds"]
    for name, v in numbers.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            out.append(f"{name} = {str(v)[:40]} is not a finite number >= 0")
    if config.get("clip_seconds") == 0:
        out.append("config.clip_seconds = 0: clips have a length")
    titles = sum(v for v in st.samples_per_title.values() if isinstance(v, int))
    frames = pc.sum(index["frames"]).as_py() or 0
    seconds = (pc.sum(pc.subtract(index["t_end"], index["t_start"])).as_py() or 0.0) if index.num_rows else 0.0
    expected = {
        "samples": index.num_rows,
        "shards": len(m.shards),
        "bytes": sum(s.bytes for s in m.shards),
        "frames": frames,
        "sessions": m.sessions.rows,
        "quarantined": len(m.quarantined),
    }
    for name, want in expected.items():
        if getattr(st, name) != want:
            out.append(f"stats.{name} = {str(getattr(st, name))[:40]}, the version holds {want}")
    if titles != st.samples:
        out.append(f"stats.samples_per_title adds up to {titles}, stats.samples is {str(st.samples)[:40]}")
    if isinstance(st.hours, (int, float)) and not abs(st.hours - seconds / 3600) <= 1e-5 + 1e-9 * seconds:
        out.append(f"stats.hours = {str(st.hours)[:40]}, the index's clips span {seconds / 3600:.6f}")
    return out


# How `dsbuild convert` sets each field of a build's config (convert.ConvertConfig): the heal command
# repeats every setting, so it rebuilds the version it was printed for whatever the defaults. A switch is
# "--on/--off". No flag sets transcode_encoder (derived from transcode). A test holds this to the config's
# fields and to the command's options.
CONVERT_FLAGS = {
    "format": "--format",
    "clip_seconds": "--clip-seconds",
    "shard_size": "--shard-size",
    "audio": "--audio/--no-audio",
    "transcode": "--transcode",
    "zstd_level": "--zstd-level",
}


def _flag(flag: str, value: JsonValue) -> list[str]:
    """One setting as convert's arguments (an unset ``None`` needs none)."""
    if "/" in flag:
        return [flag.split("/")[0 if value else 1]]
    return [] if value is None else [flag, str(value)]


def convert_flags(config: JsonValue) -> list[str]:
    """The arguments that give a build ``config`` (a manifest's, so anything: unknown values pass as text)."""
    known = config if isinstance(config, dict) else {}
    return [arg for name, flag in CONVERT_FLAGS.items() if name in known for arg in _flag(flag, known[name])]


def heal_command(catalog: Catalog, version_id: str) -> str:
    """The command that heals the version, safe to paste. It rebuilds this very version: its settings, onto
    it (its shards are re-hashed and the bad ones rewritten, also when it is not the newest). The captures
    folder comes from the commit record and the settings from the manifest, which a forged catalog (or a
    pull of one) controls, so every argument is shell-quoted."""
    commit = catalog.commit_record(version_id)
    captures = shlex.quote(commit.captures) if commit and commit.captures else "CAPTURES"
    args = [catalog.url, *convert_flags(catalog.manifest(version_id).config), "--onto", version_id, "--rehash"]
    return f"dsbuild convert {captures} " + " ".join(map(shlex.quote, args))


def verify(
    catalog: Catalog,
    version_id: str,
    *,
    sample: int | None = None,
    seed: int = 0,
    threads: int = 4,
    progress: Callable[[int, int], None] | None = None,
    stop: threading.Event | None = None,
) -> VerifyReport:
    """Check the whole chain for one version (all shards, or ``sample`` of them chosen by ``seed``).

    Shards start hashing as soon as the manifest is read; the index is read and checked meanwhile
    (the hashing threads release the GIL), so a command costs about its start-up plus the hashing.
    Setting ``stop`` (a caller that failed meanwhile) ends the hashing at its next 4 MiB: ``Stopped``."""
    report = VerifyReport(version_id)
    try:
        m = catalog.manifest(version_id)
    except (DsbuildError, FormatError) as e:
        report.problems.append({"version": version_id, "problem": "manifest", "detail": str(e)})
        return report
    shards = list(m.shards)
    if sample is not None and sample < len(shards):
        shards = sorted(random.Random(seed).sample(shards, sample), key=lambda s: s.path)
    done, counting = 0, threading.Lock()

    def check(rec: ShardRecord, bad: dict | None) -> list[dict]:
        nonlocal done
        entries = by_shard.get(rec.path, []) if by_shard is not None else None
        found = [bad] if bad else [] if entries is None else _check_entries(catalog, m, rec, entries, shapes)
        with counting:  # counted and reported together: the reports of the pool's threads stay in order
            done += 1
            if progress:
                progress(done, len(shards))
        return found

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        hashes = [pool.submit(_hash_shard, catalog, rec, stop) for rec in shards]
        try:
            by_shard, shapes = _index_entries(catalog, m, version_id, report)
        except (DsbuildError, FormatError) as e:
            if isinstance(e, StorageError) and not isinstance(e, LineageError):
                for h in hashes:
                    h.cancel()
                raise  # cannot be read here (permissions, the store): not a finding about the data
            # the shards are still proven (their damage would hide behind the index's); no entry is checked
            report.problems.append({"version": version_id, "problem": "index", "detail": str(e)})
            by_shard, shapes = None, {}
        checks = [pool.submit(check, rec, h.result()) for rec, h in zip(shards, hashes)]
        for c in checks:
            report.problems += c.result()
    report.shards_checked = len(shards)
    report.bytes_checked = sum(rec.bytes for rec, h in zip(shards, hashes) if _hashed(h.result()))
    # entries are checked only in shards whose bytes proved sound (a missing, resized or altered one: none)
    report.samples_checked = (
        sum(len(by_shard.get(rec.path, ())) for rec, h in zip(shards, hashes) if h.result() is None)
        if by_shard is not None
        else 0
    )
    # what the same convert writes back: damaged or missing shards, a lost or altered index or session records
    if any(
        p.get("problem") in ("missing", NOT_A_FILE, "size changed", "altered", "index", "altered or missing")
        for p in report.problems
    ):
        report.heal = heal_command(catalog, version_id)
    return report
