"""What a normalised training encoding costs at convert time and saves at load time, measured in one run.

    .venv/bin/python benchmarks/transcode.py [--out bench-out/transcode] [--seconds 6] [--rounds 3]

Generates (once, cached) a 720p60 H.264 capture with grain (keyframe every second), then:
  remux      : the capture cut into 2 s clips as they are (VideoSource, no re-encoding)
  <spec>     : the same clips transcoded (VideoSource(transcode=spec)); throughput is source frames per
               second of wall time, decode of the 720p source included (that is what convert pays);
               every round must give the same bytes
  decode@128 : per clip set, a loader-style PyAV loop (thread_type AUTO) decoding every frame and resizing
               it to 128x128 RGB (swscale, as dsbuild.loader.decode does); frames per second, median of rounds
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dsbuild.formats.probe import SWSCALE_THREADS  # noqa: E402
from dsbuild.formats.video import DemuxReport, VideoSource  # noqa: E402
from dsbuild.samples.synthetic import frames  # noqa: E402
from dsbuild.samples.writer import VideoSpec, encode_video  # noqa: E402

SPECS = ("h264:128x128:gop8", "h264:128x128:30fps:gop8", "av1:128x128:gop8", "mjpeg:128x128")
SIZE = 128
GRAIN = 8  # noise amplitude: ~24 Mbit/s at 720p60, a high-quality recorder setting


def make_source(out: Path, seconds: float) -> Path:
    path = out / f"source-720p60-{seconds:g}s-grain{GRAIN}.mp4"
    if not path.exists():
        out.mkdir(parents=True, exist_ok=True)
        spec = VideoSpec(1280, 720, 60, 60)
        n = round(seconds * 60)
        encode_video(path, frames(spec, n, np.random.default_rng(0), noise=GRAIN), spec)
    return path


def cut(path: Path, spec: str | None) -> tuple[list[bytes], float, int]:
    """(clips, seconds of wall time, source frames)."""
    t = time.perf_counter()
    report = DemuxReport()
    with VideoSource(path, audio=False, transcode=spec) as src:
        clips = [c.data for c in src.clips(2.0, report)]
    return clips, time.perf_counter() - t, report.packets


def decode_at(clips: list[bytes], size: int) -> tuple[int, float]:
    """Loader-style: every frame decoded, resized to size x size RGB, to numpy. (frames, seconds)."""
    import av
    from av.video.reformatter import VideoReformatter

    n, t = 0, time.perf_counter()
    for data in clips:
        with av.open(io.BytesIO(data)) as c:
            s = c.streams.video[0]
            s.thread_type = "AUTO"
            rgb = VideoReformatter()  # one scaler per clip, as the loader does
            for frame in c.decode(s):
                rgb.reformat(frame, width=size, height=size, format="rgb24", threads=SWSCALE_THREADS).to_ndarray()
                n += 1
    return n, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "transcode")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    source = make_source(args.out, args.seconds)
    rows = []
    for spec in (None, *SPECS):
        cuts = [cut(source, spec) for _ in range(args.rounds)]
        clips, _, source_frames = cuts[0]
        assert all(c[0] == clips for c in cuts), f"{spec}: clips differ between runs"  # determinism, for free
        runs = [decode_at(clips, SIZE) for _ in range(args.rounds)]
        rows.append(
            (
                spec or "remux (720p60 h264)",
                statistics.median(source_frames / c[1] for c in cuts),
                runs[0][0],
                statistics.median(n / s for n, s in runs),
                sum(map(len, clips)),
            )
        )
    base = rows[0][3]
    load = f", load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores" if hasattr(os, "getloadavg") else ""
    print(
        f"\n`{' '.join([Path(sys.executable).name, *sys.argv])}`  ({args.seconds:g} s of 720p60, 2 s clips, "
        f"medians of {args.rounds} rounds{load})\n"
    )
    print("| clips | convert: source frames/s | frames | loader decode@128x128 frames/s | vs remux | bytes |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, enc, n, dec, size in rows:
        print(f"| {name} | {enc:,.0f} | {n} | {dec:,.0f} | {dec / base:.1f}x | {size:,} |")


if __name__ == "__main__":
    main()
