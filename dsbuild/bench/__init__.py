"""`dsbuild bench`: will the input pipeline keep the accelerators fed on this dataset version?

    from dsbuild.bench import BenchOptions, run_bench
    report = run_bench(BenchOptions("catalog@v3", step_ms=50, duration=20))

Our loader is measured against baselines in the same run (a raw read of the same shards, a plain PyAV
decode loop, the webdataset library's pipeline), in short interleaved rounds, reported as medians with
spread; a step-time decomposition comes from the loader's own per-stage timestamps.
"""

from dsbuild.bench.options import BenchOptions
from dsbuild.bench.run import run_bench

__all__ = ["BenchOptions", "run_bench"]
