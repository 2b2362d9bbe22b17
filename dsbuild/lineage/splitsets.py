"""Split sets in the catalog: immutable folders named by their hash, and a pointer per name.

    splits/<version_id>/<NAME>.json                 {"format": "dsbuild.splitref/1", "hash": H}
    splits/<version_id>/<NAME>/<H>/manifest.json    the split manifest (its own hash is H)
    splits/<version_id>/<NAME>/<H>/<split>.parquet  one row per sample, sorted by key

A reader resolves the pointer once and then reads only the immutable folder it names, so replacing a
split set (``--force``) is atomic for readers: the new folder is written completely, then the pointer
is swapped in one write; a reader never sees a new Parquet file beside an old manifest, and there is
no moment without a split set. Old folders are removed by ``gc``.

The manifest's ``hash`` is the sha256 of its canonical JSON without the ``hash`` field; it covers the
parameters, the counts and every split file's sha256, so equal hashes mean equal split sets.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from dsbuild.core.errors import FormatError, LineageError, UsageError
from dsbuild.core.hashing import hashes_to, sha256_bytes, sha256_json
from dsbuild.core.jsonio import loads_bounded, pretty_json
from dsbuild.core.records import SHA256, Record, spec
from dsbuild.core.store import parses
from dsbuild.lineage.catalog import Catalog, check_version_id

SPLIT_FORMAT = "dsbuild.split/2"
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 28
MAX_SPLIT_FILE = 4 << 30
NAME_PATTERN = r"[A-Za-z][A-Za-z0-9_-]{0,63}"
NAME_RE = re.compile(NAME_PATTERN)


@dataclass(frozen=True, slots=True)
class SplitPointer(Record):
    FORMAT = "dsbuild.splitref/1"
    hash: str = field(metadata=spec(pattern=SHA256))


@dataclass(frozen=True, slots=True)
class Pin(Record):
    """A frozen split: exactly these group values."""

    groups: tuple[str, ...]
    count: int = field(metadata=spec(minimum=0))
    sha256: str = field(metadata=spec(pattern=SHA256))


@dataclass(frozen=True, slots=True)
class SplitSource(Record):
    """The split set assignments were carried from (``--from-split``)."""

    version_id: str = field(metadata=spec(pattern=SHA256))
    name: str = field(metadata=spec(pattern=NAME_PATTERN))
    hash: str = field(metadata=spec(pattern=SHA256))


@dataclass(frozen=True, slots=True)
class SplitRule(Record):
    """The complete rule of a split set (``split.params.SplitParams`` in its JSON form)."""

    rule: str
    by: str
    ratios: dict[str, float]
    salt: str
    stratify: str | None
    pins: dict[str, Pin]
    from_split: SplitSource | None = None


@dataclass(frozen=True, slots=True)
class SplitEntry(Record):
    """One split: its file, and the shares it realised (None where a pinned split has no target)."""

    file: str
    sha256: str = field(metadata=spec(pattern=SHA256))
    bytes: int = field(metadata=spec(minimum=0))
    keys_sha256: str = field(metadata=spec(pattern=SHA256))
    pinned: bool
    groups: int = field(metadata=spec(minimum=0))
    samples: int = field(metadata=spec(minimum=0))
    requested: float | None
    target: float | None
    ratio_groups: float
    ratio_samples: float
    expected_std_groups: float | None
    deviation_std: float | None


@dataclass(frozen=True, slots=True)
class SplitTotals(Record):
    sessions: int
    samples: int
    groups: int
    hashed_groups: int
    assigned_samples: int


@dataclass(frozen=True, slots=True)
class Unassigned(Record):
    """Sessions without the grouping field: never put in a split (never trained on by accident)."""

    field: str
    sessions: tuple[str, ...]
    samples: int


@dataclass(frozen=True, slots=True)
class Stratum(Record):
    groups: int
    per_split: dict[str, int]
    missing: tuple[str, ...]  # splits without a group of this stratum after repair
    repaired: tuple[str, ...]  # groups moved to cover a split


@dataclass(frozen=True, slots=True)
class Stratification(Record):
    field: str
    multi_stratum_groups: int
    uncovered: tuple[str, ...]
    repaired: dict[str, tuple[str, ...]]  # group -> (threshold split, repaired split)
    strata: dict[str, Stratum]


@dataclass(frozen=True, slots=True)
class Carried(Record):
    source: str  # "<version id>/<name>" the assignments came from
    carried_groups: int
    new_groups: dict[str, str]  # group -> split
    removed_groups: tuple[str, ...]
    reassigned_groups: dict[str, tuple[str, ...]]  # group -> (old split, new split)
    differs_from_rule: int  # carried groups the rule alone would now put elsewhere


@dataclass(frozen=True, slots=True)
class SplitManifest(Record):
    """``manifest.json`` of a split set. ``hash`` is the sha256 of its canonical JSON without ``hash``:
    it covers the rule, the counts and every split file's sha256, so equal hashes mean equal sets."""

    FORMAT = SPLIT_FORMAT
    tool_version: str
    name: str = field(metadata=spec(pattern=NAME_PATTERN))
    version_id: str = field(metadata=spec(pattern=SHA256))
    version_content_id: str = field(metadata=spec(pattern=SHA256))
    parameters: SplitRule
    splits: dict[str, SplitEntry]
    totals: SplitTotals
    unassigned: Unassigned
    stratification: Stratification | None
    carried: Carried | None
    assignment_id: str = field(metadata=spec(pattern=SHA256))
    warnings: tuple[str, ...]
    hash: str = ""

    def computed_hash(self) -> str:
        doc = self.to_json()
        doc.pop("hash")
        return sha256_json(doc)

    def sealed(self) -> SplitManifest:
        return replace(self, hash=self.computed_hash())


def _check_manifest(doc: object, what: str) -> SplitManifest:
    m = SplitManifest.from_json(doc, what)
    if m.hash != m.computed_hash():
        raise FormatError(f"{what}: hash field does not match the manifest's content; it was edited or damaged")
    for split, rec in m.splits.items():
        if not NAME_RE.fullmatch(split) or rec.file != f"{split}.parquet":
            raise FormatError(f"{what}: split {split[:40]!r} names file {rec.file[:60]!r}")
    return m


@dataclass(frozen=True)
class SplitSet:
    """A split set as stored; reading a split proves its file against the manifest."""

    catalog: Catalog
    folder: str  # key prefix of the immutable folder
    manifest: SplitManifest

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def version_id(self) -> str:
        return self.manifest.version_id

    @property
    def hash(self) -> str:
        return self.manifest.hash

    @property
    def path(self) -> str:
        return f"{self.catalog.url}/{self.folder}"

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(sorted(self.manifest.splits))

    def file_bytes(self, split: str) -> bytes:
        if split not in self.manifest.splits:
            import difflib

            close = difflib.get_close_matches(split, self.splits, n=1)
            raise UsageError(
                f"split set {self.name!r} has no split {split[:40]!r}"
                + (f"; did you mean {close[0]!r}?" if close else "")
                + f" (it has {', '.join(self.splits)})"
            )
        rec = self.manifest.splits[split]
        key = f"{self.folder}/{rec.file}"
        try:
            # (no further than its recorded size: a file replaced by a larger one is refused unread)
            data = _read(self.catalog, key, min(MAX_SPLIT_FILE, rec.bytes), proven=hashes_to(rec.sha256, rec.bytes))
        except FileNotFoundError:
            raise LineageError(f"{self.catalog.url}/{key}: missing") from None
        if len(data) != rec.bytes or sha256_bytes(data) != rec.sha256:
            raise LineageError(f"{self.catalog.url}/{key}: does not match the sha256 in its split manifest")
        return data

    def table(self, split: str, columns: list[str] | None = None):
        import pyarrow as pa
        import pyarrow.parquet as pq

        # in this thread, like the index (lineage.index.table_from_bytes says why)
        return pq.ParquetFile(pa.BufferReader(self.file_bytes(split))).read(columns=columns, use_threads=False)

    def key_assignment(self, version_keys: Iterable[str], only: str | None = None) -> dict[str, str]:
        """sample key -> split (of split ``only``, or of every split), each key proven to be a sample of the
        version (``version_keys``: its index's keys) and to lie in one split of the set: a split file
        naming a key the version lacks, or a key two splits share, is a damaged split set (LineageError
        naming the first keys and how many), never a key dropped or put in one of them silently."""
        out: dict[str, str] = {}
        twice: list[str] = []
        for split in self.splits:
            for key in self.table(split, ["key"])["key"].to_pylist():
                if out.setdefault(key, split) != split:
                    twice.append(key)
        lacking = sorted(set(out) - set(version_keys))
        for keys, what in ((sorted(set(twice)), "lie in two splits"), (lacking, "are not samples of the version")):
            if keys:
                shown = ", ".join(repr(k[:80]) for k in keys[:3])
                raise LineageError(
                    f"{self.path}: {len(keys)} key(s) {what} ({shown}{', ...' if len(keys) > 3 else ''})",
                    hint="the split set is damaged or forged: make it again with `dsbuild split`",
                )
        if only is not None:
            self.file_bytes(only)  # (a split the set lacks is refused, naming the closest one)
            return {k: s for k, s in out.items() if s == only}
        return out

    def group_assignment(self) -> dict[str, str]:
        """group value -> split, read from the files."""
        out: dict[str, str] = {}
        for split in self.splits:
            for g in self.table(split, ["group_value"])["group_value"].unique().to_pylist():
                out[g] = split
        return dict(sorted(out.items()))

    def summary(self) -> dict:
        m = self.manifest
        return {
            "name": self.name,
            "version_id": self.version_id,
            "hash": self.hash,
            "path": self.path,
            "parameters": m.parameters.to_json(),
            "splits": {
                s: {
                    "groups": r.groups,
                    "samples": r.samples,
                    "ratio_groups": r.ratio_groups,
                    "ratio_samples": r.ratio_samples,
                }
                for s, r in sorted(m.splits.items())
            },
        }


def _pointer_key(version_id: str, name: str) -> str:
    return f"splits/{check_version_id(version_id)}/{name}.json"


def _read(catalog: Catalog, key: str, cap: int, **kw) -> bytes:
    """A split set file's bytes; one the store refuses to read (a FIFO, a symlink out of the catalog, over
    ``cap``) is a damaged catalog (LineageError, exit 3), as a file that does not parse is."""
    try:
        return catalog.store.read(key, cap, **kw)
    except FormatError as e:
        why = str(e).removeprefix(f"{catalog.url}/{key}: ").removeprefix(f"{key}: ")
        raise LineageError(
            f"{catalog.url}/{key}: damaged split set file ({why[:200]})",
            hint="make the split set again with `dsbuild split ... --force`",
        ) from None


def _read_pointer(catalog: Catalog, version_id: str, name: str) -> str | None:
    key = _pointer_key(version_id, name)
    try:
        data = _read(catalog, key, 1 << 16)
    except FileNotFoundError:
        return None
    try:
        return SplitPointer.from_json(loads_bounded(data, max_bytes=1 << 16, what=key), f"{catalog.url}/{key}").hash
    except FormatError as e:  # a damaged catalog (exit 3), not the user's input
        why = str(e).removeprefix(f"{catalog.url}/{key}: ").removeprefix(f"{key}: ")
        raise LineageError(
            f"{catalog.url}/{key}: damaged split set pointer ({why[:200]})",
            hint=f"make the split set again with `dsbuild split ... --name {name} --force`",
        ) from None


def _load(catalog: Catalog, version_id: str, name: str, digest: str) -> SplitSet:
    folder = f"splits/{version_id}/{name}/{digest}"
    key = f"{folder}/{MANIFEST}"

    def parse(data: bytes) -> SplitManifest:
        m = _check_manifest(loads_bounded(data, max_bytes=MAX_MANIFEST_BYTES, what=key), f"{catalog.url}/{key}")
        if m.hash != digest or m.name != name or m.version_id != version_id:
            raise FormatError(
                f"{catalog.url}/{key}: describes {m.version_id[:12]}/{m.name} hash {m.hash[:12]}, "
                "not the folder it is in"
            )
        return m

    try:
        data = _read(catalog, key, MAX_MANIFEST_BYTES, proven=parses(parse))
    except FileNotFoundError:
        raise LineageError(f"{catalog.url}/{key}: missing (the split set's pointer names it)") from None
    try:
        return SplitSet(catalog, folder, parse(data))
    except FormatError as e:
        raise LineageError(str(e)) from None


def open_split_set(catalog: Catalog, version_id: str, name: str) -> SplitSet:
    if not NAME_RE.fullmatch(name):
        raise UsageError(f"split set name {name[:64]!r}: use a letter then letters, digits, '_' or '-'")
    digest = _read_pointer(catalog, version_id, name)
    if digest is None:
        have = split_set_names(catalog, version_id)
        import difflib

        close = difflib.get_close_matches(name, have, n=1)
        raise UsageError(
            f"{catalog.url}: version {version_id[:12]} has no split set {name!r}"
            + (f"; did you mean {close[0]!r}?" if close else "")
            + (f" (it has {', '.join(have)})" if have else ""),
            hint=None if have else "make one with `dsbuild split`",
        )
    return _load(catalog, version_id, name, digest)


def split_set_names(catalog: Catalog, version_id: str) -> list[str]:
    """The names of a version's split sets (each has a pointer file), sorted."""
    out = []
    for key in catalog.store.list(f"splits/{check_version_id(version_id)}"):
        parts = key.split("/")
        if len(parts) == 3 and parts[2].endswith(".json") and NAME_RE.fullmatch(parts[2][:-5]):
            out.append(parts[2][:-5])
    return sorted(out)


def list_split_sets(catalog: Catalog, version_id: str) -> list[SplitSet]:
    """The split sets of a version, sorted by name."""
    return [open_split_set(catalog, version_id, name) for name in split_set_names(catalog, version_id)]


def split_set_summaries(catalog: Catalog, version_id: str) -> list[dict]:
    """Each split set's ``summary()``; a damaged one as its name and what is wrong (``log`` and ``info``
    still list the version)."""
    out = []
    for name in split_set_names(catalog, version_id):
        try:
            out.append(open_split_set(catalog, version_id, name).summary())
        except (LineageError, FormatError) as e:
            out.append({"name": name, "damaged": str(e)})
    return out


def publish_split_set(
    catalog: Catalog,
    version_id: str,
    name: str,
    files: dict[str, bytes],
    manifest: SplitManifest,
    *,
    force: bool = False,
) -> str:
    """Store a sealed split set. Returns "created", "existed" (identical: nothing written) or "replaced"
    (``force``); refuses to replace a different split set of the same name without ``force``."""
    _check_manifest(manifest.to_json(), f"split set {name}")
    digest = manifest.hash
    with catalog.lock():  # serialised with commits, tags and gc of a local catalog
        try:
            old = _read_pointer(catalog, version_id, name)
        except LineageError:  # a damaged pointer: --force replaces it (its hint says so)
            if not force:
                raise
            old = "damaged"
        if old == digest:
            return "existed"
        if old is not None and not force:
            raise UsageError(
                f"{catalog.url}: a different split set named {name!r} exists for version "
                f"{version_id[:12]} (hash {old[:12]}, new {digest[:12]})",
                hint="use --force to replace it, or choose another --name",
            )
        folder = f"splits/{version_id}/{name}/{digest}"
        for fname, data in sorted(files.items()):
            catalog._write(f"{folder}/{fname}", data)
        catalog._write(f"{folder}/{MANIFEST}", pretty_json(manifest.to_json()))
        catalog._write(_pointer_key(version_id, name), pretty_json(SplitPointer(digest).to_json()))
    return "created" if old is None else "replaced"


def unreferenced_split_folders(catalog: Catalog, *, now: float, grace: float) -> tuple[list[str], list[str]]:
    """(keys of split set folders no pointer names any more (replaced sets), for ``gc``; pointers that
    cannot be read). A name whose pointer cannot be read keeps every folder: which one is live is
    unknown, and the only copy of a split set is not garbage. On an object store (no locks) a file
    younger than ``grace`` seconds at ``now`` is kept too: ``make_split`` writes a folder before the
    pointer that names it."""
    keys = catalog.store.list("splits")
    pointed, unreadable = set(), []
    for key in keys:
        parts = key.split("/")
        if len(parts) == 3 and parts[2].endswith(".json"):
            name = parts[2][:-5]
            try:
                pointed.add(f"splits/{parts[1]}/{name}/{_read_pointer(catalog, parts[1], name)}")
            except (FormatError, LineageError, UsageError):
                unreadable.append(key)
                pointed.add(f"splits/{parts[1]}/{name}")  # the name's folders, whichever is live
    out = []
    for k in keys:
        parts = k.split("/")
        if len(parts) != 5 or "/".join(parts[:4]) in pointed or "/".join(parts[:3]) in pointed:
            continue
        if catalog.root is None:
            stamp = catalog.store.modified(k)
            if stamp is None or now - stamp < grace:
                continue
        out.append(k)
    return out, unreadable
