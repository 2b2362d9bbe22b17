"""`dsbuild convert` as a whole command against the copy floor, on three capture shapes, in one run.

    .venv/bin/python benchmarks/convert.py [--rounds 3] [--sets small,atari,720p] [--out bench-out/convert]

Capture sets (generated once, cached under --out):
  small : 60 sessions x 10 s of 320x240 H.264 with grain, converted into 1-s clips (the field's shape:
          many short clips, where per-clip costs dominate);
  atari : real Atari gameplay recorded with ale-py (Breakout, Pong, MsPacman; 3 sessions each, 20 s,
          upscaled x2), 1-s clips; skipped when the `atari` extra is not installed;
  720p  : 8 sessions x 6 s of 1280x720 H.264 with heavy grain, 2-s clips.

Per round, interleaved: the floor, then `dsbuild convert` (default workers = cores) as a subprocess;
each starts once the file system has written back everything before it (``settle``).
  floor : read every capture byte, sha256 it and write a copy, fsync'd, in one thread per core (hashlib
          releases the GIL): the least any converter that content-addresses its output must do.
Reported: medians, throughput ratio convert/floor, CPU seconds of each (user+sys of the process tree),
peak RSS, and the cost of each convert stage (one in-process profile with one worker, so stages are
not blurred by overlap).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import hashlib
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dsbuild.samples.synthetic import generate, session_spec  # noqa: E402
from dsbuild.samples.writer import VideoSpec  # noqa: E402

DSBUILD = str(Path(sys.executable).with_name("dsbuild"))  # the installed command, as users run it


def as_installed() -> None:
    """Compile dsbuild's bytecode, as ``pip install`` does, before timing its commands: this machine sets
    PYTHONDONTWRITEBYTECODE, under which an editable checkout compiles every module it imports on every
    run (~0.03 s a command) — a cost no installed copy pays."""
    import compileall

    compileall.compile_dir(ROOT / "dsbuild", quiet=1)


SETS = {  # name -> (clip seconds, how to make it)
    "small": 1.0,
    "atari": 1.0,
    "720p": 2.0,
}


def _synthetic(root: Path, sessions: int, seconds: float, video: VideoSpec, noise: int, seed: int) -> None:
    specs = [dataclasses.replace(session_spec(seed, i, seconds), video=video) for i in range(sessions)]
    generate(root, sessions=sessions, seconds=seconds, seed=seed, specs=specs, noise=noise)


def make_captures(root: Path, name: str) -> bool:
    """Generate the set once; False when it cannot be made here (the atari extra is missing)."""
    marker = root / ".complete"
    if marker.exists():
        return True
    shutil.rmtree(root, ignore_errors=True)
    if name == "small":
        _synthetic(root, 60, 10.0, VideoSpec(320, 240, 30, 60), noise=24, seed=5)
    elif name == "720p":
        _synthetic(root, 8, 6.0, VideoSpec(1280, 720, 30, 60), noise=40, seed=9)
    else:
        proc = subprocess.run(
            [
                DSBUILD,
                "samples",
                str(root),
                "--source",
                "atari",
                "--sessions",
                "3",
                "--seconds",
                "20",
                "--upscale",
                "2",
                "--seed",
                "3",
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            print(f"atari set skipped: {proc.stderr.strip()[-300:]}", file=sys.stderr)
            shutil.rmtree(root, ignore_errors=True)
            return False
    marker.touch()
    return True


def _files(src: Path) -> list[Path]:
    return sorted(p for p in src.rglob("*") if p.is_file() and not p.name.startswith("."))


def settle() -> None:
    """Flush the file system's pending writes, outside any timing: each measurement starts with nothing
    left to write back (the previous one's deleted output and journal would land on whoever runs next)."""
    os.sync()
    time.sleep(0.2)


def floor(src: Path, dst: Path, threads: int) -> float:
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    settle()

    def copy(item: tuple[int, Path]) -> str:
        i, p = item
        h = hashlib.sha256()
        with open(p, "rb") as f, open(dst / str(i), "wb") as out:
            while chunk := f.read(4 << 20):
                h.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        return h.hexdigest()

    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(copy, enumerate(_files(src))))
    return time.perf_counter() - t


# Linux records a process's peak RSS across exec: a child forked by this (large) script would report
# this script's size. So the command runs under a bare interpreter (-S -I: ~10 MB) that reports its
# child's peak; the launcher's start-up (~15 ms) counts in the wall time, against us.
LAUNCH = (
    "import os, sys; pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ); "
    "_, status, ru = os.wait4(pid, 0); sys.stderr.write(f'\\npeak_rss_kb {ru.ru_maxrss}\\n'); "
    "sys.exit(os.waitstatus_to_exitcode(status))"
)


def launched(cmd: list[str]) -> list[str]:
    """``cmd`` under the bare launcher; its peak RSS is then ``launched_peak(stderr)``."""
    return [sys.executable, "-S", "-I", "-c", LAUNCH, *cmd]


def launched_peak(stderr: str) -> int:
    """Peak RSS in bytes of a command run through ``launched``, from its stderr."""
    return int(stderr.rsplit("peak_rss_kb ", 1)[1]) * 1024


def run_convert(src: Path, out: Path, clip: float) -> tuple[float, float, int, dict]:
    """(wall seconds of the whole command, CPU seconds of its tree, peak RSS of its largest process, its
    --json report), from wait4 on this command alone (RUSAGE_CHILDREN's peak is the largest child the
    script ever had, so it would carry one set's peak into the next)."""
    shutil.rmtree(out, ignore_errors=True)
    settle()
    cmd = launched([DSBUILD, "convert", str(src), str(out), "--clip-seconds", str(clip), "--json"])
    t = time.perf_counter()
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        proc = subprocess.Popen(cmd, stdout=out_f, stderr=err_f)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        out_f.seek(0)
        err_f.seek(0)
        stdout, stderr = out_f.read().decode(), err_f.read().decode()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"convert failed: {stderr.strip()[-400:]}")
    return wall, usage.ru_utime + usage.ru_stime, launched_peak(stderr), json.loads(stdout)


STAGES = {  # stage -> (file, function) pairs whose cumulative time it is; none nests in another
    "find sessions": [("captures.py", "read_sessions")],
    "parse streams (actions, telemetry, text)": [("session.py", "_stream"), ("streams.py", "clip")],
    "demux + cut video (remux, audio)": [("video.py", "clips")],
    "sample members + sha256": [("sample.py", "members"), ("sample.py", "members_sha256")],
    "events blob (zstd)": [("session.py", "_events_blob")],
    "segment encode": [("webdataset.py", "encode")],
    "shard assembly + sha256": [("assemble.py", "assemble_shard")],
    "manifest, index, commit": [("build.py", "_assemble"), ("catalog.py", "commit")],
}


def stage_costs(src: Path, out: Path, clip: float) -> dict[str, float]:
    """Seconds per stage from one in-process build with one worker (tasks run inline, so cProfile sees
    them, with its overhead); source hashing runs in its own thread and is timed around the call."""
    from dsbuild.convert import ConvertConfig, convert, session
    from dsbuild.core.executor import ExecutorSpec

    shutil.rmtree(out, ignore_errors=True)
    hashing = [0.0]
    original = session.hash_sources

    def timed_hash(*a, **k):
        t = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            hashing[0] += time.perf_counter() - t

    # a first build pays the lazy imports (pyarrow.parquet, duckdb...), which no stage should be billed for
    convert(src, out.with_name(out.name + "-warm"), ConvertConfig(clip_seconds=clip), executor=ExecutorSpec(workers=1))
    shutil.rmtree(out.with_name(out.name + "-warm"))
    session.hash_sources = timed_hash
    prof = cProfile.Profile()
    t = time.perf_counter()
    try:
        prof.enable()
        convert(src, out, ConvertConfig(clip_seconds=clip), executor=ExecutorSpec(workers=1))
        prof.disable()
    finally:
        session.hash_sources = original
    total = time.perf_counter() - t
    cum: dict[tuple[str, str], float] = {}
    for (file, _, name), (_, _, _, ct, _) in pstats.Stats(prof).stats.items():
        key = (Path(file).name, name)
        cum[key] = cum.get(key, 0.0) + ct
    costs = {stage: sum(cum.get(f, 0.0) for f in fns) for stage, fns in STAGES.items()}
    costs["hash sources (own thread, overlaps the rest)"] = hashing[0]
    costs["total (one worker, profiled)"] = total
    return costs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench-out" / "convert"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sets", default="small,atari,720p")
    args = ap.parse_args()
    as_installed()
    out = Path(args.out)
    threads = os.cpu_count() or 1
    report = {"cores": threads, "rounds": args.rounds, "sets": {}}
    for name in args.sets.split(","):
        src = out / name / "captures"
        if not make_captures(src, name):
            report["sets"][name] = "skipped: the atari extra is not installed"
            continue
        clip = SETS[name]
        size = sum(p.stat().st_size for p in _files(src))
        floors, walls, cpus, peak, result = [], [], [], 0, {}
        for _ in range(args.rounds):
            floors.append(floor(src, out / name / "copy", threads))
            wall, cpu, rss, result = run_convert(src, out / name / "catalog", clip)
            walls.append(wall)
            cpus.append(cpu)
            peak = max(peak, rss)
        shutil.rmtree(out / name / "copy", ignore_errors=True)
        med_floor, med_wall = statistics.median(floors), statistics.median(walls)
        report["sets"][name] = {
            "input_bytes": size,
            "sessions": result["sessions"],
            "samples": result["samples"],
            "shards": result["shards"],
            "clip_seconds": clip,
            "floor_seconds": med_floor,
            "convert_seconds": med_wall,
            "floor_mb_per_s": size / med_floor / 1e6,
            "convert_mb_per_s": size / med_wall / 1e6,
            "ratio_convert_over_floor": med_floor / med_wall,
            "convert_cpu_seconds": statistics.median(cpus),
            "convert_peak_rss_bytes": peak,
            "all": {"floor": floors, "convert": walls},
            "stages_seconds": stage_costs(src, out / name / "profiled", clip),
        }
        shutil.rmtree(out / name / "profiled", ignore_errors=True)
    report["command"] = "benchmarks/convert.py " + " ".join(sys.argv[1:])
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
