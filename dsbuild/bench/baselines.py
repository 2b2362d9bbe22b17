"""Baselines measured in the same run as our loader, doing the same work without our logic.

  raw        : a plain sequential read of the same shard files, whole shards in 4 MiB reads, no parsing and
               no hashing: the I/O floor. A shard's samples count once the shard has been read (it decodes
               nothing, so it has no frames/s).
  pyav       : a plain PyAV decode loop over the same clips, with as many threads as the loader has
               decode threads, thread_type AUTO and the same resize. The clips' bytes are read into memory
               first, so this is a decode-only floor.
  webdataset : the ``webdataset`` library's own pipeline over the same tar shards: it iterates samples
               (decode=bytes) or also decodes each sample's mp4 with PyAV in a pool of the same size.
Each ``run(seconds)`` returns samples/s, frames/s and MB/s counted like ours (``dsbuild.bench.dataset``).
"""

from __future__ import annotations

import io
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dsbuild.bench.dataset import Dataset
from dsbuild.bench.summary import rate

READ_CHUNK = 4 << 20
CLIP_BUDGET = 256 << 20  # bytes of clips the pyav baseline holds in memory


def _result(samples: float, frames: float, nbytes: float, seconds: float) -> dict:
    return {"samples": samples, "frames": frames, "bytes": nbytes, "seconds": seconds,
            "samples_per_s": rate(samples, seconds), "frames_per_s": rate(frames, seconds),
            "mb_per_s": rate(nbytes / 1e6, seconds)}


def decode_clip(data: bytes, size: tuple[int, int] | None) -> int:
    """A plain PyAV decode of one clip to RGB arrays; returns the frame count."""
    import av

    n = 0
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.video[0]
        stream.thread_type = "AUTO"
        for frame in c.decode(stream):
            if size is not None:
                frame = frame.reformat(width=size[1], height=size[0], format="rgb24")
            frame.to_ndarray(format="rgb24")
            n += 1
    return n


class Raw:
    name = "raw"

    def __init__(self, data: Dataset):
        self.data = data
        self.buf = bytearray(READ_CHUNK)
        self.next_shard = 0

    def skip(self) -> str | None:
        return None

    def run(self, seconds: float, tick=None) -> dict:
        samples = frames = nbytes = 0.0
        view = memoryview(self.buf)
        t0 = time.perf_counter()
        while True:
            shard = self.data.shards[self.next_shard % len(self.data.shards)]
            self.next_shard += 1
            done = 0
            with open(shard.path, "rb", buffering=0) as f:
                while n := f.readinto(view):
                    done += n
            nbytes += done
            samples += shard.samples
            frames += shard.frames
            elapsed = time.perf_counter() - t0
            if tick:
                tick(elapsed, samples, frames, nbytes)
            if elapsed >= seconds:
                return {**_result(samples, frames, nbytes, elapsed), "frames": None, "frames_per_s": None}


class PyAV:
    name = "pyav"

    def __init__(self, data: Dataset, threads: int, resize: tuple[int, int] | None, decode: str):
        self.data, self.threads, self.resize, self.decode = data, threads, resize, decode
        self.clips: list[tuple[bytes, int]] | None = None

    def skip(self) -> str | None:
        if self.decode != "frames":
            return "decode=bytes does no decoding"
        return None

    def _load(self) -> None:
        from dsbuild.formats.sample import VIDEO_EXTS
        from dsbuild.loader.source import Source

        src = Source(self.data.ref, self.data.split, verify=False).open()
        self.clips = []
        held = 0
        try:
            for i in range(len(src)):
                raw = src.read(i)
                video = next(raw.members[e] for e in VIDEO_EXTS if e in raw.members)
                self.clips.append((video, self.data.sample_bytes.get(raw.key, len(video))))
                held += len(video)
                if held >= CLIP_BUDGET:
                    break
        finally:
            src.close()

    def run(self, seconds: float, tick=None) -> dict:
        if self.clips is None:
            self._load()
        clips, k = self.clips, self.threads
        t0 = time.perf_counter()
        counts = np.zeros((k, 3))

        def work(w: int) -> None:
            i = w
            while time.perf_counter() - t0 < seconds or i == w:
                data, size = clips[i % len(clips)]
                counts[w] += (1, decode_clip(data, self.resize), size)
                i += k
                if tick and w == 0:
                    s, f, b = counts.sum(axis=0)
                    tick(time.perf_counter() - t0, s, f, b)

        with ThreadPoolExecutor(max_workers=k, thread_name_prefix="bench-pyav") as pool:
            list(pool.map(work, range(k)))
        s, f, b = counts.sum(axis=0)
        return _result(s, f, b, time.perf_counter() - t0)


class WebDatasetLib:
    name = "webdataset"

    def __init__(self, data: Dataset, threads: int, resize: tuple[int, int] | None, decode: str):
        self.data, self.threads, self.resize, self.decode = data, threads, resize, decode

    def skip(self) -> str | None:
        if self.data.shard_format != "webdataset":
            return f"the version's shards are {self.data.shard_format}, not tar"
        return None

    def run(self, seconds: float, tick=None) -> dict:
        import webdataset as wds

        from dsbuild.formats.sample import VIDEO_EXTS

        urls = [str(s.path) for s in self.data.shards]
        sizes = self.data.sample_bytes
        decoding = self.decode == "frames"
        samples = frames = nbytes = 0
        pending: deque = deque()
        pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="bench-wds") if decoding else None
        t0 = time.perf_counter()
        try:
            elapsed = 0.0
            while elapsed < seconds or not samples:
                for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
                    samples += 1
                    nbytes += sizes.get(sample["__key__"]) or sum(
                        len(v) for v in sample.values() if isinstance(v, bytes))
                    if pool is not None:
                        video = next(sample[e] for e in VIDEO_EXTS if e in sample)
                        pending.append(pool.submit(decode_clip, video, self.resize))
                        while len(pending) > 2 * self.threads:
                            frames += pending.popleft().result()
                    elapsed = time.perf_counter() - t0
                    if tick:
                        tick(elapsed, samples, frames, nbytes)
                    if elapsed >= seconds:
                        break
            while pending:
                frames += pending.popleft().result()
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        out = _result(samples, frames, nbytes, time.perf_counter() - t0)
        if not decoding:
            out["frames"] = out["frames_per_s"] = None
        return out


def make(name: str, data: Dataset, threads: int, resize: tuple[int, int] | None, decode: str):
    if name == "raw":
        return Raw(data)
    if name == "pyav":
        return PyAV(data, threads, resize, decode)
    return WebDatasetLib(data, threads, resize, decode)
