"""The simulated training step, and host->device copy bandwidth.

On CUDA the step is real GPU work: a float16 matmul repeated a calibrated number of times so one step
takes ``ms`` milliseconds, plus a reduction over every tensor of the batch (so the step depends on the
copy), timed with CUDA events; the GPU's busy time comes from those events, not from assumptions. On CPU
the step is ``time.sleep`` (it releases the GIL, as a GPU-bound step leaves the host free), and the GPU
figures are reported as None with the reason.
"""

from __future__ import annotations

import time

NO_CUDA = "no CUDA device: runs on CPU (the step is time.sleep; a CPU build of torch cannot pin memory)"
H2D_MAX = 256 << 20  # copies this large already run at the link's full rate
MATMUL_N = 4096  # ~0.14 TFLOP per matmul: well above launch overhead, small enough to calibrate finely


class Step:
    """``step(batch)`` takes about ``ms`` milliseconds on ``device`` ("cuda..." or anything else: sleep)."""

    def __init__(self, ms: float, device: str | None):
        self.ms = ms
        self.device = device
        self.cuda = bool(device and device.startswith("cuda"))
        self.repeats = 0
        self.gpu_busy_s = 0.0
        self.calibration: dict = {}

    def prepare(self) -> dict:
        """Calibrate the matmul count on CUDA; describe the step."""
        if not self.cuda or self.ms <= 0:
            self.calibration = {"kind": "sleep" if self.ms > 0 else "none", "ms": self.ms}
            return self.calibration
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
        self.calibration = {"kind": "matmul", "ms": self.ms, "matmul_n": MATMUL_N, "matmul_ms": per,
                            "repeats": self.repeats, "gpu": torch.cuda.get_device_name(dev)}
        return self.calibration

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


def h2d_bandwidth(device: str | None, nbytes: int, repeats: int = 10) -> dict:
    """Host->device GB/s from pinned and from pageable memory (medians of alternating copies)."""
    if not (device and device.startswith("cuda")):
        return {"bytes": min(nbytes, H2D_MAX), "pinned_gb_per_s": None, "pageable_gb_per_s": None, "reason": NO_CUDA}
    import torch

    from dsbuild.bench.summary import spread

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
    pin, page = spread(rates["pinned"]), spread(rates["pageable"])
    return {"bytes": nbytes, "pinned_gb_per_s": pin["median"], "pageable_gb_per_s": page["median"],
            "pinned_spread": pin, "pageable_spread": page, "reason": None}
