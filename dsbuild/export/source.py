"""What an export holds: one version, its samples grouped into the tool's splits, read back proven.

``--split NAME`` maps every split of the split set NAME onto the tool's splits (same names);
``--split NAME/SPLIT`` exports that split alone; no split set exports the whole version as one split
named ``train`` (what every peer tool reads by default). Samples stay in key order within a split, and
since a version's shards are cut from its key-sorted samples, walking shards in manifest order walks
keys in order too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from dsbuild.core.errors import CorruptDataError, FormatError, UsageError
from dsbuild.formats import Entry, get_format
from dsbuild.formats.base import Members, ShardReader
from dsbuild.formats.sample import members_sha256
from dsbuild.formats.shards import plan_shards
from dsbuild.lineage.catalog import Catalog, open_ref
from dsbuild.lineage.index import LOCATOR_COLUMNS, entries_by_shard
from dsbuild.lineage.manifest import Manifest, ShardRecord
from dsbuild.lineage.splitsets import open_split_set
from dsbuild.lineage.verify import check_shards

WHOLE = "train"
HEAL = "`dsbuild verify` names the damage and the command that heals it"  # the split name of a version exported without a split set


@dataclass(frozen=True)
class ShardPart:
    """The samples of one split that live in one shard (``whole``: the shard holds no other sample)."""

    shard: ShardRecord
    entries: tuple[Entry, ...]
    foreign: tuple[Entry, ...]  # the shard's samples that belong elsewhere (other splits or none)

    @property
    def whole(self) -> bool:
        return not self.foreign


@dataclass(frozen=True)
class Split:
    name: str
    parts: tuple[ShardPart, ...]

    @property
    def samples(self) -> int:
        return sum(len(p.entries) for p in self.parts)

    def entries(self) -> list[tuple[ShardRecord, Entry]]:
        return [(p.shard, e) for p in self.parts for e in p.entries]


@dataclass(frozen=True)
class ExportSource:
    catalog: Catalog
    version_id: str
    manifest: Manifest
    split_set: str | None  # NAME or NAME/SPLIT as asked
    split_hash: str | None  # the split set's hash (what its data is), None without one
    splits: tuple[Split, ...]
    sizes: dict[str, int]  # key -> the sample's member bytes (what file planning weighs)

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.splits)

    def check_shards(self) -> None:
        """Every shard the export reads or links, refused (exit 3, naming shard and member) unless it
        passes the one shard-safety check ``verify`` runs: a linked tar is extracted by other tools."""
        parts = {p.shard.path: p for s in self.splits for p in s.parts}
        entries = {path: [*p.entries, *p.foreign] for path, p in parts.items()}
        check_shards(self.catalog, self.version_id, [p.shard for p in parts.values()], entries)

    def members(self, items: list[tuple[ShardRecord, Entry]]) -> Iterator[tuple[Entry, Members]]:
        return proven_members(self.catalog, self.manifest.shard_format, items)

    def chunks(self, items: list[tuple[ShardRecord, Entry]], target: int) -> list[list[tuple[ShardRecord, Entry]]]:
        """Cut key-ordered samples into files of about ``target`` bytes (content-defined boundaries, as
        shards are: the same samples always give the same files)."""
        keys = [e.key for _, e in items]
        return [items[r.start : r.stop] for r in plan_shards(keys, [self.sizes[k] for k in keys], target)]


def open_source(ref: str, split: str | None) -> ExportSource:
    """The version ``ref`` (PATH[@VERSION]) and the samples of each exported split."""
    catalog, vid = open_ref(ref)
    m = catalog.manifest(vid)
    table = catalog.index(vid, [*LOCATOR_COLUMNS, "bytes"])
    by_shard = entries_by_shard(table)
    sizes = dict(zip(table.column("key").to_pylist(), table.column("bytes").to_pylist()))
    for shard in by_shard.values():
        shard.sort(key=lambda e: e.key)
    if split is None:
        assigned = None
        wanted = [WHOLE]
        split_hash = None
    else:
        name, slash, only = split.partition("/")
        if slash and not only:
            raise UsageError(f"split {split!r}: use NAME or NAME/SPLIT, e.g. main or main/train")
        sset = open_split_set(catalog, vid, name)
        wanted = [only] if only else list(sset.splits)
        assigned = sset.key_assignment(sizes, only=only or None)  # (keys proven the version's, in one split)
        split_hash = sset.hash
    splits = []
    for s in wanted:
        parts = []
        for rec in m.shards:
            entries = by_shard.get(rec.path, [])
            mine = tuple(e for e in entries if assigned is None or assigned.get(e.key) == s)
            if mine:
                parts.append(
                    ShardPart(rec, mine, tuple(e for e in entries if assigned is not None and assigned.get(e.key) != s))
                )
        splits.append(Split(s, tuple(parts)))
    return ExportSource(catalog, vid, m, split, split_hash, tuple(splits), sizes)


def proven_members(
    catalog: Catalog, shard_format: str, items: list[tuple[ShardRecord, Entry]]
) -> Iterator[tuple[Entry, Members]]:
    """Each sample of ``items`` (in their order) as its canonical members, proven against its sample
    hash: an export never ships bytes the version does not vouch for."""
    fmt = get_format(shard_format)
    reader: ShardReader | None = None
    current = None
    try:
        for rec, e in items:
            if reader is None or rec is not current:
                if reader is not None:
                    reader.close()
                reader, current = fmt.reader(catalog.shard_file(rec, proven=True)), rec
            try:
                members = reader.members(e)
            except FormatError as err:
                raise CorruptDataError(f"{rec.path}: {err}", hint=HEAL) from None
            if members_sha256(members) != e.sha256:
                raise CorruptDataError(f"{rec.path}: {e.key} does not match its sample hash", hint=HEAL)
            yield e, members
    finally:
        if reader is not None:
            reader.close()
