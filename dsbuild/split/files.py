"""Split sets on disk: one folder per (version, name) beside the version it describes.

    <catalog>/splits/<version_id>/<NAME>/manifest.json    format "dsbuild.split/1", sorted keys, its own hash
    <catalog>/splits/<version_id>/<NAME>/<split>.parquet  one row per sample, sorted by key (SPLIT_SCHEMA)

The manifest's ``hash`` is the sha256 of its canonical JSON without the ``hash`` field; it covers the
parameters, the counts and every split file's sha256, so equal hashes mean equal split sets. A split set
appears by one rename of a complete folder built under ``<catalog>/.tmp/``; an existing set is never
replaced by a different one unless asked (``force``), and an identical re-run changes nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dsbuild.errors import FormatError, UsageError
from dsbuild.formats.safejson import loads_bounded, pretty_json
from dsbuild.lineage.catalog import Catalog, fsync_dir, write_file_durably
from dsbuild.lineage.hashing import sha256_bytes, sha256_json
from dsbuild.lineage.index import INDEX_SCHEMA, LOCATOR_COLUMNS
from dsbuild.split.params import NAME_RE

SPLIT_FORMAT = "dsbuild.split/1"
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 30
SPLIT_SCHEMA = pa.schema([INDEX_SCHEMA.field(c) for c in LOCATOR_COLUMNS] + [
    ("session_id", pa.string()),
    ("group_value", pa.string()),  # not "group": that is an SQL keyword
    ("split", pa.string()),  # constant per file; lets one glob over all files answer per-split queries
])


def splits_dir(root: Path, version_id: str) -> Path:
    return Path(root) / "splits" / version_id


def set_dir(root: Path, version_id: str, name: str) -> Path:
    return splits_dir(root, version_id) / name


def table_bytes(table: pa.Table) -> bytes:
    """Deterministic Parquet bytes of one split (rows sorted by key)."""
    table = table.select(SPLIT_SCHEMA.names).cast(SPLIT_SCHEMA).sort_by("key")
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=1 << 17, store_schema=False)
    return sink.getvalue().to_pybytes()


def manifest_hash(doc: dict) -> str:
    return sha256_json({k: v for k, v in doc.items() if k != "hash"})


def seal(doc: dict) -> dict:
    return {**doc, "hash": manifest_hash(doc)}


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    try:
        data = path.read_bytes()
    except OSError as e:
        raise FormatError(f"{path}: cannot read the split manifest ({e.strerror})") from None
    doc = loads_bounded(data, max_bytes=MAX_MANIFEST_BYTES, what=str(path))
    if not isinstance(doc, dict) or doc.get("format") != SPLIT_FORMAT:
        raise FormatError(f"{path}: not a {SPLIT_FORMAT} split manifest")
    if doc.get("hash") != manifest_hash(doc):
        raise FormatError(f"{path}: hash field does not match the manifest's content; it was edited or damaged")
    for split, rec in doc.get("splits", {}).items():
        if not NAME_RE.fullmatch(split) or rec.get("file") != f"{split}.parquet":
            raise FormatError(f"{path}: split {split!r} names file {rec.get('file')!r}; expected {split}.parquet")
    return doc


@dataclass(frozen=True)
class SplitSet:
    """A split set as stored; reading a split verifies its file against the manifest."""

    path: Path
    manifest: dict

    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def version_id(self) -> str:
        return self.manifest["version_id"]

    @property
    def hash(self) -> str:
        return self.manifest["hash"]

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(sorted(self.manifest["splits"]))

    def file_bytes(self, split: str) -> bytes:
        if split not in self.manifest["splits"]:
            raise UsageError(f"{self.path}: no split {split!r}; have {', '.join(self.splits)}")
        rec = self.manifest["splits"][split]
        path = self.path / rec["file"]
        try:
            data = path.read_bytes()
        except OSError as e:
            raise FormatError(f"{path}: cannot read split file ({e.strerror})") from None
        if len(data) != rec["bytes"] or sha256_bytes(data) != rec["sha256"]:
            raise FormatError(f"{path}: does not match the sha256 in {self.path / MANIFEST}")
        return data

    def table(self, split: str, columns: list[str] | None = None) -> pa.Table:
        return pq.read_table(pa.BufferReader(self.file_bytes(split)), columns=columns)

    def group_assignment(self) -> dict[str, str]:
        """group value -> split, read from the files."""
        out: dict[str, str] = {}
        for split in self.splits:
            for g in self.table(split, ["group_value"])["group_value"].unique().to_pylist():
                out[g] = split
        return dict(sorted(out.items()))

    def summary(self) -> dict:
        m = self.manifest
        return {"name": self.name, "version_id": self.version_id, "hash": self.hash, "path": str(self.path),
                "parameters": m["parameters"],
                "splits": {s: {k: r[k] for k in ("groups", "samples", "ratio_groups", "ratio_samples")}
                           for s, r in sorted(m["splits"].items())}}


def open_split_set(root: Path, version_id: str, name: str) -> SplitSet:
    folder = set_dir(root, version_id, name)
    if not NAME_RE.fullmatch(name) or not (folder / MANIFEST).is_file():
        have = [s.name for s in list_split_sets(root, version_id)]
        raise UsageError(f"{root}: version {version_id[:12]} has no split set {name!r}"
                         + (f"; it has {', '.join(have)}" if have else "; make one with `dsbuild split`"))
    doc = read_manifest(folder)
    if doc.get("name") != name or doc.get("version_id") != version_id:
        raise FormatError(f"{folder / MANIFEST}: describes {doc.get('version_id')}/{doc.get('name')}, "
                          f"not the folder it is in")
    return SplitSet(folder, doc)


def list_split_sets(root: Path, version_id: str) -> list[SplitSet]:
    """The complete split sets of a version, sorted by name."""
    base = splits_dir(root, version_id)
    out = []
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        if NAME_RE.fullmatch(d.name) and (d / MANIFEST).is_file():
            out.append(SplitSet(d, read_manifest(d)))
    return out


def publish(catalog: Catalog, version_id: str, name: str, files: dict[str, bytes], manifest: dict,
            *, force: bool = False) -> str:
    """Write the split set atomically. Returns "created", "existed" (identical: nothing written) or
    "replaced" (``force``). Refuses to replace a different split set of the same name without ``force``."""
    final = set_dir(catalog.root, version_id, name)
    with catalog.build_area() as area, catalog.lock():  # serialised with commits, tags and gc
        state = "created"
        if final.exists():
            try:
                old_hash = read_manifest(final).get("hash")
            except FormatError:
                old_hash = None
            if old_hash == manifest["hash"]:
                return "existed"
            if not force:
                raise UsageError(f"{final}: a different split set named {name!r} exists for this version "
                                 f"(hash {str(old_hash)[:12]}, new {manifest['hash'][:12]}); "
                                 "use --force to replace it or choose another --name")
            state = "replaced"
        staging = area.path / "split"
        staging.mkdir()
        for fname, data in sorted(files.items()):
            write_file_durably(staging / fname, data)
        write_file_durably(staging / MANIFEST, pretty_json(manifest))  # last: a folder with it is complete
        fsync_dir(staging)
        parent = final.parent
        for d in (parent.parent, parent):  # <catalog>/splits, then <catalog>/splits/<version_id>
            if not d.is_dir():
                d.mkdir()
                fsync_dir(d.parent)
        if state == "replaced":
            os.rename(final, area.path / "replaced")  # removed with the build area
        os.rename(staging, final)
        fsync_dir(parent)
    if catalog.remote is not None:  # an object-store catalog: publish there too, manifest last
        names = sorted(files) + [MANIFEST]
        catalog.remote.push_files(catalog, [f"{final.relative_to(catalog.root).as_posix()}/{n}" for n in names])
    return state
