"""Helpers for the validators tests (no tests here): small real captures and catalogs, and ``reseal``, which
edits a version's samples through the shard format's own writer and then fixes every hash, index row and
the manifest, so the result is a consistent version whose only defect is the one put in on purpose."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.executor import ExecutorSpec
from dsbuild.core.hashing import sha256_bytes
from dsbuild.core.jsonio import canonical_json
from dsbuild.formats import get_format
from dsbuild.formats.sample import MEMBERS, members_blake3, members_sha256
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.index import index_bytes, rows_from_table
from dsbuild.lineage.manifest import FilePin, ShardRecord, content_id, shard_key
from dsbuild.samples.synthetic import frames as moving_frames
from dsbuild.samples.writer import SessionSpec, VideoSpec, write_jsonl, write_session

Members = list[tuple[str, bytes]]


def build(captures: Path, out: Path, fmt: str = "webdataset", clip_seconds: float = 1.0) -> tuple[Path, str]:
    r = convert(captures, out, ConvertConfig(format=fmt, clip_seconds=clip_seconds), executor=ExecutorSpec(workers=1))
    return out, r.version_id


def copy_catalog(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def rows(cat: Path, vid: str):
    return rows_from_table(Catalog.open(cat).index(vid))


def write_still_session(
    root: Path,
    session_id: str,
    image: np.ndarray,
    seconds: float = 2.0,
    fps: int = 30,
    title: str = "Still Life",
    player: str = "p-still",
) -> None:
    """A session whose video repeats one image: every clip cut from it is frozen (black if the image is)."""
    h, w = image.shape[:2]
    spec = SessionSpec(session_id, title, player, VideoSpec(w, h, fps, fps), conditions={"track": "menu"})
    write_session(
        root / session_id,
        spec,
        [image] * int(seconds * fps),
        [{"t": 0.0, "control": "button_a", "value": 1.0}],
        [{"t": 0.0, "speed": 0.0}],
        [],
        seed=0,
    )


def write_moving_session(
    root: Path,
    session_id: str,
    title: str,
    player: str,
    seconds: float = 2.0,
    seed: int = 0,
    size: tuple[int, int] = (160, 120),
    conditions: dict | None = None,
    text: list[dict] | None = None,
) -> Path:
    rng = np.random.default_rng(seed)
    spec = SessionSpec(
        session_id,
        title,
        player,
        VideoSpec(size[0], size[1], 30, 30),
        conditions=conditions if conditions is not None else {"track": "harbor"},
    )
    actions = [
        {"t": round(t, 3), "control": c, "value": float(v)}
        for i, t in enumerate(np.arange(0, seconds, 0.25))
        for c, v in (("button_a", i % 2), ("steer_x", np.sin(t)))
    ]
    return write_session(
        root / session_id,
        spec,
        moving_frames(spec.video, int(seconds * 30), rng),
        actions,
        [{"t": float(t), "speed": float(t)} for t in np.arange(0, seconds, 0.1)],
        text if text is not None else [{"t": 0.5, "speaker": player, "text": "gg"}],
        seed=seed,
    )


def write_vfr_session(root: Path, session_id: str, intervals_ms: list[int], size=(96, 64), gop: int = 30) -> Path:
    """A variable-frame-rate session: frame i is shown ``intervals_ms[i]`` ms after frame i-1 (H.264 in MP4,
    millisecond time base), so a clip's own rate differs from the stream's average rate."""
    import av

    d = root / session_id
    d.mkdir(parents=True)
    rng = np.random.default_rng(1)
    spec = VideoSpec(size[0], size[1], 30, gop)
    pts = np.concatenate([[0], np.cumsum(intervals_ms[1:])]).astype(int)
    with av.open(str(d / "video.mp4"), "w", format="mp4", options={"fflags": "+bitexact"}) as c:
        s = c.add_stream("libx264", rate=30)
        s.width, s.height, s.pix_fmt, s.thread_count = size[0], size[1], "yuv420p", 1
        s.time_base = s.codec_context.time_base = Fraction(1, 1000)
        s.options = {"g": str(gop), "keyint_min": str(gop), "sc_threshold": "0", "bf": "0"}
        for p, img in zip(pts, moving_frames(spec, len(pts), rng)):
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts, f.time_base = int(p), Fraction(1, 1000)
            for packet in s.encode(f):
                c.mux(packet)
        for packet in s.encode():
            c.mux(packet)
    seconds = pts[-1] / 1000
    write_jsonl(
        d / "actions.jsonl",
        [
            {"t": round(float(t), 3), "control": "button_a", "value": float(i % 2)}
            for i, t in enumerate(np.arange(0, seconds, 0.2))
        ],
    )
    (d / "session.json").write_text(
        json.dumps(
            {
                "format": "capture/1",
                "session_id": session_id,
                "title": "Drift VFR",
                "player": "p-vfr",
                "video": "video.mp4",
                "streams": {"actions": "actions.jsonl"},
            }
        )
    )
    return d


def canonical_meta(members: Members, edit: Callable[[dict], None]) -> Members:
    """The members with their metadata edited by ``edit(doc)`` and written canonically."""
    out = []
    for ext, payload in members:
        if ext == "json":
            doc = json.loads(payload)
            edit(doc)
            payload = canonical_json(doc)
        out.append((ext, payload))
    return out


def reseal(
    cat: Path,
    vid: str,
    edit: Callable[[str, Members], Members] | None = None,
    shard_bytes: Callable[[int, bytes], bytes] | None = None,
) -> str:
    """Rewrite every shard with ``edit(key, members)`` applied (through the format's encoder and writer;
    ``shard_bytes(n, data)`` may then change a written shard), re-hash samples and shards, rewrite the index
    and the manifest; return the new version id (the old version is removed)."""
    catalog = Catalog.open(cat)
    m = catalog.manifest(vid)
    fmt = get_format(m.shard_format)
    all_rows = rows_from_table(catalog.index(vid))
    new_rows, shards = [], []
    for n, rec in enumerate(m.shards):
        srows = sorted(
            (r for r in all_rows if r.shard == rec.path),
            key=lambda r: (r.byte_offset or 0, r.row_group or 0, r.row_index or 0),
        )
        segments, sizes = [], []
        with fmt.reader(cat / rec.path) as reader:
            for r in srows:
                members = [(e, bytes(p)) for e, p in reader.members(r.entry())]
                members = edit(r.key, members) if edit else members
                sha = members_sha256(members)
                segments.append(fmt.encode(r.key, sha, members))
                sizes.append(
                    (sum(len(p) for _, p in members), len(dict(members).get(MEMBERS[1], b"")), members_blake3(members))
                )
        buf = io.BytesIO()
        entries = fmt.write(segments, buf)
        data = shard_bytes(n, buf.getvalue()) if shard_bytes else buf.getvalue()
        sha = sha256_bytes(data)
        path = shard_key(sha, fmt.ext)
        (cat / rec.path).unlink()
        (cat / path).parent.mkdir(parents=True, exist_ok=True)
        (cat / path).write_bytes(data)
        shards.append(ShardRecord(path, sha, len(data), len(srows)))
        for r, e, (total, video, blake3) in zip(srows, entries, sizes):
            new_rows.append(replace(r.located(path, e), sha256=e.sha256, bytes=total, video_bytes=video, blake3=blake3))
    index = index_bytes(new_rows)
    new = replace(
        m,
        shards=tuple(shards),
        index=FilePin(m.index.path, sha256_bytes(index), len(new_rows), len(index)),
        content_id=content_id([(r.key, r.sha256) for r in new_rows]),
        stats=replace(m.stats, bytes=sum(s.bytes for s in shards)),  # (verify checks the stats for sense)
    )
    vdir = cat / "versions" / new.version_id
    vdir.mkdir()
    (vdir / m.index.path).write_bytes(index)
    shutil.copy(cat / "versions" / vid / m.sessions.path, vdir / m.sessions.path)
    (vdir / "manifest.json").write_bytes(new.to_bytes())
    shutil.rmtree(cat / "versions" / vid)
    return new.version_id
