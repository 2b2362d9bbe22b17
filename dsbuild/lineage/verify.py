"""`verify`: prove a version's bytes are what its manifest says, shard by shard and sample by sample.

Shards are hashed in a thread pool (hashlib releases the GIL on large buffers), so several shards hash
at once; each problem is reported with the shard and what is wrong: missing, truncated, altered, or an
index entry that does not point at its sample.
"""

from __future__ import annotations

import hashlib
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from dsbuild.errors import FormatError
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.hashing import CHUNK, sha256_bytes
from dsbuild.lineage.index import read_index
from dsbuild.lineage.manifest import Manifest, ShardRecord


@dataclass
class VerifyReport:
    version_id: str
    shards_checked: int = 0
    bytes_checked: int = 0
    samples_checked: int = 0
    problems: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {"version_id": self.version_id, "ok": self.ok, "shards_checked": self.shards_checked,
                "bytes_checked": self.bytes_checked, "samples_checked": self.samples_checked,
                "problems": self.problems}


def _check_shard(catalog: Catalog, rec: ShardRecord) -> dict | None:
    exists, size = catalog.shard_exists(rec.path)
    if not exists:
        return {"shard": rec.path, "problem": "missing"}
    if size < rec.bytes:
        return {"shard": rec.path, "problem": "truncated", "detail": f"{size} of {rec.bytes} bytes"}
    h = hashlib.sha256()
    size = 0
    with catalog.open_shard(rec.path) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    if size != rec.bytes:
        return {"shard": rec.path, "problem": "size changed", "detail": f"{size} bytes, expected {rec.bytes}"}
    if h.hexdigest() != rec.sha256:
        return {"shard": rec.path, "problem": "altered",
                "detail": f"sha256 {h.hexdigest()[:16]}…, expected {rec.sha256[:16]}…"}
    return None


def _check_locators(catalog: Catalog, m: Manifest, rows: list[dict], shards: set[str]) -> list[dict]:
    """Each index entry must point at its own sample: tar headers named <key>.*, Parquet rows with the key."""
    problems = []
    by_path = {s.path: s for s in m.shards}
    for r in rows:
        rec = by_path.get(r["shard"])
        if rec is None:
            problems.append({"sample": r["key"], "problem": "index names a shard the manifest lacks",
                             "detail": r["shard"]})
            continue
        if r["shard"] not in shards:
            continue
        try:
            with catalog.open_shard(r["shard"]) as f:
                if m.shard_format == "webdataset":
                    _check_tar_entry(f, r, rec)
                else:
                    _check_parquet_entry(f, r)
        except (FormatError, OSError, ValueError) as e:
            problems.append({"sample": r["key"], "shard": r["shard"], "problem": "bad locator", "detail": str(e)})
    return problems


def _check_tar_entry(f, r: dict, rec: ShardRecord) -> None:
    """The shard's bytes are already proven by its sha256, so framing is checked from headers alone."""
    from dsbuild.formats.webdataset import member_headers

    if r["offset"] < 0 or r["offset"] + r["length"] > rec.bytes:
        raise FormatError(f"byte range {r['offset']}+{r['length']} is outside the shard")
    member_headers(f, r["offset"], r["length"], r["key"])


def _check_parquet_entry(f, r: dict) -> None:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(f)
    if not 0 <= r["row_group"] < pf.num_row_groups:
        raise FormatError(f"row group {r['row_group']} does not exist")
    keys = pf.read_row_group(r["row_group"], columns=["key", "sha256"])
    if r["row"] >= keys.num_rows or keys.column("key")[r["row"]].as_py() != r["key"]:
        raise FormatError(f"row {r['row_group']}/{r['row']} does not hold this key")
    if keys.column("sha256")[r["row"]].as_py() != r["sha256"]:
        raise FormatError("row's sample hash does not match the index")


def verify(catalog: Catalog, version_id: str, *, sample: int | None = None, seed: int = 0,
           threads: int = 4) -> VerifyReport:
    """Re-hash the version's shards (all, or ``sample`` of them chosen by ``seed``) and check its index."""
    report = VerifyReport(version_id)
    m = catalog.manifest(version_id)
    vdir = catalog.version_dir(version_id)
    index_path = vdir / m.index["path"]
    if not index_path.is_file():
        report.problems.append({"index": m.index["path"], "problem": "missing"})
        return report
    if sha256_bytes(index_path.read_bytes()) != m.index["sha256"]:
        report.problems.append({"index": m.index["path"], "problem": "altered"})
        return report
    shards = list(m.shards)
    if sample is not None and sample < len(shards):
        shards = sorted(random.Random(seed).sample(shards, sample), key=lambda s: s.path)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(lambda rec: _check_shard(catalog, rec), shards))
    report.problems += [p for p in results if p]
    report.shards_checked = len(shards)
    report.bytes_checked = sum(s.bytes for s in shards)
    good = {s.path for s, p in zip(shards, results) if p is None}
    rows = read_index(index_path).to_pylist()
    if len(rows) != m.index["rows"]:
        report.problems.append({"index": m.index["path"], "problem": f"{len(rows)} rows, manifest says {m.index['rows']}"})
    checked = [r for r in rows if r["shard"] in good or r["shard"] not in {s.path for s in m.shards}]
    report.problems += _check_locators(catalog, m, checked, good)
    report.samples_checked = len(checked)
    return report
