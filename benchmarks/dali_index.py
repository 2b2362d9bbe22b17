"""What DALI's index files save at start-up: ``fn.readers.webdataset`` pipeline build time with the
``--to dali`` export's ``.idx`` files and without them (DALI then parses every tar to make its own).

    .venv/bin/python benchmarks/dali_index.py [--out bench-out/dali-index] [--sessions 30] [--seconds 5]
        [--shard-bytes 1000000] [--rounds 5]

Needs the ``dali`` extra. Generates (once, cached) ``sessions`` tiny captures (64x48, 30 fps, a keyframe
every 0.5 s), converts them into 0.5 s clips (``sessions * seconds * 2`` samples) in shards of about
``shard-bytes``, exports them with ``--to dali``, then builds a CPU pipeline (``device_id=None``, lazy
init off, so the build opens every tar) ``rounds`` times each way, alternating, and prints the median
build time of each and the export's time. Page cache warm: a cold cache adds the reads of every tar
header to the no-index figure only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dsbuild.convert import ConvertConfig, convert  # noqa: E402
from dsbuild.core.executor import ExecutorSpec  # noqa: E402
from dsbuild.export import export  # noqa: E402
from dsbuild.samples.synthetic import generate, session_spec  # noqa: E402
from dsbuild.samples.writer import VideoSpec  # noqa: E402


def dataset(out: Path, sessions: int, seconds: float, shard_bytes: int) -> tuple[Path, float]:
    """The export folder (made once) and the seconds its export took (0 when cached)."""
    dest = out / "export"
    if (dest / "train.json").is_file():
        return dest, 0.0
    specs = [dataclasses.replace(session_spec(3, i, seconds), video=VideoSpec(64, 48, 30, 15)) for i in range(sessions)]
    generate(out / "captures", sessions=sessions, seconds=seconds, seed=3, specs=specs)
    r = convert(
        out / "captures",
        out / "catalog",
        ConvertConfig(clip_seconds=0.5, shard_size=shard_bytes),
        executor=ExecutorSpec(workers=2),
    )
    t = time.perf_counter()
    export(f"{out / 'catalog'}@{r.version_id}", dest, to="dali")
    return dest, time.perf_counter() - t


def build_seconds(dest: Path, doc: dict, indexed: bool) -> float:
    from nvidia.dali import fn, pipeline_def

    # (DALI's stubs type device_id as int; None, documented, makes the CPU-only pipeline)
    @pipeline_def(batch_size=8, num_threads=2, device_id=None, prefetch_queue_depth=1)  # type: ignore[call-overload]
    def pipe():
        index = {"index_paths": [str(dest / p) for p in doc["index_paths"]]} if indexed else {}
        return tuple(fn.readers.webdataset(paths=[str(dest / p) for p in doc["paths"]], ext=doc["ext"], **index))

    p = pipe()
    t = time.perf_counter()
    p.build()
    took = time.perf_counter() - t
    del p
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "dali-index")
    ap.add_argument("--sessions", type=int, default=30)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--shard-bytes", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    dest, export_s = dataset(a.out, a.sessions, a.seconds, a.shard_bytes)
    doc = json.loads((dest / "train.json").read_text())
    tar_bytes = sum((dest / p).stat().st_size for p in doc["paths"])
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(a.rounds):
        for indexed in (True, False):
            times[indexed].append(build_seconds(dest, doc, indexed))
    print(f"{doc['samples']} samples in {len(doc['paths'])} tars ({tar_bytes:,} bytes); export {export_s:.2f} s")
    print("| index files | pipeline build, median of", a.rounds, "(s) |")
    print("|---|---|")
    for indexed in (True, False):
        print(f"| {'yes' if indexed else 'no (DALI parses each tar)'} | {statistics.median(times[indexed]):.4f} |")


if __name__ == "__main__":
    main()
