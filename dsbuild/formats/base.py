"""The one interface every shard format implements, and the registry that finds them by name.

A format turns a sample's canonical members into a *segment* (position-independent bytes that a
worker produces on its own), writes a shard from a run of segments, and reads samples back through a
``ShardReader``. Nobody outside ``dsbuild.formats`` branches on a format name: convert, verify,
validate, the loader and export all ask ``get_format(name)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from dsbuild.core.errors import FormatError
from dsbuild.formats.sample import ARRAY_MEMBERS, Sample, members_sha256, sample_from_members

Members = list[tuple[str, bytes]]
# Payloads that may be read-only views into one read: what ``encode`` and the member hashes accept.
MemberViews = list[tuple[str, bytes | memoryview]]


class ByteSink(Protocol):
    """Where a shard is written: a binary file, or a wrapper that hashes what passes to one."""

    def write(self, data: bytes, /) -> int: ...


@dataclass(frozen=True, slots=True)
class Entry:
    """Where one sample lives in its shard. Tar-like formats give a byte range and the payload size of
    each canonical member (so readers slice instead of parsing headers); row formats give a row group
    and row. Fields a format does not use are None."""

    key: str
    sha256: str
    offset: int | None = None
    length: int | None = None
    row_group: int | None = None
    row: int | None = None
    member_bytes: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Segment:
    """One encoded sample as a worker made it: its key, sample hash, the format's bytes for it and the
    payload size of each canonical member."""

    key: str
    sha256: str
    data: bytes
    member_bytes: tuple[int, ...]


class ShardReader(ABC):
    """Reads samples out of one shard file. ``path`` is local (remote shards come through the cache)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @abstractmethod
    def members(self, entry: Entry) -> Members:
        """The sample's canonical members, framing checked (FormatError when the entry or bytes are wrong)."""

    def member_views(self, entry: Entry) -> Members:
        """``members``, whose payloads may be read-only views into one read instead of a copy each (a 10 MB
        clip is not copied again): for callers that look at the bytes and let them go."""
        return self.members(entry)

    def array_members(self, entries: Sequence[Entry]) -> Iterator[tuple[Entry, MemberViews | FormatError]]:
        """Each entry's ARRAY_MEMBERS as (ext, payload), in that order, or the FormatError that keeps its
        sample from being framed: what the array check reads (``formats.shards.array_problems``). The
        payloads are ``member_views``' own; a format that stores arrays apart from the rest of a sample
        (Parquet's columns) reads only them, never the clip."""
        for e in entries:
            try:
                members = dict(self.member_views(e))
            except FormatError as err:
                yield e, err
                continue
            yield e, [(ext, members.get(ext, b"")) for ext in ARRAY_MEMBERS]

    def read(self, entry: Entry) -> Sample:
        """The typed sample at ``entry``."""
        return sample_from_members(entry.key, dict(self.members(entry)))

    def verified_segment(self, entry: Entry, fmt: ShardFormat) -> Segment:
        """The sample as a segment for a new shard, proven against its sample hash first (an older
        shard's bytes are reused only if they are still exactly what was hashed)."""
        members = self.members(entry)
        if members_sha256(members) != entry.sha256:
            raise FormatError(f"{entry.key}: bytes in {self.path.name} no longer match the sample hash (damaged shard)")
        return fmt.encode(entry.key, entry.sha256, members)

    @abstractmethod
    def check(self, entry: Entry, size: int) -> None:
        """Prove, cheaply, that ``entry`` frames exactly its own sample in a shard of ``size`` bytes;
        FormatError otherwise. The shard's bytes are already proven by its sha256."""

    def check_all(self, entries: list[Entry], size: int) -> list[tuple[str, str]]:
        """(key, what is wrong) for every entry of this shard that does not frame its own sample."""
        out = []
        for e in entries:
            try:
                self.check(e, size)
            except FormatError as err:
                out.append((e.key, str(err)))
        return out

    @abstractmethod
    def scan(self, keys: set[str]) -> list[tuple[str, str]]:
        """(item, what is wrong) for everything in the shard that no listed key owns or that a loader
        must never see (links, paths, pickle-like members, unknown columns)."""

    def close(self) -> None:  # noqa: B027 (a reader that holds nothing open need not override it)
        """Release the file (readers may hold it open between calls)."""

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ShardFormat(ABC):
    name: ClassVar[str]
    ext: ClassVar[str]  # shard file extension
    max_overhead: ClassVar[int] = 0  # bytes a shard adds beyond its samples' planned sizes, at most

    def planned_size(self, member_bytes: tuple[int, ...]) -> int:
        """What a sample with these member sizes occupies in a shard (what shard planning weighs)."""
        return sum(member_bytes)

    def payload_offsets(self, member_bytes):
        """For formats whose samples are byte ranges holding each member verbatim: where each payload
        starts inside its sample's range, for an int array of member sizes [samples, members] (so the
        loader slices instead of parsing). None: read samples through ``ShardReader.members``."""
        return None

    @abstractmethod
    def encode(self, key: str, sha256: str, members: Sequence[tuple[str, bytes | memoryview]]) -> Segment:
        """A sample's segment: bytes that do not depend on where the sample lands in a shard."""

    @abstractmethod
    def write(self, segments: Iterable[Segment], out: ByteSink) -> list[Entry]:
        """Write one complete shard from ``segments`` (in order) to ``out``; return their entries."""

    @abstractmethod
    def reader(self, path: Path) -> ShardReader:
        """A reader over the shard file at ``path``."""


_REGISTRY: dict[str, ShardFormat] = {}


def register_format(fmt: ShardFormat) -> ShardFormat:
    """Make a format available by name (the built-in ones register on import of ``dsbuild.formats``)."""
    if not getattr(fmt, "name", None) or not getattr(fmt, "ext", None):
        raise ValueError("a shard format needs a name and a file extension")
    _REGISTRY[fmt.name] = fmt
    return fmt


def get_format(name: str) -> ShardFormat:
    fmt = _REGISTRY.get(name)
    if fmt is None:
        raise FormatError(f"unknown shard format {str(name)[:40]!r}; known: {', '.join(sorted(_REGISTRY))}")
    return fmt


def format_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))
