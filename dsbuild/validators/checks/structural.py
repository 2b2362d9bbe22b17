"""Structural checks: the version's bytes and layout, without decoding any video.

    manifest        the manifest document, its id, the index file and schema, the content id
    shard_hashes    shard size and sha256 (``lineage.verify``), naming the samples a damaged shard holds
    index           index row -> member/row consistency (``lineage.verify`` locators + metadata agreement)
    members         required members and metadata fields of every sample
    keys            key rules
    unsafe_members  links, paths, pickle-like members, members no sample owns, unknown columns
"""

from __future__ import annotations

import re
import tarfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from dsbuild.core.errors import FormatError
from dsbuild.core.jsonio import canonical_json
from dsbuild.formats.sample import (
    ARRAY_MEMBERS,
    EVENTS_MEMBER,
    KEY_RE,
    SAMPLE_FORMAT,
    VIDEO_EXTS,
    sample_key,
)
from dsbuild.lineage.catalog import Catalog
from dsbuild.core.hashing import sha256_bytes
from dsbuild.lineage.index import INDEX_SCHEMA
from dsbuild.lineage.manifest import MANIFEST_FORMAT, Manifest, content_id
from dsbuild.validators.reading import PARQUET_COLUMNS, PICKLE_EXTS, SampleData

SHARD_EXT = {"webdataset": "tar", "parquet": "parquet"}
SHARD_PATH = re.compile(r"shards/([0-9a-f]{2})/([0-9a-f]{64})\.(tar|parquet)")
MEMBER_EXTS = ("json", *VIDEO_EXTS, *ARRAY_MEMBERS, EVENTS_MEMBER)


@dataclass
class VersionFacts:
    """What the manifest check learnt; ``fatal`` says why nothing after it can run."""

    problems: list[tuple[str, str]] = field(default_factory=list)
    manifest: Manifest | None = None
    rows: list[dict] | None = None
    fatal: str | None = None


def check_manifest(catalog: Catalog, version_id: str) -> VersionFacts:
    import pyarrow as pa
    import pyarrow.parquet as pq

    facts = VersionFacts()
    vdir = catalog.version_dir(version_id)
    path = vdir / "manifest.json"
    try:
        data = path.read_bytes()
    except OSError as e:
        facts.fatal = f"manifest.json unreadable ({e.strerror})"
        facts.problems.append(("manifest.json", facts.fatal))
        return facts
    if sha256_bytes(data) != version_id:
        facts.problems.append(("manifest.json", f"sha256 {sha256_bytes(data)[:16]}… is not the version id: "
                                                "the manifest was edited or damaged"))
    try:
        m = Manifest.from_bytes(data, "manifest.json")
    except FormatError as e:
        facts.fatal = str(e)
        facts.problems.append(("manifest.json", facts.fatal))
        return facts
    facts.manifest = m
    if m.format != MANIFEST_FORMAT:
        facts.problems.append(("manifest.json", f"format {m.format!r} is not {MANIFEST_FORMAT}"))
    if m.shard_format not in SHARD_EXT:
        facts.fatal = f"unknown shard format {m.shard_format!r}"
        facts.problems.append(("manifest.json", facts.fatal))
        return facts
    schema = m.schema if isinstance(m.schema, dict) else {}
    if schema.get("sample_format") != SAMPLE_FORMAT:
        facts.problems.append(("manifest.json", f"schema.sample_format {schema.get('sample_format')!r} "
                                                f"is not {SAMPLE_FORMAT}"))
    if schema.get("index_columns") != INDEX_SCHEMA.names:
        facts.problems.append(("manifest.json", "schema.index_columns differ from the index schema"))
    seen = Counter(s.path for s in m.shards)
    for s in m.shards:
        mt = SHARD_PATH.fullmatch(s.path)
        if not mt or mt.group(2) != s.sha256 or mt.group(1) != s.sha256[:2] or mt.group(3) != SHARD_EXT[m.shard_format]:
            facts.problems.append((s.path, "shard path is not shards/<sha[:2]>/<sha256>."
                                           f"{SHARD_EXT[m.shard_format]} of its own hash"))
        if seen[s.path] > 1:
            facts.problems.append((s.path, f"listed {seen[s.path]} times"))
    index = m.index if isinstance(m.index, dict) else {}
    name = index.get("path")
    if not isinstance(name, str) or "/" in name or name.startswith("."):
        facts.fatal = f"index path {name!r} is not a file name in the version folder"
        facts.problems.append(("manifest.json", facts.fatal))
        return facts
    try:
        index_data = (vdir / name).read_bytes()
    except OSError as e:
        facts.fatal = f"{name} unreadable ({e.strerror})"
        facts.problems.append((name, facts.fatal))
        return facts
    if sha256_bytes(index_data) != index.get("sha256") or len(index_data) != index.get("bytes"):
        facts.fatal = f"{name} does not match the sha256/bytes in the manifest: altered or damaged"
        facts.problems.append((name, facts.fatal))
        return facts
    try:
        table = pq.read_table(pa.BufferReader(index_data))
    except (OSError, pa.ArrowException) as e:
        facts.fatal = f"{name} is not readable Parquet ({str(e)[:160]})"
        facts.problems.append((name, facts.fatal))
        return facts
    if table.schema.names != INDEX_SCHEMA.names:
        facts.fatal = f"{name} columns {table.schema.names} are not the index schema"
        facts.problems.append((name, facts.fatal))
        return facts
    rows = table.to_pylist()
    facts.rows = rows
    for what, n in (("index.rows", index.get("rows")), ("stats.samples", m.stats.get("samples")),
                    ("the shards' sample counts", sum(s.samples for s in m.shards))):
        if n != len(rows):
            facts.problems.append((name, f"{len(rows)} rows, but {what} says {n}"))
    per_shard = Counter(r["shard"] for r in rows)
    for s in m.shards:
        if per_shard.get(s.path, 0) != s.samples:
            facts.problems.append((s.path, f"manifest says {s.samples} samples, index has {per_shard.get(s.path, 0)}"))
    if content_id([(r["key"], r["sha256"]) for r in rows]) != m.content_id:
        facts.problems.append(("manifest.json", "content_id does not recompute from the index's sample hashes"))
    return facts


@dataclass
class ShardFacts:
    bad: dict[str, str] = field(default_factory=dict)  # shard path -> what is wrong
    locators: list[tuple[str, str]] = field(default_factory=list)  # index rows missing their sample


def check_shards(catalog: Catalog, version_id: str, threads: int) -> ShardFacts:
    """Hash every shard and check every locator with ``lineage.verify`` (samples inside a damaged shard
    are named by the sample pass, which hashes each sample it reads)."""
    from dsbuild.lineage.verify import verify

    out = ShardFacts()
    for p in verify(catalog, version_id, threads=max(1, threads)).problems:
        if "sample" in p:
            out.locators.append((p["sample"], f"{p['problem']}: {p.get('detail', '')}".rstrip(": ")))
        elif "shard" in p:
            out.bad[p["shard"]] = p["problem"] + (f" ({p['detail']})" if "detail" in p else "")
    return out


_SESSION = {"session_id": str, "title": str, "player": str, "conditions": dict}
_CLIP = {"index": int, "t_start": (int, float), "t_end": (int, float), "frames": int, "duration": (int, float)}
_VIDEO = {"codec": str, "width": int, "height": int, "fps": (int, float, type(None)), "has_audio": bool,
          "container": str}
_TOP = {"format": str, "key": str, "session": dict, "clip": dict, "video": dict, "controls": list,
        "telemetry_channels": list, "text": list, "action_events": int, "sources": dict}


def _typed(doc: dict, spec: dict, where: str) -> list[str]:
    out = []
    for k, t in spec.items():
        if k not in doc:
            out.append(f"metadata lacks {where}{k}")
        elif isinstance(doc[k], bool) and t is not bool or not isinstance(doc[k], t):
            out.append(f"metadata {where}{k} is {type(doc[k]).__name__}")
    return out


def meta_problems(meta: dict) -> list[str]:
    """Missing or mistyped metadata fields (empty when the metadata has the shape readers rely on)."""
    out = _typed(meta, _TOP, "")
    if out:
        return out
    if meta["format"] != SAMPLE_FORMAT:
        out.append(f"metadata format {meta['format']!r} is not {SAMPLE_FORMAT}")
    for sub, spec in (("session", _SESSION), ("clip", _CLIP), ("video", _VIDEO)):
        out += _typed(meta[sub], spec, f"{sub}.")
    for name in ("controls", "telemetry_channels"):
        if not all(isinstance(x, str) for x in meta[name]):
            out.append(f"metadata {name} is not a list of names")
    return out


def sample_problems(row: dict, d: SampleData, shard_format: str) -> list[tuple[str, str]]:
    """Per-sample structural findings beyond reading: metadata fields, index agreement, key rules."""
    out = list(d.problems)
    key = row["key"]
    if not KEY_RE.fullmatch(key or ""):
        out.append(("keys", f"key {key!r} breaks [A-Za-z0-9_-]{{1,80}}"))
    meta = d.meta
    if meta is None:
        return out
    bad = meta_problems(meta)
    if bad:
        out += [("members", b) for b in bad]
        return out
    s, c, v = meta["session"], meta["clip"], meta["video"]
    if meta["key"] != key:
        out.append(("keys", f"metadata key is {meta['key']!r}"))
    elif key != sample_key(s["session_id"], c["index"]):
        out.append(("keys", f"key is not {sample_key(s['session_id'], c['index'])!r} (<session_id>__<clip:06d>)"))
    expect = {"session_id": s["session_id"], "title": s["title"], "player": s["player"],
              "platform": s.get("platform"), "build": s.get("build"),
              "conditions": canonical_json(s["conditions"]).decode(), "clip_index": c["index"],
              "t_start": c["t_start"], "t_end": c["t_end"], "frames": c["frames"], "fps": v["fps"],
              "width": v["width"], "height": v["height"], "codec": v["codec"],
              "action_events": meta["action_events"], "text_events": len(meta["text"]),
              "source_video_sha256": meta["sources"].get("video")}
    if d.video is not None:
        expect["video_bytes"] = len(d.video)
    if shard_format == "webdataset" and not d.problems:
        expect["bytes"] = d.payload_bytes
    wrong = [f"{k}={row[k]!r} (sample: {want!r})" for k, want in expect.items() if row.get(k) != want]
    if wrong:
        out.append(("index", "index disagrees with the sample: " + ", ".join(wrong[:4])
                    + (f" and {len(wrong) - 4} more" if len(wrong) > 4 else "")))
    if d.video_ext is not None and d.video_ext != v["container"]:
        out.append(("members", f"video member is .{d.video_ext}, metadata says {v['container']}"))
    return out


def key_order_problems(rows: list[dict]) -> list[tuple[str, str]]:
    """Dataset-wide key rules: unique and sorted in the index."""
    out = []
    counts = Counter(r["key"] for r in rows)
    out += [(k, f"key appears {n} times in the index") for k, n in sorted(counts.items()) if n > 1]
    keys = [r["key"] for r in rows]
    out += [(b, f"index is not sorted: {b!r} comes after {a!r}") for a, b in zip(keys, keys[1:]) if b < a]
    return out


def scan_shard(path: Path | str, shard: str, shard_format: str, keys: set[str]) -> list[tuple[str, str]]:
    """Every member of a tar shard (headers only) or every column of a Parquet shard, judged unsafe or not."""
    path = Path(path)
    if not path.is_file():
        return []  # reported by shard_hashes
    if shard_format == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            names = pq.ParquetFile(path).schema_arrow.names
        except (OSError, pa.ArrowException):
            return []  # unreadable: reported by shard_hashes and members
        return [(f"{shard}:{c}", "column not in the shard schema") for c in names if c not in PARQUET_COLUMNS]
    out = []
    try:
        with tarfile.open(path, "r:") as tf:
            for info in tf:
                why = _member_problems(info, keys)
                if why:
                    out.append((f"{shard}:{info.name}", "; ".join(why)))
    except (tarfile.TarError, OSError, EOFError) as e:
        out.append((shard, f"tar structure unreadable ({str(e)[:120]}); its members cannot be proven safe"))
    return out


def _member_problems(info: tarfile.TarInfo, keys: set[str]) -> list[str]:
    name = info.name
    out = []
    if not info.isreg():
        kind = ("symlink" if info.issym() else "hard link" if info.islnk()
                else "directory" if info.isdir() else "special file")
        out.append(f"{kind} member (only regular files are allowed)")
    if "/" in name or "\\" in name or name.startswith(".") or ".." in name:
        out.append("member name has a path")
    if name.lower().endswith(PICKLE_EXTS):
        out.append("pickle-like member (never unpickled; must not be shipped)")
    key, _, ext = name.partition(".")
    if key not in keys:
        out.append("member belongs to no sample in the index")
    elif ext not in MEMBER_EXTS and not out:
        out.append(f"unknown member type .{ext}")
    return out
