"""`dsbuild bench`: will the input pipeline keep the accelerators fed on this dataset version?

    from dsbuild.bench import Against, BenchOptions, enforce, load_report, run_bench
    report = run_bench(BenchOptions("catalog@v3", split="main/train", resize=(96, 96), duration=20))
    against = Against(load_report("base.json"), "base.json", fail_below=0.9)
    gated = run_bench(options, against=against)
    enforce(gated, against)  # CheckFailed on a regression; UsageError if too few rounds finished to judge

Our loader is measured against baselines doing the same work in the same run (a bare PyAV decode loop in
frames mode; a raw read, the sha256 floor, the webdataset library and the peer loaders in bytes mode), in
interleaved rounds within one wall budget, reported as medians with quartiles and per-round ratios; the
stage decomposition comes from the loader's own per-thread timestamps. ``dsbuild.bench.html.render``
draws the report as one self-contained page.
"""

from dsbuild.bench.gate import Against, enforce
from dsbuild.bench.options import BenchOptions
from dsbuild.bench.report import BenchReport
from dsbuild.bench.report import load as load_report
from dsbuild.bench.run import BenchInterrupted, Event, run_bench

__all__ = ["Against", "BenchInterrupted", "BenchOptions", "BenchReport", "Event", "enforce", "load_report", "run_bench"]
