"""The peak FLOP/s an MFU is measured against: datasheet dense peaks for known GPUs, a measured matmul peak
elsewhere (labelled ``measured``: a CPU has no datasheet figure that its BLAS reaches).

Dense peaks, no structured sparsity, in TFLOP/s, from NVIDIA's datasheets (SXM parts unless named): bf16 on
the tensor cores; fp32 without TF32 (torch's default for matmuls).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from dsbuild.core.records import Record

# (name as torch.cuda.get_device_name contains it, bf16 dense TFLOP/s, fp32 TFLOP/s); most specific first
DATASHEET = (
    ("H100 PCIe", 756.0, 51.2),
    ("H100 NVL", 835.0, 60.0),
    ("H200 NVL", 835.0, 60.0),
    ("H100", 989.4, 66.9),
    ("H200", 989.4, 66.9),
    ("A100", 312.0, 19.5),
    ("L40S", 362.1, 91.6),
    ("B200", 2250.0, 75.0),
)
MATMUL_N = 1024  # 2.1 GFLOP a product: well above call overhead on one core, a fraction of a second


@dataclass(frozen=True, slots=True)
class Peak(Record):
    flops: float  # per second, one device (one rank)
    source: str  # datasheet | measured
    device: str  # the device's name


def datasheet(device_name: str, dtype: str) -> float | None:
    """FLOP/s of ``device_name`` at ``dtype`` (bf16 or fp32), or None for a device not in the table."""
    for name, bf16, fp32 in DATASHEET:
        if name.lower() in device_name.lower():
            return (bf16 if dtype == "bf16" else fp32) * 1e12
    return None


def measure_matmul(dtype: str, device: str = "cpu", seconds: float = 0.5) -> float:
    """The best FLOP/s of square matmuls at ``dtype`` over about ``seconds`` (the best: the machine's
    capability, which a noisy neighbour only lowers)."""
    import torch

    t = torch.bfloat16 if dtype == "bf16" else torch.float32
    a = torch.randn(MATMUL_N, MATMUL_N, dtype=t, device=device)
    b = torch.randn(MATMUL_N, MATMUL_N, dtype=t, device=device)
    torch.mm(a, b)
    best, end = 0.0, time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        torch.mm(a, b)
        if device != "cpu":
            torch.cuda.synchronize()
        best = max(best, 2 * MATMUL_N**3 / (time.perf_counter() - t0))
        if time.perf_counter() > end:
            return best


def peak(device: str, dtype: str) -> Peak:
    """The datasheet peak of a known GPU, else one measured here and now."""
    if device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name(torch.device(device))
        known = datasheet(name, dtype)
        if known is not None:
            return Peak(known, "datasheet", name)
        return Peak(measure_matmul(dtype, device), "measured", name)
    return Peak(measure_matmul(dtype), "measured", cpu_name())


def cpu_name() -> str:
    """The CPU's model name (Linux), else the machine type."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.machine() or "cpu"
