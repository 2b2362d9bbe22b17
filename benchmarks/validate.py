"""Validation cost against the floor of the same work without our logic: whole commands, one run.

    .venv/bin/python benchmarks/validate.py [--out bench-out/validate] [--rounds 3] [--workers 2] [--copies 4]

Builds (once, cached) two WebDataset catalogs from the convert benchmark's 720p30 H.264 captures with
grain (2 s clips): A holds them once (the decode comparison), B holds ``--copies`` copies under other
session ids (about 1 GB, the hashing comparison). Each round runs, interleaved, every command below as
its own process (interpreter start and imports included), all from the page cache (a warm-up read
comes first):

  sha256      hashlib over every shard of B in W threads               floor of --level structural
  structural  validate --level structural on B, W workers (library entry point below)
  decode      a bare PyAV loop decoding every clip of A, W processes   floor of --level full
  full        validate --level full on A, W workers

Ratios are floor time / our time (1.0 = as fast as the floor), per round and of the medians, for wall
time and for CPU time (the command and the workers it waited for: steadier on a shared machine). Prints a
markdown table with each command. ``--cli`` times ``dsbuild validate`` instead of the library entry point.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
ME = str(Path(__file__).resolve())


def make_catalogs(out: Path, copies: int) -> tuple[Path, Path]:
    """(A, B): the convert benchmark's captures converted once, and ``copies`` times under other ids."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from convert import make_captures

    from dsbuild.convert import ConvertConfig, convert
    from dsbuild.core.executor import ExecutorSpec

    caps = ROOT / "bench-out" / "convert" / "720p" / "captures"  # the convert benchmark's 720p set
    make_captures(caps, "720p")
    a, b, many = out / "catalog-a", out / "catalog-b", out / "captures-b"
    if not (a / "catalog.json").exists():
        convert(caps, a, ConvertConfig(clip_seconds=2.0), executor=ExecutorSpec(workers=2))
    if not (b / "catalog.json").exists():
        shutil.rmtree(many, ignore_errors=True)
        for n in range(copies):
            for session in sorted(p.parent for p in caps.rglob("session.json")):
                dst = many / f"{session.name}-{n}"
                shutil.copytree(session, dst)
                doc = json.loads((dst / "session.json").read_text())
                (dst / "session.json").write_text(json.dumps({**doc, "session_id": f"{doc['session_id']}-{n}"}))
        convert(many, b, ConvertConfig(clip_seconds=2.0), executor=ExecutorSpec(workers=2))
    return a, b


# -- the commands (each runs as its own process) -----------------------------------------------------
def floor_sha256(catalog: str, threads: int) -> None:
    from dsbuild.core.hashing import sha256_file  # hashlib over 4 MiB reads, nothing else

    shards = sorted(Path(catalog, "shards").rglob("*.*"))
    with ThreadPoolExecutor(threads) as pool:  # hashlib frees the GIL: threads use every core
        list(pool.map(sha256_file, shards))


def _decode(ranges: list) -> int:
    import av

    frames = 0
    for path, offset, length in ranges:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(length)
        # opened as validate opens clips (formats.probe.STORED_OPEN, written out: the floor imports no
        # dsbuild module): as MP4, without FFmpeg's probing decode of the first frame
        with av.open(io.BytesIO(data), format="mp4", options={"probesize": "32", "skip_frame": "all"}) as c:
            s = c.streams.video[0]
            s.thread_type = "AUTO"
            for _ in c.decode(s):
                frames += 1
    return frames


def floor_decode(ranges_file: str, workers: int) -> None:
    ranges = json.loads(Path(ranges_file).read_text())
    chunks = [ranges[i :: workers * 4] for i in range(workers * 4)]
    with ProcessPoolExecutor(workers, mp_context=get_context("fork")) as pool:
        print(sum(pool.map(_decode, chunks)))


def run_validate(catalog: str, level: str, workers: int) -> None:
    from dsbuild.core.executor import ExecutorSpec
    from dsbuild.validators import ValidateOptions, validate

    report = validate(catalog, None, options=ValidateOptions(level=level), executor=ExecutorSpec(workers=workers))
    print(
        json.dumps(
            {
                "verdict": report.verdict,
                "decoded_frames": report.summary.decoded_frames,
                "failed": [c.name for c in report.checks if c.failed],
            }
        )
    )


# -- the harness -------------------------------------------------------------------------------------
def clip_ranges(catalog: Path) -> list[tuple[str, int, int]]:
    """(shard file, offset, length) of every clip's video payload, from the index (outside the timing)."""
    from dsbuild.formats.sample import MEMBERS
    from dsbuild.formats.webdataset import payload_offsets
    from dsbuild.lineage.catalog import Catalog
    from dsbuild.lineage.index import rows_from_table

    cat = Catalog.open(catalog)
    vid = cat.resolve(None)
    video = MEMBERS.index("mp4")
    out = []
    for r in rows_from_table(cat.index(vid)):
        start = r.byte_offset + payload_offsets(r.member_bytes)[video]
        out.append((str(catalog / r.shard), start, r.member_bytes[video]))
    return out


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the command and of the workers it waited for, stdout). CPU time is
    the steadier figure on a shared machine; the wall time is the one a user waits."""
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, cwd=ROOT)
        stdout = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stdout.close()
        if proc.returncode not in (0, 1):
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err.read().decode()[-2000:]}")
    return elapsed, usage.ru_utime + usage.ru_stime, stdout.decode()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench-out" / "validate"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--cli", action="store_true", help="time `dsbuild validate` instead of the library entry point")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from convert import as_installed

    as_installed()
    out = Path(args.out)
    a, b = make_catalogs(out, args.copies)
    ranges = out / "ranges.json"
    ranges.write_text(json.dumps(clip_ranges(a)))
    w = str(args.workers)

    def ours(cat: Path, level: str) -> list[str]:
        if args.cli:
            return [str(Path(PY).parent / "dsbuild"), "validate", str(cat), "--level", level, "--workers", w, "--json"]
        return [PY, ME, "validate", str(cat), level, w]

    commands = {
        "sha256": [PY, ME, "sha256", str(b), w],
        "structural": ours(b, "structural"),
        "decode": [PY, ME, "decode", str(ranges), w],
        "full": ours(a, "full"),
    }
    floor_sha256(str(b), 2)  # warm the page cache
    floor_sha256(str(a), 2)
    times: dict[str, list[float]] = {k: [] for k in commands}
    cpu: dict[str, list[float]] = {k: [] for k in commands}
    outputs = {}
    for _ in range(args.rounds):
        for name, cmd in commands.items():
            t, c, outputs[name] = timed(cmd)
            times[name].append(t)
            cpu[name].append(c)
    med = {k: statistics.median(v) for k, v in times.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    per_round = {
        pair: round(statistics.median(f / o for f, o in zip(times[pair[0]], times[pair[1]])), 3)
        for pair in (("sha256", "structural"), ("decode", "full"))
    }
    size = {cat: sum(p.stat().st_size for p in Path(cat, "shards").rglob("*") if p.is_file()) for cat in (a, b)}
    frames = int(outputs["decode"].split()[0])
    rel = {
        "sha256": ("structural", size[b] / 1e6, "MB/s"),
        "structural": ("structural", size[b] / 1e6, "MB/s"),
        "decode": ("full", frames, "frames/s"),
        "full": ("full", frames, "frames/s"),
    }
    print(
        f"validate benchmark: {len(json.loads(ranges.read_text()))} clips / {frames} frames of 720p30 in A "
        f"({size[a] / 1e6:.0f} MB), {size[b] / 1e6:.0f} MB in B; {args.workers} workers; {args.rounds} rounds; "
        f"verdicts {outputs['structural'].strip()} / {outputs['full'].strip()}\n"
    )
    print(
        "| measurement | command | median wall s | rate | floor wall / our wall | median CPU s | floor CPU / our CPU |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, cmd in commands.items():
        shown = " ".join(Path(x).name if x in (PY, ME) or x.startswith(str(out)) else x for x in cmd)
        level, amount, unit = rel[name]
        ratio = (
            "1 (floor)"
            if name in ("sha256", "decode")
            else (
                f"**{med['sha256' if level == 'structural' else 'decode'] / med[name]:.3f}** "
                f"(per-round median {per_round[('sha256', 'structural') if level == 'structural' else ('decode', 'full')]})"
            )
        )
        floor = "sha256" if level == "structural" else "decode"
        cpu_ratio = "1 (floor)" if name == floor else f"{cpu_med[floor] / cpu_med[name]:.3f}"
        print(
            f"| {name} | `{shown}` | {med[name]:.3f} | {amount / med[name]:,.0f} {unit} | {ratio} | "
            f"{cpu_med[name]:.2f} | {cpu_ratio} |"
        )
    print("\nall rounds, wall s: " + json.dumps({k: [round(x, 3) for x in v] for k, v in times.items()}))
    print("all rounds, CPU s: " + json.dumps({k: [round(x, 2) for x in v] for k, v in cpu.items()}))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("sha256", "decode", "validate"):
        what, *rest = sys.argv[1:]
        if what == "sha256":
            floor_sha256(rest[0], int(rest[1]))
        elif what == "decode":
            floor_decode(rest[0], int(rest[1]))
        else:
            run_validate(rest[0], rest[1], int(rest[2]))
    else:
        main()
