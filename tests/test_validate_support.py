"""Helpers for the validate tests (no tests here): small real catalogs, and `reseal`, which edits the
samples of a WebDataset version and then fixes every hash, index row and the manifest, so the result is
a consistent version whose only defect is the one put in on purpose."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from dsbuild.convert import ConvertConfig, convert
from dsbuild.formats.sample import VIDEO_EXT, members_sha256
from dsbuild.formats.webdataset import BLOCK, RECORD, _header, parse_members
from dsbuild.lineage.hashing import sha256_bytes
from dsbuild.lineage.index import index_bytes
from dsbuild.lineage.manifest import Manifest, content_id
from dsbuild.samples.synthetic import frames as moving_frames
from dsbuild.samples.writer import SessionSpec, VideoSpec, write_session
from tests.helpers import index_rows, manifest

Members = list[tuple[str, bytes]]


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from dsbuild.cli.app import main; main()", *map(str, args)],
                          capture_output=True, text=True)


def copy_catalog(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def write_still_session(root: Path, session_id: str, image: np.ndarray, seconds: float = 2.0, fps: int = 30,
                        title: str = "Still Life", player: str = "p-still") -> None:
    """A session whose video repeats one image: every clip cut from it is frozen (black if the image is)."""
    h, w = image.shape[:2]
    spec = SessionSpec(session_id, title, player, VideoSpec(w, h, fps, fps), conditions={"track": "menu"})
    n = int(seconds * fps)
    write_session(root / session_id, spec, [image] * n, [{"t": 0.0, "control": "button_a", "value": 1.0}],
                  [{"t": 0.0, "speed": 0.0}], [], seed=0)


def write_moving_session(root: Path, session_id: str, title: str, player: str, seconds: float = 2.0,
                         seed: int = 0, size: tuple[int, int] = (160, 120)) -> None:
    rng = np.random.default_rng(seed)
    spec = SessionSpec(session_id, title, player, VideoSpec(size[0], size[1], 30, 30),
                       conditions={"track": "harbor"})
    n = int(seconds * 30)
    actions = [{"t": round(t, 3), "control": c, "value": float(v)} for i, t in enumerate(np.arange(0, seconds, 0.25))
               for c, v in (("button_a", i % 2), ("steer_x", np.sin(t)))]
    write_session(root / session_id, spec, moving_frames(spec.video, n, rng), actions,
                  [{"t": float(t), "speed": float(t)} for t in np.arange(0, seconds, 0.1)],
                  [{"t": 0.5, "speaker": player, "text": "gg"}], seed=seed)


def build(captures: Path, out: Path, fmt: str = "webdataset", clip_seconds: float = 1.0) -> tuple[Path, str]:
    r = convert(captures, out, ConvertConfig(format=fmt, clip_seconds=clip_seconds), workers=1)
    return out, r.version_id


def _tar(samples: list[tuple[str, Members]], trailing: Members) -> tuple[bytes, list[tuple[int, int]]]:
    out = bytearray()
    ranges = []
    for _key, members in samples:
        start = len(out)
        for name, payload in members:
            out += _header(name, len(payload)) + payload + b"\0" * (-len(payload) % BLOCK)
        ranges.append((start, len(out) - start))
    for name, payload in trailing:
        out += _header(name, len(payload)) + payload + b"\0" * (-len(payload) % BLOCK)
    out += b"\0" * (2 * BLOCK)
    out += b"\0" * (-len(out) % RECORD)
    return bytes(out), ranges


def reseal(cat: Path, vid: str, edit: Callable[[str, Members], Members] | None = None,
           trailing: dict[int, Members] | None = None) -> str:
    """Rewrite every shard with ``edit(key, members)`` applied (and ``trailing[shard number]`` members no
    sample owns appended); re-hash samples and shards, rewrite the index and manifest; return the new id."""
    doc = manifest(cat, vid)
    rows = index_rows(cat, vid)
    new_rows = []
    for n, rec in enumerate(doc["shards"]):
        data = (cat / rec["path"]).read_bytes()
        srows = sorted((r for r in rows if r["shard"] == rec["path"]), key=lambda r: r["offset"])
        samples = []
        for r in srows:
            members = parse_members(data[r["offset"]:r["offset"] + r["length"]], key=r["key"])
            samples.append((r["key"], edit(r["key"], members) if edit else members))
        blob, ranges = _tar(samples, (trailing or {}).get(n, []))
        sha = sha256_bytes(blob)
        path = f"shards/{sha[:2]}/{sha}.tar"
        (cat / rec["path"]).unlink()
        (cat / path).parent.mkdir(parents=True, exist_ok=True)
        (cat / path).write_bytes(blob)
        doc["shards"][n] = {**rec, "path": path, "sha256": sha, "bytes": len(blob)}
        for r, (key, members), (off, length) in zip(srows, samples, ranges):
            canon = [(name.split(".", 1)[1], p) for name, p in members]
            video = next((p for e, p in canon if e == VIDEO_EXT), b"")
            new_rows.append({**r, "shard": path, "offset": off, "length": length, "sha256": members_sha256(canon),
                             "bytes": sum(len(p) for _, p in canon), "video_bytes": len(video)})
    idx = index_bytes(new_rows)
    doc["index"] = {**doc["index"], "sha256": sha256_bytes(idx), "bytes": len(idx)}
    doc["content_id"] = content_id([(r["key"], r["sha256"]) for r in new_rows])
    m = Manifest.from_bytes(json.dumps(doc).encode(), "edited")
    new_id = m.version_id
    vdir = cat / "versions" / new_id
    vdir.mkdir()
    (vdir / "index.parquet").write_bytes(idx)
    (vdir / "manifest.json").write_bytes(m.to_bytes())
    (vdir / "commit.json").write_text('{"created_at": "2099-01-01T00:00:00Z"}')
    shutil.rmtree(cat / "versions" / vid)
    return new_id
