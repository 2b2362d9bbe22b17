"""The manifest: the one record that defines a version. Its sha256 is the version id.

It holds no timestamps and no host paths, so the same captures and config give the same bytes (and the
same version id) anywhere. What grows with the data lives beside it, pinned by sha256: the per-sample
index (Parquet) and the per-session records (``sessions.json``). The manifest itself stays a few kB
however many sessions a version holds, so commands that need only its summary, shards or index pin
(`info`, `query`, `diff`, `verify`) never parse per-session records.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

from dsbuild.core.errors import FormatError
from dsbuild.core.hashing import FileProof, sha256_bytes
from dsbuild.core.jsonio import canonical_json, loads_bounded, pretty_json
from dsbuild.core.records import SHA256, JsonValue, Record, spec

MANIFEST_FORMAT = "dsbuild.manifest/3"
MAX_MANIFEST_BYTES = 64 << 20
SESSIONS_FILE = "sessions.json"
MAX_SESSIONS_BYTES = 1 << 30
SHARD_KEY = r"shards/([0-9a-f]{2})/([0-9a-f]{64})\.([a-z0-9]{1,16})"
_SHARD_KEY_RE = re.compile(SHARD_KEY)


def shard_key(sha256: str, ext: str) -> str:
    """Where a shard lives in every catalog: named by its own hash, so versions share it."""
    return f"shards/{sha256[:2]}/{sha256}.{ext}"


@dataclass(frozen=True, slots=True)
class ShardRecord(Record):
    """One shard of a version: named by the sha256 of its bytes, proven by their BLAKE3."""

    path: str = field(metadata=spec(pattern=SHARD_KEY, doc="shards/<sha[:2]>/<sha256>.<ext>, in the catalog"))
    sha256: str = field(metadata=spec(pattern=SHA256))
    bytes: int = field(metadata=spec(minimum=0))
    samples: int = field(metadata=spec(minimum=0))
    blake3: str | None = field(
        default=None,
        metadata=spec(
            pattern=SHA256,
            doc="BLAKE3 of the same bytes, what checks prove them with; absent before it was recorded",
            absent_when_none=True,
        ),
    )

    def proof(self, *, named: bool = False) -> FileProof:
        """What proves the shard's bytes; ``named``: its name (sha256) too, for bytes stored under it."""
        return FileProof(self.sha256, self.blake3, named=named)

    def name_matches_hash(self) -> bool:
        m = _SHARD_KEY_RE.fullmatch(self.path)
        return m is not None and m.group(2) == self.sha256 and m.group(1) == self.sha256[:2]

    def check_fields(self, what: str) -> None:
        if not self.name_matches_hash():
            raise FormatError(f"{what}: shard {self.path[:120]!r} is not named by its own sha256")


@dataclass(frozen=True, slots=True)
class SourceRecord(Record):
    """One source file of a session, by hash: what every sample of the session came from."""

    session: str
    role: str  # session, video, actions, telemetry, text
    path: str  # relative to the capture root (never a host path)
    sha256: str = field(metadata=spec(pattern=SHA256))
    bytes: int = field(metadata=spec(minimum=0))


@dataclass(frozen=True, slots=True)
class SessionRecord(Record):
    session_id: str
    path: str  # the session folder, relative to the capture root
    samples: int = field(metadata=spec(minimum=0))
    controls: tuple[str, ...]
    telemetry: tuple[str, ...]
    repairs: JsonValue  # per stream and the video: what was dropped, sorted or resolved, with counts


@dataclass(frozen=True, slots=True)
class Quarantined(Record):
    """A session left out of the version, and exactly why (file, what was wrong)."""

    session: str
    path: str
    reason: str


class SessionsFile(Record):
    """The records of ``versions/<id>/sessions.json``, in full (``SessionTable``) or as the loader reads
    them (``SessionColumnsTable``)."""

    __slots__ = ()
    FORMAT = "dsbuild.sessions/1"
    if TYPE_CHECKING:  # (what each kind holds, as it reads them)
        sessions: tuple[Any, ...]

    @classmethod
    def from_bytes(cls, data: bytes, what: str) -> Self:
        return cls.from_json(loads_bounded(data, max_bytes=MAX_SESSIONS_BYTES, what=what, max_depth=None), what)


@dataclass(frozen=True, slots=True)
class SessionTable(SessionsFile):
    """Every session of a version and the source files it came from (``versions/<id>/sessions.json``)."""

    sessions: tuple[SessionRecord, ...]
    sources: tuple[SourceRecord, ...]

    def to_bytes(self) -> bytes:
        return canonical_json(self.to_json())

    def sources_of(self, session: str) -> list[SourceRecord]:
        return [s for s in self.sources if s.session == session]


@dataclass(frozen=True, slots=True)
class SessionColumns(Record):
    """A session record as the loader reads it: its id and the names of its array columns, checked as
    ``SessionRecord`` checks them; its source files and repair counts are left unread (on a version of
    10,000 sessions they were most of the loader's start)."""

    PARTIAL = True
    session_id: str
    controls: tuple[str, ...]
    telemetry: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SessionColumnsTable(SessionsFile):
    """``sessions.json`` as the loader reads it (``SessionColumns``)."""

    PARTIAL = True
    sessions: tuple[SessionColumns, ...]


@dataclass(frozen=True, slots=True)
class FilePin(Record):
    """A file beside the manifest, pinned by its sha256 (so the version id covers its bytes)."""

    path: str = field(metadata=spec(pattern=r"[a-z_]+\.(parquet|json)"))
    sha256: str = field(metadata=spec(pattern=SHA256))
    rows: int = field(metadata=spec(minimum=0))
    bytes: int = field(metadata=spec(minimum=0))


@dataclass(frozen=True, slots=True)
class Vocabulary(Record):
    """Every control and telemetry channel of the version (each sample names its own subset)."""

    controls: tuple[str, ...]
    telemetry: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Stats(Record):
    samples: int
    shards: int
    bytes: int
    frames: int
    hours: float
    sessions: int
    quarantined: int
    long_clips: int
    repaired_sessions: int
    samples_per_title: dict[str, int]


@dataclass(frozen=True, slots=True)
class Manifest(Record):
    FORMAT = MANIFEST_FORMAT
    tool_version: str
    config: JsonValue  # the build options, as hashed into config_hash
    config_hash: str = field(metadata=spec(pattern=SHA256))
    shard_format: str
    shards: tuple[ShardRecord, ...]
    quarantined: tuple[Quarantined, ...]
    index: FilePin  # index.parquet: rows = samples
    sessions: FilePin  # sessions.json (a SessionTable): rows = sessions
    schema: JsonValue  # sample format, members, index columns
    vocabulary: Vocabulary
    stats: Stats
    content_id: str = field(metadata=spec(pattern=SHA256))

    def to_bytes(self) -> bytes:
        return pretty_json(self.to_json())

    @property
    def version_id(self) -> str:
        return sha256_bytes(self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes, what: str) -> Manifest:
        return cls.from_json(loads_bounded(data, max_bytes=MAX_MANIFEST_BYTES, what=what, max_depth=None), what)


def content_id(sample_hashes: list[tuple[str, str]]) -> str:
    """Layout-independent id: hash over the sorted (key, sample hash) pairs."""
    lines = "".join(f"{k} {h}\n" for k, h in sorted(sample_hashes))
    return sha256_bytes(lines.encode())
