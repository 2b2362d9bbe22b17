"""The simulated training step, and host->device copy bandwidth.

On CUDA the step is real GPU work: a float16 matmul repeated a calibrated number of times so one step
takes ``ms`` milliseconds, plus a reduction over every tensor of the batch (so the step depends on the
copy), timed with CUDA events; the GPU's busy time comes from those events, not from assumptions. On CPU
the step is ``time.sleep`` (it releases the GIL, as a GPU-bound step leaves the host free), and the GPU
figures are reported as None with the reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from dsbuild.bench.stats import Spread, summarise
from dsbuild.core.records import Record

NO_CUDA = "no CUDA device: runs on CPU (the step is time.sleep; a CPU build of torch cannot pin memory)"
H2D_MAX = 256 << 20  # copies this large already run at the link's full rate
MATMUL_N = 4096  # ~0.14 TFLOP per matmul: well above launch overhead, small enough to calibrate finely


@dataclass(frozen=True, slots=True)
class StepInfo(Record):
    """What the simulated step is: none, a sleep (CPU) or a calibrated matmul (CUDA)."""

    kind: str  # none | sleep | matmul
    ms: float
    matmul_ms: float | None = None  # one MATMUL_N x MATMUL_N float16 matmul, measured
    repeats: int | None = None  # matmuls per step
    gpu: str | None = None


class Step:
    """``step(batch)`` takes about ``ms`` milliseconds on ``device`` ("cuda..." or anything else: sleep)."""

    def __init__(self, ms: float, device: str | None):
        self.ms = ms
        self.device = device
        self.cuda = bool(device and device.startswith("cuda"))
        self.repeats = 0
        self.gpu_busy_s = 0.0

    def prepare(self) -> StepInfo:
        """Calibrate the matmul count on CUDA; describe the step."""
        if not self.cuda or self.device is None or self.ms <= 0:  # (cuda is set with a device only)
            return StepInfo("sleep" if self.ms > 0 else "none", self.ms)
        import torch

        dev = torch.device(self.device)
        self.torch = torch
        self.a = torch.randn(MATMUL_N, MATMUL_N, device=dev, dtype=torch.float16)
        self.b = torch.randn(MATMUL_N, MATMUL_N, device=dev, dtype=torch.float16)
        self.c = torch.empty(MATMUL_N, MATMUL_N, device=dev, dtype=torch.float16)
        for _ in range(5):
            torch.mm(self.a, self.b, out=self.c)
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n = 50
        start.record()
        for _ in range(n):
            torch.mm(self.a, self.b, out=self.c)
        end.record()
        end.synchronize()
        per = start.elapsed_time(end) / n
        self.repeats = max(1, round(self.ms / per))
        return StepInfo("matmul", self.ms, per, self.repeats, torch.cuda.get_device_name(dev))

    def __call__(self, batch: dict) -> None:
        if self.ms <= 0:
            return
        if not self.cuda:
            time.sleep(self.ms / 1000)
            return
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(self.repeats):
            torch.mm(self.a, self.b, out=self.c)
        for v in batch.values():
            if isinstance(v, torch.Tensor) and v.is_cuda:
                v.sum()
        end.record()
        end.synchronize()  # a training loop that logs its loss syncs once per step
        self.gpu_busy_s += start.elapsed_time(end) / 1000


@dataclass(frozen=True, slots=True)
class H2D(Record):
    """Host->device copy bandwidth (None on CPU, with the reason)."""

    bytes: int
    pinned_gb_per_s: Spread | None
    pageable_gb_per_s: Spread | None
    reason: str | None


def h2d_bandwidth(device: str | None, nbytes: int, repeats: int = 10) -> H2D:
    """Host->device GB/s from pinned and from pageable memory (alternating copies of one batch's size)."""
    if not (device and device.startswith("cuda")):
        return H2D(min(nbytes, H2D_MAX), None, None, NO_CUDA)
    import torch

    dev = torch.device(device)
    nbytes = min(max(1 << 20, nbytes), H2D_MAX)
    pageable = torch.ones(nbytes, dtype=torch.uint8)
    pinned = torch.ones(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    rates: dict[str, list[float]] = {"pinned": [], "pageable": []}
    for i in range(repeats + 2):
        for kind, src in (("pinned", pinned), ("pageable", pageable)):
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=kind == "pinned")
            torch.cuda.synchronize(dev)
            if i >= 2:  # the first copies pay for lazy setup
                rates[kind].append(nbytes / (time.perf_counter() - t0) / 1e9)
    return H2D(nbytes, summarise(rates["pinned"]), summarise(rates["pageable"]), None)
