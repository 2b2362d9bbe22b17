"""Catalog operations at scale: 10,000 short sessions and hundreds of versions, as commands.

    .venv/bin/python benchmarks/scale.py [--sessions 10000] [--versions 300] [--shard-size 4MB] [--out bench-out/scale]
    .venv/bin/python benchmarks/scale.py --measure-only   # the read-side commands again, on the catalog built

Builds (once, cached) SESSIONS short capture sessions (2 s of 64x48 video, a few action events each),
converts them (`dsbuild convert`, default workers), then adds one session at a time, committing a new
version each time, until the catalog holds VERSIONS versions. Measured, each as a whole command:

- convert from scratch, and +1 session (wall seconds, shards and bytes written);
- log, info, diff (newest vs its parent), query, verify (newest), split, and the loader's time to the
  first batch, at the first version and at the last, to show what grows with the history and what
  grows only with what a command touches.

Prints a markdown table and the command that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from convert import as_installed  # noqa: E402

DSBUILD = [sys.executable, "-c", "from dsbuild.cli.app import main; main()"]


def make_captures(root: Path, sessions: int) -> None:
    """SESSIONS sessions sharing one tiny encoded video (copied, so each file has its own inode)."""
    import numpy as np

    from dsbuild.samples.writer import VideoSpec, encode_video

    marker = root / f".complete-{sessions}"
    if marker.exists():
        return
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    video = root.parent / "video.mp4"
    frame = np.zeros((48, 64, 3), np.uint8)
    encode_video(video, (frame + i for i in range(60)), VideoSpec(64, 48, 30, 30))
    for i in range(sessions):
        add_session(root, i, video)
    marker.touch()


def add_session(root: Path, i: int, video: Path) -> None:
    d = root / f"s{i // 1000:02d}" / f"s-{i:06d}"
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(video, d / "video.mp4")
    (d / "actions.jsonl").write_text(
        "".join(json.dumps({"t": t / 10, "control": "a", "value": float(t % 2)}) + "\n" for t in range(i % 7 + 1))
    )
    (d / "session.json").write_text(
        json.dumps(
            {
                "format": "capture/1",
                "session_id": f"s-{i:06d}",
                "title": f"Game {i % 5}",
                "player": f"p-{i % 97}",
                "video": "video.mp4",
                "streams": {"actions": "actions.jsonl"},
            }
        )
    )


def timed(*args: str, env: dict | None = None) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run([*DSBUILD, *args], capture_output=True, text=True, env={**os.environ, **(env or {})})
    if proc.returncode:
        raise SystemExit(f"dsbuild {' '.join(args)} failed: {proc.stderr.strip()[:400]}")
    return time.perf_counter() - t, proc.stdout


FIRST_BATCH = """
import sys, time
t = time.perf_counter()
from dsbuild.loader import Loader
next(iter(Loader(sys.argv[1], decode="bytes", batch_size=8, seed=0)))
print(time.perf_counter() - t)
"""


def commands(cat: Path, repeat: int = 1) -> dict[str, float]:
    """Seconds of each read-side command against the newest version (the median of ``repeat`` runs)."""
    entries = json.loads(timed("log", str(cat), "--json")[1])["versions"]
    runs = {"log": ["log", str(cat), "--json"], "info": ["info", str(cat), "--json"]}
    if len(entries) > 1:
        runs["diff"] = ["diff", f"{cat}@{entries[1]['version_id']}", f"{cat}@{entries[0]['version_id']}", "--json"]
    runs["query"] = ["query", str(cat), "select title, count(*) from samples group by title", "--json"]
    runs["verify"] = ["verify", str(cat), "--json"]
    out = {name: statistics.median(timed(*args)[0] for _ in range(repeat)) for name, args in runs.items()}
    out["split"] = statistics.median(
        timed("split", str(cat), "--name", f"bench{len(entries)}-{k}", "--by", "player", "--json")[0]
        for k in range(repeat)
    )

    def first_batch() -> float:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", FIRST_BATCH, str(cat)], check=True, capture_output=True)
        return time.perf_counter() - t

    out["loader first batch"] = statistics.median(first_batch() for _ in range(repeat))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--versions", type=int, default=300)
    ap.add_argument("--shard-size", default="4MB", help="small shards, so +1 session can touch few of them")
    ap.add_argument("--out", default=str(ROOT / "bench-out" / "scale"))
    ap.add_argument("--repeat", type=int, default=1, help="runs of each read-side command (the median is shown)")
    ap.add_argument(
        "--measure-only",
        action="store_true",
        help="time the read-side commands on the catalog an earlier run left in --out; build nothing",
    )
    a = ap.parse_args()
    as_installed()
    out = Path(a.out)
    if a.measure_only:
        cat = out / "catalog"
        n = len(json.loads(timed("log", str(cat), "--json")[1])["versions"])
        print(f"| what | at version {n} (catalog of an earlier run) |\n|---|---|")
        for name, secs in commands(cat, a.repeat).items():
            print(f"| {name} | {secs:.2f} s |")
        print(f"\ncommand: .venv/bin/python benchmarks/scale.py --measure-only --repeat {a.repeat} --out {a.out}")
        return
    caps = out / "captures"
    make_captures(caps, a.sessions)
    cat = out / "catalog"
    shutil.rmtree(cat, ignore_errors=True)
    t, stdout = timed("convert", str(caps), str(cat), "--clip-seconds", "2", "--shard-size", a.shard_size, "--json")
    first = json.loads(stdout)
    at_first = commands(cat)
    video = out / "video.mp4"
    increments = []
    for v in range(1, a.versions):
        add_session(caps, a.sessions + v, video)
        secs, stdout = timed(
            "convert", str(caps), str(cat), "--clip-seconds", "2", "--shard-size", a.shard_size, "--json"
        )
        r = json.loads(stdout)
        increments.append((secs, r["written_shards"], r["written_bytes"]))
    at_last = commands(cat)
    med = statistics.median
    print(
        f"{a.sessions} sessions ({first['samples']} samples, {first['shards']} shards, "
        f"{first['bytes'] / 1e6:.0f} MB), then {a.versions} versions adding one session each\n"
    )
    print(f"| what | at version 1 | at version {a.versions} |")
    print("|---|---|---|")
    print(f"| convert from scratch | {t:.1f} s | |")
    if increments:
        print(
            f"| convert +1 session (median) | {med(x[0] for x in increments[:5]):.2f} s "
            f"| {med(x[0] for x in increments[-5:]):.2f} s |"
        )
        print(
            f"| shards written for +1 session (median, max) | {med(x[1] for x in increments):.0f}, "
            f"{max(x[1] for x in increments)} | |"
        )
        print(
            f"| bytes written for +1 session (median) | {med(x[2] for x in increments) / 1e3:.0f} kB "
            f"(of {first['bytes'] / 1e6:.0f} MB) | |"
        )
    for name in at_last:
        before = f"{at_first[name]:.2f} s" if name in at_first else "-"
        print(f"| {name} | {before} | {at_last[name]:.2f} s |")
    print(
        f"\ncommand: .venv/bin/python benchmarks/scale.py --sessions {a.sessions} --versions {a.versions} "
        f"--shard-size {a.shard_size}"
    )


if __name__ == "__main__":
    main()
