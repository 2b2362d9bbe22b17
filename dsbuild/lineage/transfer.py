"""Copying a version between catalogs on any stores (`push` and `pull`).

Content addressing makes it cheap and safe:
- only shards the destination lacks (or holds with the wrong size) are sent; each is hashed on the
  way and must match its name, so what arrives is what the manifest says;
- the version's files follow, the manifest last (on a local destination: one rename of a complete
  folder), so an interrupted transfer leaves no visible partial version, and running it again
  resumes where it stopped (shards already there are skipped);
- a destination that already holds the version must hold the same bytes (ids are hashes); if its
  manifest is damaged that is one storage error naming it, never a silent overwrite.
Tags pointing at the version and its split sets come along when asked; what would be refused there (a
tag or split set of the same name that names something else) is found before anything is sent, so a
refused copy changes nothing in the destination.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from dsbuild.core.errors import DsbuildError, LineageError, StorageError, UsageError
from dsbuild.core.files import UnsafeFile, open_regular
from dsbuild.core.hashing import CHUNK, hashes_to
from dsbuild.core.jsonio import pretty_json
from dsbuild.core.records import Record
from dsbuild.formats import get_format
from dsbuild.formats.shards import check_shard
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.index import LOCATOR_COLUMNS, entries_by_shard
from dsbuild.lineage.manifest import ShardRecord
from dsbuild.lineage.splitsets import SplitSet, list_split_sets, publish_split_set
from dsbuild.lineage.verify import SHAPE_COLUMNS, index_shapes


@dataclass(frozen=True, slots=True)
class TransferReport(Record):
    version_id: str
    source: str
    destination: str
    shards_sent: int
    shards_skipped: int
    bytes_sent: int
    version_existed: bool
    tags: tuple[str, ...]
    split_sets: tuple[str, ...]
    seconds: float


@dataclass
class _Progress:
    total: int
    done: int = 0
    bytes: int = 0
    started: float = field(default_factory=time.monotonic)


def _copy_verified(src: Path, dst: Path, rec: ShardRecord, root: Path | None, where: str) -> None:
    """Copy a shard file, hashing it on the way; refuse bytes that are not what its name (sha256) and its
    record (BLAKE3) say: what lands under a name here is trusted by that name from then on. The source is
    read as a regular file inside ``root`` (its catalog, when local) and never past its recorded size;
    ``where`` names it in messages (the source catalog's URL and the shard's path)."""
    h = rec.proof(named=True)
    got = 0
    with open_regular(src, root) as fin, open(dst, "wb") as fout:
        while got <= rec.bytes and (chunk := fin.read(min(CHUNK, rec.bytes + 1 - got))):
            h.update(chunk)
            fout.write(chunk)
            got += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    if got != rec.bytes:
        dst.unlink(missing_ok=True)
        raise LineageError(
            f"{where}: the source's shard is {'larger' if got > rec.bytes else 'smaller'} than "
            f"the {rec.bytes} bytes its record says",
            hint="run `dsbuild verify` on the source catalog",
        )
    if not h.ok():
        dst.unlink(missing_ok=True)
        raise LineageError(
            f"{where}: the source's bytes are not what the shard's name and record say "
            f"({h.mismatch()}): a damaged or forged source",
            hint="run `dsbuild verify` on the source catalog",
        )


def _fetch_verified(source: Catalog, rec: ShardRecord, local: Path) -> None:
    """``_copy_verified`` from the source's shard file. An object store's cached copy is proven by that
    same pass: one damaged on local disk since it arrived is dropped and fetched again (the download is
    proven on arrival), so the source is blamed only for what its store holds."""
    where = f"{source.url}/{rec.path}"
    try:
        _copy_verified(source.shard_file(rec), local, rec, source.root, where)
    except LineageError:
        if source.root is not None:
            raise
        source.drop_shard_copy(rec, lambda st: True)
        _copy_verified(source.shard_file(rec), local, rec, source.root, where)


def transfer(
    source: Catalog,
    ref: str | None,
    dest: Catalog,
    *,
    tags: bool = False,
    splits: bool = False,
    progress: Callable[[_Progress], None] | None = None,
) -> TransferReport:
    """Copy version ``ref`` of ``source`` into ``dest`` (created if needed by the caller)."""
    started = time.monotonic()
    vid = source.resolve(ref)
    m = source.manifest(vid)  # proven: its sha256 is the id
    existed = _present(dest, vid)
    names = _tags_to_copy(source, dest, vid) if tags else ()
    sets = _split_sets_to_copy(source, dest, vid) if splits else []
    state = _Progress(total=len(m.shards))
    sent = skipped = nbytes = 0
    fmt = get_format(m.shard_format)
    table = source.index(vid, list(dict.fromkeys([*LOCATOR_COLUMNS, *SHAPE_COLUMNS])))
    by_shard, shapes = entries_by_shard(table), index_shapes(table)

    def check(rec: ShardRecord, copy: Path) -> None:  # what verify checks, array headers included
        check_shard(fmt, copy, f"{source.url}/{rec.path}", by_shard.get(rec.path, []), rec.bytes, shapes=shapes)

    with dest.build_area() as area:

        def send(rec: ShardRecord) -> None:
            nonlocal sent, nbytes
            _send(source, dest, rec, area.path, check)
            sent, nbytes = sent + 1, nbytes + rec.bytes

        def send_again(rec: ShardRecord) -> None:  # one counted as skipped, gone before the commit
            nonlocal skipped
            send(rec)
            skipped -= 1

        for rec in m.shards:
            area.hold(rec.path)  # (a gc meanwhile keeps it: unreferenced until the manifest lands)
            if dest.store.size(rec.path) == rec.bytes:
                skipped += 1
            else:
                send(rec)
            state.done += 1
            state.bytes = nbytes
            if progress:
                progress(state)
        if existed:  # the same version: write back any file it pins that is missing or damaged there
            with dest.lock():
                dest.restore_pins(vid, m, source.pinned_files(vid))
        else:
            _publish(source, dest, vid, area.path, send_again)
    for t in names:
        dest.set_tag(t, vid)
    for sp, files in sets:
        publish_split_set(dest, vid, sp.name, files, sp.manifest)
    return TransferReport(
        vid,
        source.url,
        dest.url,
        sent,
        skipped,
        nbytes,
        existed,
        names,
        tuple(sp.name for sp, _ in sets),
        round(time.monotonic() - started, 3),
    )


def _present(dest: Catalog, vid: str) -> bool:
    if not dest.store.exists(f"versions/{vid}/manifest.json"):
        return False
    try:
        dest.manifest(vid)
    except LineageError as e:
        raise LineageError(
            f"{dest.url}: holds version {vid[:12]} but its manifest is damaged ({e})",
            hint="remove that version folder from the destination, then run again",
        ) from None
    return True


def _send(
    source: Catalog, dest: Catalog, rec: ShardRecord, scratch: Path, check: Callable[[ShardRecord, Path], None]
) -> None:
    """One shard from ``source`` into ``dest``, proven on the way (through ``scratch``, a build folder):
    its bytes against its hashes, then ``check(rec, copy)``: the shard-safety check ``verify`` runs, so a
    forged catalog's linked, escaping or setuid members never land."""
    local = scratch / f"{rec.sha256}.part"
    try:
        _fetch_verified(source, rec, local)
        check(rec, local)
    except (UnsafeFile, FileNotFoundError) as e:
        local.unlink(missing_ok=True)
        why = "missing" if isinstance(e, FileNotFoundError) else str(e).split(": ", 1)[-1]
        raise LineageError(
            f"{source.url}/{rec.path}: {why}", hint="run `dsbuild verify` on the source catalog"
        ) from None
    except DsbuildError:
        local.unlink(missing_ok=True)
        raise
    if dest.root is not None:
        (dest.root / rec.path).parent.mkdir(parents=True, exist_ok=True)
    try:
        dest.store.put(local, rec.path)
    except OSError as e:
        raise StorageError(f"{dest.url}/{rec.path}: cannot write ({e.strerror or e})") from None
    local.unlink(missing_ok=True)
    if dest.store.size(rec.path) != rec.bytes:
        raise StorageError(f"{dest.url}/{rec.path}: arrived with the wrong size")


def _publish(source: Catalog, dest: Catalog, vid: str, scratch: Path, send: Callable[[ShardRecord], None]) -> None:
    commit = source.commit_record(vid)
    files = source.pinned_files(vid)
    manifest = source.store.read(f"versions/{vid}/manifest.json", 1 << 30, proven=hashes_to(vid))
    with dest.lock():
        if dest.store.exists(f"versions/{vid}/manifest.json"):
            return  # published by another copy of the same version meanwhile: the same bytes (ids are hashes)
        for rec in source.manifest(vid).shards:  # under the lock, which gc takes: none goes missing now
            if dest.store.size(rec.path) != rec.bytes:  # one found there when the copy began, removed since
                send(rec)
        if commit is not None:
            there = {v.version_id: c for v in dest.versions() if (c := v.commit) is not None}
            keys = {k: (c.sequence, c.created_at) for k, c in there.items()}
            seq = copy_sequence(
                commit.created_at,
                list(keys.values()),
                None if commit.parent is None else keys.get(commit.parent),
                [keys[k] for k, c in there.items() if c.parent == vid],
            )
            files["commit.json"] = pretty_json(replace(commit, sequence=seq).to_json())
        dest.publish(vid, {**files, "manifest.json": manifest}, scratch)


def copy_sequence(
    created_at: str,
    existing: list[tuple[int, str]],
    parent: tuple[int, str] | None = None,
    children: Sequence[tuple[int, str]] = (),
) -> int:
    """The commit sequence of a copied version (``created_at`` its creation time) among ``existing``
    (sequence, creation time) pairs; ``parent`` and ``children`` are those of its parent and children
    there. Versions sort by sequence, then time, then id. The copy gets the highest sequence of the
    versions there made no later than it, so a copy of an older version does not become the newest;
    where that would not put it after its parent (made in the same second, or on a machine whose clock
    was behind) it gets one more than its parent's, unless that would put it after a child of its own."""
    key = (max((seq for seq, at in existing if at <= created_at), default=0), created_at)
    if parent is not None and parent >= key:
        bumped = (parent[0] + 1, created_at)
        if all(child > bumped for child in children):
            key = bumped
    return key[0]


def _tags_to_copy(source: Catalog, dest: Catalog, vid: str) -> tuple[str, ...]:
    """The source's tags naming ``vid``; refused, before anything is sent, if one names another version
    in ``dest`` (found after the copy, it left a published version behind an error)."""
    names = sorted(t for t, v in source.tags().items() if v == vid)
    for t in names:  # (a hex-only tag could name another version's prefix there: refused after the copy)
        dest.check_new_tag(t)
    theirs = dest.tags()
    clash = [t for t in names if t in theirs and theirs[t] != vid]
    if clash:
        raise UsageError(
            f"{dest.url}: tag {clash[0]!r} already points at {theirs[clash[0]][:12]}; nothing was copied",
            hint="move it there with `dsbuild tag --force`, or copy without --tags",
        )
    return tuple(names)


def _split_sets_to_copy(source: Catalog, dest: Catalog, vid: str) -> list[tuple[SplitSet, dict[str, bytes]]]:
    """The version's split sets with their files (each proven against its manifest); refused, before
    anything is sent, if ``dest`` holds a different split set of the same name for the version."""
    theirs = {sp.name: sp.hash for sp in list_split_sets(dest, vid)}
    out = []
    for sp in list_split_sets(source, vid):
        if theirs.get(sp.name, sp.hash) != sp.hash:
            raise UsageError(
                f"{dest.url}: split set {sp.name!r} of version {vid[:12]} is a different one there (hash "
                f"{theirs[sp.name][:12]}, this one {sp.hash[:12]}); nothing was copied",
                hint="copy without --splits",
            )
        out.append((sp, {f"{split}.parquet": sp.file_bytes(split) for split in sp.splits}))
    return out
