"""A bench run: ours and the baselines in short interleaved rounds, then one report.

The measured time (``duration``) is cut into equal slices: per round, one for our loader's throughput,
one for the training simulation (when ``step_ms`` > 0) and one per baseline. Rounds run the
measurements in a rotated order, so none always runs first (cold cache, CPU boost). Every figure is a
median over rounds with min/max; every ratio is the median of per-round ratios.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from dsbuild.bench.baselines import make
from dsbuild.bench.dataset import Dataset, describe
from dsbuild.bench.harness import Progress, Ticker, measure_ours
from dsbuild.bench.options import BenchOptions
from dsbuild.bench.summary import rotate
from dsbuild.core.errors import UsageError


def resolve(device: str) -> str | None:
    """'auto' -> cuda or cpu (torch tensors); numpy (None) when torch is missing and 'auto' was asked."""
    try:
        import torch  # noqa: F401
    except ImportError:
        if device == "auto":
            return None
        raise UsageError(f"--device {device} needs torch: pip install 'dsbuild[torch]' (or --device auto)") from None
    from dsbuild.loader.device import resolve_device

    return resolve_device(device)


def batch_bytes(o: BenchOptions, data: Dataset) -> int:
    """Bytes of one batch as it crosses to the device (frames, or encoded clips): sizes the H2D test."""
    if o.decode == "bytes":
        mean = sum(data.sample_bytes.values()) / max(1, len(data.sample_bytes))
        return int(o.batch_size * mean)
    h, w = o.resize or max(data.resolutions, key=lambda r: r[0] * r[1])[::-1]
    frames = sum(s.frames for s in data.shards) / max(1, sum(s.samples for s in data.shards))
    return int(o.batch_size * frames * h * w * 3)


def run_bench(o: BenchOptions, progress: Progress | None = None) -> dict:
    """Measure (see the module docstring) and return the report (``dsbuild.bench.report.build``).

    With ``ranks`` > 1 the ranks are spawned processes: a script calling this needs the usual
    ``if __name__ == "__main__":`` guard (the ``dsbuild`` command has it)."""
    from dsbuild.bench.report import build
    from dsbuild.bench.step import Step, h2d_bandwidth

    started = time.time()
    data = describe(o.ref, o.split)
    device = resolve(o.device)
    threads = o.threads * o.ranks
    baselines = {name: make(name, data, threads, o.resize, o.decode) for name in o.compare}
    skipped = {name: b.skip() for name, b in baselines.items() if b.skip()}
    active = [name for name in baselines if name not in skipped]
    units = 1 + (o.step_ms > 0) + len(active)
    slice_s = o.duration / (o.rounds * units)
    step = Step(o.step_ms, device)
    calibration = step.prepare()
    results: dict[str, list[dict]] = {name: [] for name in ["ours", *active]}
    group = None
    if o.ranks > 1:
        from dsbuild.bench.ranks import RankGroup

        pinned = BenchOptions.from_json({**o.to_json(), "ref": data.ref})
        workdir = Path(tempfile.mkdtemp(prefix="dsbuild-bench-ranks-"))
        group = RankGroup(pinned.to_json(), o.ranks, device, slice_s, o.rounds, workdir)
        group.start()
    try:
        for r in range(o.rounds):
            for name in rotate(["ours", *active], r):
                if progress:
                    progress({"measurement": name, "round": r, "rounds": o.rounds, "start": True,
                              "seconds": slice_s})
                if name != "ours":
                    results[name].append(baselines[name].run(slice_s, Ticker(progress, name, r, slice_s)))
                elif group is not None:
                    group.round(r)
                else:
                    results["ours"].append(measure_ours(o, data, device, step, slice_s, slice_s, round_=r,
                                                        progress=progress))
        per_rank = None
        if group is not None:
            from dsbuild.bench.ranks import combine

            per_rank = group.finish()
            results["ours"] = [combine([rounds[r] for rounds in per_rank]) for r in range(o.rounds)]
    except BaseException:
        if group is not None:
            group.stop()
        raise
    finally:
        if group is not None:
            import shutil

            shutil.rmtree(group.workdir, ignore_errors=True)
    h2d = h2d_bandwidth(device, batch_bytes(o, data))
    return build(o, data, device, calibration, results, skipped, per_rank, h2d, slice_s,
                 started=started, seconds=time.time() - started)
