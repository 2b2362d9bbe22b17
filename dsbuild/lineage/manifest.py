"""The manifest: the one record that defines a version. Its sha256 is the version id.

It holds no timestamps and no host paths, so the same captures and config give the same bytes (and the
same version id) anywhere. The per-sample index lives beside it in Parquet, pinned by its sha256.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dsbuild.errors import FormatError
from dsbuild.formats.safejson import loads_bounded, pretty_json
from dsbuild.lineage.hashing import sha256_bytes

MANIFEST_FORMAT = "dsbuild.manifest/1"
MAX_MANIFEST_BYTES = 1 << 30


@dataclass(frozen=True)
class ShardRecord:
    path: str  # relative to the catalog root: shards/ab/<sha256>.<ext>
    sha256: str
    bytes: int
    samples: int
    session: str


@dataclass(frozen=True)
class Manifest:
    tool_version: str
    config: dict
    config_hash: str
    shard_format: str
    sources: tuple[dict, ...]
    shards: tuple[ShardRecord, ...]
    sessions: tuple[dict, ...]
    quarantined: tuple[dict, ...]
    index: dict
    schema: dict
    vocabulary: dict
    stats: dict
    content_id: str
    format: str = MANIFEST_FORMAT

    def to_bytes(self) -> bytes:
        doc = asdict(self)
        doc["shards"] = [asdict(s) for s in self.shards]
        return pretty_json(doc)

    @property
    def version_id(self) -> str:
        return sha256_bytes(self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes, what: str) -> "Manifest":
        doc = loads_bounded(data, max_bytes=MAX_MANIFEST_BYTES, what=what)
        if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
            raise FormatError(f"{what}: not a {MANIFEST_FORMAT} manifest")
        try:
            shards = tuple(ShardRecord(**s) for s in doc["shards"])
            fields = {k: doc[k] for k in cls.__dataclass_fields__ if k != "shards"}
        except (KeyError, TypeError) as e:
            raise FormatError(f"{what}: malformed manifest ({e})") from None
        for s in shards:
            if not _safe_rel(s.path) or not isinstance(s.sha256, str) or len(s.sha256) != 64:
                raise FormatError(f"{what}: shard path {s.path!r} is not inside the catalog")
        for key in ("sources", "sessions", "quarantined"):
            fields[key] = tuple(fields[key])
        return cls(shards=shards, **fields)


def _safe_rel(path: object) -> bool:
    return (isinstance(path, str) and path.startswith("shards/") and ".." not in path.split("/")
            and "\\" not in path and "\0" not in path)


def content_id(sample_hashes: list[tuple[str, str]]) -> str:
    """Layout-independent id: hash over the sorted (key, sample hash) pairs."""
    lines = "".join(f"{k} {h}\n" for k, h in sorted(sample_hashes))
    return sha256_bytes(lines.encode())
