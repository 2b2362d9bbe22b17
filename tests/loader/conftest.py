"""Loader fixtures: small real catalogs converted from the shared synthetic captures."""

from __future__ import annotations

import json
import shutil

import pytest

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.executor import ExecutorSpec
from dsbuild.lineage.catalog import Catalog
from dsbuild.loader import Loader


@pytest.fixture(scope="session")
def cat(captures, tmp_path_factory):
    """(path, version id): ~25 samples of 1-2 s clips across 6 sessions (mixed resolutions and rates),
    in ~10 small shards (256 KiB), so shard-level behaviour (open files, coalescing) is exercised."""
    out = tmp_path_factory.mktemp("loader") / "catalog"
    r = convert(captures, out, ConvertConfig(clip_seconds=1.0, shard_size=1 << 18), executor=ExecutorSpec(workers=1))
    return str(out), r.version_id


@pytest.fixture
def cat_copy(cat, tmp_path):
    """A private, writable copy of ``cat`` (path, version id)."""
    dst = tmp_path / "catalog"
    shutil.copytree(cat[0], dst)
    return str(dst), cat[1]


def index_rows(path: str, version_id: str) -> list[dict]:
    return Catalog.open(path).index(version_id).to_pylist()


def run(ref, n=None, state=None, **kw) -> tuple[list, dict]:
    """Keys of ``n`` batches (the rest of the epoch if None) from a fresh bytes-mode loader, optionally
    restored from ``state`` (passed through JSON, as a checkpoint file would be)."""
    loader = Loader(ref, **{"decode": "bytes", "batch_size": 3, "seed": 5, **kw})
    if state is not None:
        loader.load_state_dict(json.loads(json.dumps(state)))
    out = []
    for b in loader:
        out.append(b["keys"])
        if n is not None and len(out) == n:
            break
    return out, loader.state_dict()


def make_clip(
    frames: int = 60, gop: int = 9, bframes: int = 2, audio: bool = True, size=(64, 48), fps: int = 30
) -> bytes:
    """An MP4 made with real encoders: H.264 with a fixed IBBPBBPBB pattern (non-reference B-frames, a
    keyframe every ``gop`` frames) and, with ``audio``, a 440 Hz AAC stereo track at 48 kHz."""
    import io
    from fractions import Fraction

    import av
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        v = c.add_stream("libx264", rate=Fraction(fps))
        v.width, v.height, v.pix_fmt = size[0], size[1], "yuv420p"
        v.options = {
            "preset": "veryfast",
            "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes={bframes}:b-adapt=0:b-pyramid=none",
        }
        a = None
        if audio:
            a = c.add_stream("aac", rate=48000)
            a.layout = "stereo"
        t = np.arange(1024) / 48000
        for i in range(frames):
            img = np.full((size[1], size[0], 3), (i * 4) % 256, np.uint8)
            img[: size[1] // 2, : size[0] // 2] = (i * 16) % 256
            for p in v.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
        if a is not None:
            n = int(frames / fps * 48000) // 1024
            for k in range(n):
                wave = (0.5 * np.sin(2 * np.pi * 440 * (t + k * 1024 / 48000))).astype(np.float32)
                frame = av.AudioFrame.from_ndarray(np.stack([wave, wave]), format="fltp", layout="stereo")
                frame.sample_rate, frame.pts = 48000, k * 1024
                for p in a.encode(frame):
                    c.mux(p)
            for p in a.encode(None):
                c.mux(p)
        for p in v.encode(None):
            c.mux(p)
    return buf.getvalue()
