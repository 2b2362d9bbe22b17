"""Peak memory of convert on a long session with a wide telemetry stream: memory must not follow length.

    .venv/bin/python benchmarks/streams_memory.py [--minutes 30] [--out bench-out/streams]

Builds (once, cached) one capture session of MINUTES at 60 Hz: a tiny 64x48 H.264 video (a keyframe
every 2 s), 133-channel telemetry per frame (a 128-byte RAM dump plus 5 scalars, ~74 MB of JSONL for
30 min), and button events. Then runs `convert --workers 1` as its own process (the worker is that
process) for the full session and for a 1/6 cut of it, and reports each run's peak RSS. Memory that
grows with the session would show as a ratio near the length ratio (6x); a window-bounded reader
shows nearly the same peak for both.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from convert import as_installed, launched, launched_peak  # noqa: E402

from dsbuild.samples.writer import VideoSpec, encode_video  # noqa: E402

FPS = 60


def make_session(folder: Path, minutes: float) -> int:
    import numpy as np

    marker = folder / ".complete"
    if marker.exists():
        return sum(p.stat().st_size for p in folder.iterdir())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    n = int(minutes * 60 * FPS)
    rng = np.random.default_rng(1)
    frame = np.zeros((48, 64, 3), np.uint8)

    def frames():
        for i in range(n):
            frame[:, :, 0] = i % 256
            yield frame

    encode_video(folder / "video.mp4", frames(), VideoSpec(64, 48, FPS, 2 * FPS))
    ram = rng.integers(0, 256, size=128)
    with open(folder / "telemetry.jsonl", "w") as f:
        for i in range(n):
            ram[i % 128] = (ram[i % 128] + 1) % 256
            f.write(
                json.dumps(
                    {
                        "t": i / FPS,
                        "ram": ram.tolist(),
                        "score": i // 7,
                        "lives": 3,
                        "frame": i,
                        "reward": i % 3,
                        "episode": i // 5000,
                    },
                    separators=(",", ":"),
                )
                + "\n"
            )
    with open(folder / "actions.jsonl", "w") as f:
        for i in range(0, n, 7):
            f.write(json.dumps({"t": i / FPS, "control": "FIRE", "value": float(i % 2)}) + "\n")
    (folder / "session.json").write_text(
        json.dumps(
            {
                "format": "capture/1",
                "session_id": "long-0001",
                "title": "Breakout",
                "player": "p-1",
                "video": "video.mp4",
                "streams": {"actions": "actions.jsonl", "telemetry": "telemetry.jsonl"},
            }
        )
    )
    marker.touch()
    return sum(p.stat().st_size for p in folder.iterdir())


def cut(src: Path, dst: Path, fraction: float) -> None:
    """The first ``fraction`` of the session's streams (same video: the streams are what is measured)."""
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    shutil.copy(src / "video.mp4", dst / "video.mp4")
    shutil.copy(src / "session.json", dst / "session.json")
    for name in ("telemetry.jsonl", "actions.jsonl"):
        lines = (src / name).read_bytes().splitlines(keepends=True)
        (dst / name).write_bytes(b"".join(lines[: int(len(lines) * fraction)]))


def peak_rss(captures: Path, out: Path) -> tuple[float, int, float]:
    """(peak RSS in MB, samples, seconds) of `dsbuild convert --workers 1` in its own process."""
    shutil.rmtree(out, ignore_errors=True)
    code = (
        "import sys, json; from dsbuild.convert import convert, ConvertConfig; "
        "from dsbuild.core.executor import ExecutorSpec; "
        "r = convert(sys.argv[1], sys.argv[2], ConvertConfig(clip_seconds=8.0), executor=ExecutorSpec(workers=1)); "
        "print(json.dumps({'samples': r.samples, 'quarantined': len(r.quarantined)}))"
    )
    t = time.perf_counter()
    proc = subprocess.run(
        launched([sys.executable, "-c", code, str(captures), str(out)]),
        capture_output=True,
        text=True,
        env={**os.environ, "DSBUILD_HASH_CACHE": "0"},
    )
    if proc.returncode:
        raise SystemExit(f"convert failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    result = json.loads(proc.stdout)
    assert result["quarantined"] == 0, result
    return launched_peak(proc.stderr) / 2**20, result["samples"], time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--out", default=str(ROOT / "bench-out" / "streams"))
    a = ap.parse_args()
    as_installed()
    out = Path(a.out)
    full = out / "caps-full" / "s"
    size = make_session(full, a.minutes)
    short = out / "caps-short" / "s"
    cut(full, short, 1 / 6)
    tel = (full / "telemetry.jsonl").stat().st_size
    rss_full, n_full, s_full = peak_rss(full.parent, out / "cat-full")
    rss_short, n_short, s_short = peak_rss(short.parent, out / "cat-short")
    print(
        f"session: {a.minutes:g} min at {FPS} Hz, 133 telemetry channels, {tel / 1e6:.1f} MB telemetry JSONL, "
        f"{size / 1e6:.1f} MB in all\n"
    )
    print("| streams | samples | peak RSS | seconds |")
    print("|---|---|---|---|")
    print(f"| full ({a.minutes:g} min) | {n_full} | {rss_full:.0f} MB | {s_full:.1f} |")
    print(f"| first 1/6 | {n_short} | {rss_short:.0f} MB | {s_short:.1f} |")
    print(f"\nfull / one sixth peak RSS: {rss_full / rss_short:.2f}x (streams 6x longer)")
    print(f"command: .venv/bin/python benchmarks/streams_memory.py --minutes {a.minutes:g}")


if __name__ == "__main__":
    main()
