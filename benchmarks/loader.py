"""The loader against its floors and its peers, measured in one run on the same member bytes.

    .venv/bin/python benchmarks/loader.py REF [REF ...] [--rounds 3] [--seconds 2] [--work DIR]
        [--frames-ref REF] [--mixed-ref REF] [--resize 128x128]

For each REF (a catalog of WebDataset shards), in interleaved rounds (rotated order; medians of per-round
ratios), bytes mode, no decode, epochs repeated for --seconds:
  ours_{none,shard,sample}_{1,2}t : Loader(decode="bytes", verify=..., num_workers=1|2, shuffle="none")
  ours_global_2t                   : the same with the global shuffle (random reads), verify="shard"
  raw                              : a sequential read of the same shard files (the I/O floor)
  sha256_2t                        : read + hashlib sha256 of the same files in 2 threads (verify floor)
  webdataset                       : the webdataset library iterating the same tar shards
  litdata / mosaic                 : LitData StreamingDataset / Mosaic StreamingDataset over the same member
                                     bytes written in their own formats (peers extra; skipped with a reason)
  torch_procs_2                    : as_torch_dataset() in a DataLoader with 2 process workers
Frames mode on --frames-ref (and --mixed-ref with bucket_by="resolution", no resize): ours against a bare
PyAV loop with the same threads and resize. Decoding only what is used: crops (clip_frames) decoded from
the keyframe before them vs from frame 0, and stride 2 with NONREF skipping vs without, on B-frame clips.
Prints a markdown table and the command line.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsbuild.lineage.catalog import open_ref  # noqa: E402
from dsbuild.loader import Loader  # noqa: E402
from dsbuild.loader.decode import decode_pyav  # noqa: E402


def timed(fn, seconds: float) -> tuple[float, float]:
    """(samples/s, MB/s) of repeated ``fn()`` -> (samples, bytes) for at least ``seconds``."""
    n = b = 0
    t0 = time.perf_counter()
    while True:
        s, by = fn()
        n, b = n + s, b + by
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return n / dt, b / dt / 1e6


class Data:
    def __init__(self, ref: str):
        self.ref = ref
        cat, vid = open_ref(ref)
        self.catalog, self.vid = cat, vid
        self.manifest = cat.manifest(vid)
        self.files = [str(cat.shard_file(s)) for s in self.manifest.shards]
        self.index = cat.index(vid)
        self.n = self.index.num_rows
        self.bytes = sum(self.index["bytes"].to_pylist())

    def members(self):
        """Every sample's canonical members (the same bytes every reader gets)."""
        from dsbuild.formats import get_format

        fmt = get_format(self.manifest.shard_format)
        for path, shard in zip(self.files, self.manifest.shards):
            rows = self.index.filter(__import__("pyarrow.compute", fromlist=["x"]).equal(self.index["shard"], shard.path))
            with fmt.reader(Path(path)) as r:
                for row in rows.to_pylist():
                    from dsbuild.formats import Entry
                    e = Entry(row["key"], row["sha256"], row["byte_offset"], row["byte_length"],
                              member_bytes=tuple(row["member_bytes"]))
                    yield row["key"], r.members(e)


def ours(data: Data, verify: str, threads: int, shuffle: str = "none"):
    loader = Loader(data.ref, decode="bytes", batch_size=32, shuffle=shuffle, num_workers=threads, verify=verify,
                    prefetch=2 * threads + 2)
    loader.open()

    def epoch():
        n = sum(len(b["keys"]) for b in loader)
        return n, data.bytes * n // data.n
    return epoch


def torch_procs(data: Data, workers: int):
    import torch

    loader = Loader(data.ref, decode="bytes", batch_size=32, shuffle="none", verify="shard")
    dl = torch.utils.data.DataLoader(loader.as_torch_dataset(), batch_size=None, num_workers=workers,
                                     persistent_workers=True, prefetch_factor=4)

    def epoch():
        n = sum(len(b["keys"]) for b in dl)
        return n, data.bytes * n // data.n
    return epoch


def raw(data: Data):
    buf = memoryview(bytearray(8 << 20))

    def epoch():
        total = 0
        for f in data.files:
            fd = os.open(f, os.O_RDONLY)
            try:
                while (k := os.readv(fd, [buf])) > 0:
                    total += k
            finally:
                os.close(fd)
        return data.n, data.bytes
    return epoch


def sha256_threads(data: Data, threads: int):
    """Read + sha256 of the same bytes, cut into 8 MB pieces spread over ``threads`` (so one big shard is
    hashed by every thread: the strongest floor for any verifying reader)."""
    piece = 8 << 20
    pieces = [(f, a) for f in data.files for a in range(0, os.path.getsize(f), piece)]

    def work(part):
        buf = memoryview(bytearray(piece))
        for f, a in part:
            fd = os.open(f, os.O_RDONLY)
            try:
                k = os.preadv(fd, [buf], a)
                hashlib.sha256(buf[:k]).digest()
            finally:
                os.close(fd)

    def epoch():
        ts = [threading.Thread(target=work, args=(pieces[i::threads],)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return data.n, data.bytes
    return epoch


def webdataset_lib(data: Data):
    import webdataset as wds

    def epoch():
        n = b = 0
        for s in wds.WebDataset(data.files, shardshuffle=False, empty_check=False):
            n += 1
            b += sum(len(v) for k, v in s.items() if isinstance(v, bytes))
        return n, b
    return epoch


COLUMNS = ["json", "mp4", "actions", "telemetry", "timestamps", "events"]


def litdata_peer(data: Data, work: Path):
    try:
        import litdata
        from litdata.streaming.writer import BinaryWriter
    except Exception as e:  # noqa: BLE001 - any import failure means: skip with the reason
        return None, f"litdata unavailable ({type(e).__name__}: {str(e)[:80]})"
    out = work / "litdata"
    if not (out / "index.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        w = BinaryWriter(str(out), chunk_bytes="64MB")
        for i, (key, members) in enumerate(data.members()):
            w[i] = {"key": key, **{c: bytes(p) for c, (_, p) in zip(COLUMNS, members)}}
        w.done()
        w.merge(1)
    ds = litdata.StreamingDataset(input_dir=str(out))

    def epoch():
        n = b = 0
        for item in ds:
            n += 1
            b += sum(len(item[c]) for c in COLUMNS)
        return n, b
    return epoch, None


def mosaic_peer(data: Data, work: Path):
    try:
        from importlib.util import find_spec
        import types
        if "streaming" not in sys.modules:
            spec = find_spec("streaming")
            if spec is None:
                raise ImportError("mosaicml-streaming is not installed")
            root = spec.submodule_search_locations[0]
            for name, path in (("streaming", root), ("streaming.base", root + "/base")):  # skip torchvision
                mod = types.ModuleType(name)
                mod.__path__ = [path]
                sys.modules[name] = mod
        from streaming.base.dataset import StreamingDataset
        from streaming.base.format.mds.writer import MDSWriter
        from streaming.base.util import clean_stale_shared_memory
    except Exception as e:  # noqa: BLE001
        return None, f"mosaic unavailable ({type(e).__name__}: {str(e)[:80]})"
    out = work / "mds"
    if not (out / "index.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        with MDSWriter(out=str(out), columns={"key": "str", **{c: "bytes" for c in COLUMNS}},
                       size_limit=1 << 26) as w:
            for key, members in data.members():
                w.write({"key": key, **{c: bytes(p) for c, (_, p) in zip(COLUMNS, members)}})
    clean_stale_shared_memory()
    ds = StreamingDataset(local=str(out), shuffle=False, batch_size=32)

    def epoch():
        n = b = 0
        for item in ds:
            n += 1
            b += sum(len(item[c]) for c in COLUMNS)
        return n, b
    return epoch, None


def frames_ours(ref: str, threads: int, resize, bucket):
    loader = Loader(ref, batch_size=8, shuffle="none", num_workers=threads, resize=resize,
                    bucket_by=bucket, verify="shard", prefetch=2 * threads + 2)
    loader.open()

    def epoch():
        f = n = 0
        for b in loader:
            f += int(b["lengths"].sum())
            n += len(b["keys"])
        return f, n
    return epoch


def frames_bare(data: Data, threads: int, resize):
    import av

    clips = [bytes(m[1][1]) for _, m in data.members()]

    def work(part, out, k):
        f = 0
        for c in part:
            with av.open(io.BytesIO(c)) as con:
                s = con.streams.video[0]
                s.thread_type = "AUTO"
                for fr in con.decode(s):
                    if resize:
                        fr.to_ndarray(format="rgb24", width=resize[1], height=resize[0])
                    else:
                        fr.to_ndarray(format="rgb24")
                    f += 1
        out[k] = f

    def epoch():
        out = [0] * threads
        ts = [threading.Thread(target=work, args=(clips[i::threads], out, i)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return sum(out), len(clips)
    return epoch


def decode_gains(seconds: float) -> list[tuple[str, float]]:
    """Crops from the keyframe vs from frame 0; stride 2 with NONREF vs without (B-frame clips)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.loader.conftest import make_clip

    clip = make_clip(frames=120, gop=60, bframes=1, audio=False, size=(640, 360))
    crop = np.arange(100, 108)
    rows = []
    size = (128, 128)
    from_key = timed(lambda: (len(decode_pyav(clip, crop, size)), 0), seconds)[0]
    from_zero = timed(lambda: (len(decode_pyav(clip, np.arange(0, 108), size)[100:]), 0), seconds)[0]
    rows.append(("crop of 8 of 120 frames at frame 100 (keyframes every 60), to 128x128: from keyframe / from frame 0",
                 from_key / from_zero))
    idx = np.arange(0, 120, 2)
    skip = timed(lambda: (len(decode_pyav(clip, idx, size, skip_nonref=True)), 0), seconds)[0]
    plain = timed(lambda: (len(decode_pyav(clip, idx, size, skip_nonref=False)), 0), seconds)[0]
    rows.append(("stride 2 on IBPBP... 640x360 clips to 128x128: NONREF skipping / full decode", skip / plain))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("refs", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--work", default=None)
    ap.add_argument("--frames-ref", default=None)
    ap.add_argument("--mixed-ref", default=None)
    ap.add_argument("--resize", default="128x128")
    a = ap.parse_args()
    resize = tuple(int(x) for x in a.resize.split("x"))[::-1] if a.resize else None
    work = Path(a.work or tempfile.mkdtemp(prefix="dsbuild-bench-"))
    lines = [f"command: {' '.join(sys.argv)}", ""]
    for ref in a.refs:
        data = Data(ref)
        runs = {"raw": raw(data), "sha256_2t": sha256_threads(data, 2), "webdataset": webdataset_lib(data)}
        for v in ("none", "shard", "sample"):
            for t in (1, 2):
                runs[f"ours_{v}_{t}t"] = ours(data, v, t)
        runs["ours_global_shard_2t"] = ours(data, "shard", 2, "global")
        skipped = []
        for name, peer in (("litdata", litdata_peer), ("mosaic", mosaic_peer)):
            fn, why = peer(data, work / Path(ref).name)
            if fn is None:
                skipped.append(f"{name}: {why}")
            else:
                runs[name] = fn
        try:
            runs["torch_procs_2"] = torch_procs(data, 2)
        except ImportError as e:
            skipped.append(f"torch: {e}")
        results = {k: [] for k in runs}
        names = list(runs)
        for r in range(a.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                results[name].append(timed(runs[name], a.seconds))
        med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in results.items()}

        def ratio(x, y):
            return statistics.median(p[0] / q[0] for p, q in zip(results[x], results[y])) if y in results else None

        lines += [f"### {ref}: {data.n} samples, {data.bytes / data.n / 1e3:.0f} KB each, "
                  f"{len(data.files)} shards", "", "| run | samples/s | MB/s |", "|---|---|---|"]
        lines += [f"| {k} | {v[0]:,.0f} | {v[1]:,.0f} |" for k, v in med.items()]
        lines += ["", "| ratio (median of per-round ratios) | value | target |", "|---|---|---|"]
        for x, y, target in (("ours_none_2t", "litdata", "≥ 1.0"), ("ours_shard_2t", "litdata", "≥ 1.0"),
                             ("ours_sample_2t", "litdata", "≥ 1.0"), ("ours_none_1t", "litdata", ""),
                             ("ours_none_2t", "webdataset", "≥ 2"), ("ours_shard_2t", "webdataset", "≥ 2"),
                             ("ours_none_2t", "mosaic", ""), ("ours_none_2t", "ours_none_1t", "≥ 1.6 (scaling)"),
                             ("ours_sample_2t", "ours_sample_1t", "≥ 1.6 (scaling)"),
                             ("ours_none_2t", "raw", "≥ 0.8 for clips ≥ 1 MB"), ("ours_sample_2t", "sha256_2t", "≥ 0.8"),
                             ("ours_shard_2t", "sha256_2t", ""), ("ours_global_shard_2t", "ours_shard_2t", ""),
                             ("torch_procs_2", "ours_shard_2t", "(process workers vs threads)")):
            value = ratio(x, y)
            if value is not None:
                lines.append(f"| {x} / {y} | {value:.2f} | {target} |")
        lines += [f"- skipped: {s}" for s in skipped] + [""]
    for ref, bucket, size in ((a.frames_ref, None, resize), (a.mixed_ref, "resolution", None)):
        if not ref:
            continue
        data = Data(ref)
        runs = {f"ours_{t}t": frames_ours(ref, t, size, bucket) for t in (1, 2)}
        runs.update({f"pyav_{t}t": frames_bare(data, t, size) for t in (1, 2)})
        results = {k: [] for k in runs}
        names = list(runs)
        for r in range(a.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                results[name].append(timed(runs[name], a.seconds))
        what = f"resize {size}" if size else "native sizes, bucket_by=resolution"
        lines += [f"### frames mode on {ref} ({data.n} clips, {what})", "", "| run | frames/s |", "|---|---|"]
        lines += [f"| {k} | {statistics.median(x[0] for x in v):,.0f} |" for k, v in results.items()]
        for t in (1, 2):
            value = statistics.median(p[0] / q[0] for p, q in zip(results[f"ours_{t}t"], results[f"pyav_{t}t"]))
            lines.append(f"\nours / bare PyAV, {t} thread(s): **{value:.2f}** (target ≥ 0.95)")
        lines.append("")
    lines += ["### decoding only what is used (ratios of delivered frames/s)", "", "| case | gain |", "|---|---|"]
    lines += [f"| {name} | {v:.2f}x |" for name, v in decode_gains(a.seconds)]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
