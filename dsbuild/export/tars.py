"""WebDataset tar files for the tools that read tars (Energon, wids, DALI), shared with the catalog where they can be.

Each split gets tars holding its samples alone: these tools read (and count, and partition over ranks)
every sample of a listed tar. A shard of a tar version that holds only the split's samples is linked (a
relative symlink into the catalog: no byte copied). Every other sample — those of a version in another
shard format, or of a shard shared by several splits — is written into new tars by the tar format's own
writer (samples proven against their hash on the way), named by their sha256 so basenames are unique
(wids caches shards by basename).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from dsbuild.core.errors import CorruptDataError, StorageError
from dsbuild.export.folder import ExportFolder
from dsbuild.export.report import Ticker
from dsbuild.export.source import HEAL, ExportSource, Split
from dsbuild.formats import Entry, get_format
from dsbuild.formats.shards import write_shard
from dsbuild.lineage.manifest import ShardRecord

TAR_FORMAT = "webdataset"  # what Energon, wids and the webdataset library read


@dataclass(frozen=True)
class TarFile:
    """One tar in the export: its path there and every sample it holds (all of its split), in file order."""

    rel: str
    samples: tuple[Entry, ...]


def framed(e: Entry) -> tuple[int, int, tuple[int, ...]]:
    """A tar sample's byte offset, length and member sizes (a tar version's index records all three)."""
    if e.offset is None or e.length is None or e.member_bytes is None:
        raise CorruptDataError(f"{e.key}: the index gives no byte range for a tar sample", hint=HEAL)
    return e.offset, e.length, e.member_bytes


def split_tars(source: ExportSource, split: Split, folder: ExportFolder, tick: Ticker, *, target: int) -> list[TarFile]:
    """The tars holding ``split`` and nothing else, in key order (an index-based reader's sample i is the
    split's i-th): catalog shards linked where whole, the samples between them written into tars of their own."""
    tar = get_format(TAR_FORMAT)
    linkable = get_format(source.manifest.shard_format) is tar
    out: list[TarFile] = []
    rest: list[tuple[ShardRecord, Entry]] = []
    written = 0

    def flush() -> None:  # the samples since the last linked shard, written in order
        nonlocal written
        for group in source.chunks(rest, target):
            segments = (tar.encode(e.key, e.sha256, members) for e, members in source.members(group))
            w = write_shard(tar, segments, folder.temp(f"{split.name}-{written:06d}.{tar.ext}"))
            rel = f"shards/{split.name}/{w.sha256}.{tar.ext}"
            folder.adopt(rel, w.tmp_path)
            out.append(TarFile(rel, w.entries))
            tick(len(group))
            written += 1
        rest.clear()

    for part in split.parts:
        if linkable and part.whole:
            flush()
            rel = f"shards/{split.name}/{part.shard.sha256}.{tar.ext}"
            if not folder.has(rel):
                _share(source, part.shard, folder, rel)
            out.append(TarFile(rel, tuple(sorted(part.entries, key=lambda e: framed(e)[0]))))
            tick(len(part.entries))
        else:
            rest += [(part.shard, e) for e in part.entries]
    flush()
    return out


def _share(source: ExportSource, shard, folder: ExportFolder, rel: str) -> None:
    """Link a local catalog's shard; copy one from an object store (through the verified cache)."""
    root = source.catalog.root
    if root is not None:
        target = root / shard.path
        try:  # a regular file inside the catalog (a symlink out of it would export another file's bytes)
            size = source.catalog.shard_file(shard).stat().st_size
        except FileNotFoundError:
            size = None
        if size != shard.bytes:  # a link to it would export damage, or point at nothing
            what = "is missing" if size is None else f"holds {size} bytes, its record says {shard.bytes}"
            raise StorageError(
                f"{target}: the shard {what}",
                hint=f"`dsbuild verify {source.catalog.url}` names the command that heals it",
            )
        folder.link(rel, target)
        return
    tmp = folder.temp(shard.sha256)
    shutil.copyfile(source.catalog.shard_file(shard, proven=True), tmp)  # (a damaged cached copy: fetched again)
    folder.adopt(rel, tmp)
