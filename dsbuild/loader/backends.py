"""Choosing the video decoder behind ``decode_backend``: a pure rule over what this machine has, so it is
tested anywhere, and one line saying what was chosen and why.

- ``pyav`` (default): FFmpeg through PyAV on CPU threads; always available.
- ``torchcodec``: FFmpeg through torchcodec on CPU (needs the ``torchcodec`` extra).
- ``nvdec``: NVDEC through PyAV's own FFmpeg (the Linux x86-64 wheels have the CUDA hwaccel), frames
  kept in GPU memory, converted to RGB and resized in torch there (``dsbuild.loader.gpu``), one decoder
  per stream configuration per thread. Without a CUDA GPU it is refused (MissingDevice, exit 3).
- ``auto``: PyAV on CPU without a GPU; with one, a probe: the first ``PROBE_CLIPS`` clips are decoded
  alternately by both, and the faster per frame decodes the rest (``AutoProbe``), saying why in stats.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from dsbuild.core.errors import MissingDependency, MissingDevice, UsageError

NVDEC = "ffmpeg-cuda"  # the capability probe() reports when PyAV's FFmpeg has the CUDA hwaccel


PROBE_CLIPS = 8  # clips auto decodes (alternately on each route) before choosing
MARGIN = 1.1  # how much faster per frame NVDEC must be to be picked: a tie keeps the CPU free for nothing


@dataclass(frozen=True)
class Backend:
    name: str  # pyav | torchcodec | nvdec | auto (probing: becomes pyav or nvdec)
    device: str  # where frames are decoded: cpu | cuda | probe
    note: str  # one line for stats: what was chosen and why


def choose_backend(requested: str, *, cuda: bool, installed: frozenset[str]) -> Backend:
    """The backend for ``requested`` given CUDA availability and the installed decoders
    (``"torchcodec"``, ``NVDEC``)."""
    if requested == "pyav":
        return Backend("pyav", "cpu", "pyav: requested")
    if requested == "torchcodec":
        if "torchcodec" not in installed:
            raise MissingDependency("decode_backend='torchcodec'", "torchcodec")
        return Backend("torchcodec", "cpu", "torchcodec on CPU: requested")
    if requested == "nvdec":
        if not cuda:
            raise MissingDevice(
                "decode_backend='nvdec' needs a CUDA GPU, and torch.cuda.is_available() is False",
                hint="use decode_backend='pyav' (CPU) or 'auto'",
            )
        if NVDEC not in installed:
            raise MissingDevice(
                "decode_backend='nvdec' needs PyAV's FFmpeg built with the CUDA hwaccel, and "
                "av.codec.hwaccel.hwdevices_available() does not list 'cuda'",
                hint="install the PyAV wheel from PyPI (Linux x86-64), or use decode_backend='pyav'",
            )
        return Backend("nvdec", "cuda", "nvdec: requested, frames decoded, converted and resized on the GPU")
    if requested == "auto":
        if not cuda:
            return Backend("pyav", "cpu", "auto: no CUDA GPU, decoding with PyAV on CPU")
        if NVDEC not in installed:
            return Backend("pyav", "cpu", "auto: PyAV's FFmpeg has no CUDA hwaccel, decoding with PyAV on CPU")
        return Backend("auto", "probe", f"auto: probing NVDEC against PyAV on CPU over the first {PROBE_CLIPS} clips")
    raise UsageError(f"decode_backend must be pyav, torchcodec, nvdec or auto, not {requested!r}")


def probe(cuda: bool | None = None) -> tuple[bool, frozenset[str]]:
    """(CUDA available, installed decoders) on this machine; imports nothing heavy unless present. ``cuda``:
    already known (see ``resolve_device``), torch is not imported to ask."""
    from av.codec.hwaccel import hwdevices_available

    installed = {n for n in ("torchcodec",) if importlib.util.find_spec(n) is not None}
    if "cuda" in hwdevices_available():
        installed.add(NVDEC)
    if cuda is None:
        cuda = False
        if importlib.util.find_spec("torch") is not None:
            import torch

            cuda = torch.cuda.is_available()
    return cuda, frozenset(installed)


def decide(cpu: tuple[float, float], gpu: tuple[float, float]) -> Backend:
    """The backend ``auto`` keeps after its probe: (seconds, frames) decoded on each route. NVDEC only
    where it is ``MARGIN`` times faster per frame; the note gives both rates."""
    rate = {k: f / s if s > 0 else 0.0 for k, (s, f) in (("cpu", cpu), ("gpu", gpu))}
    said = f"NVDEC {rate['gpu']:.0f} frames/s vs PyAV on CPU {rate['cpu']:.0f} frames/s over the first clips"
    if rate["gpu"] >= MARGIN * rate["cpu"] and gpu[1] > 0:
        return Backend("nvdec", "cuda", f"auto: nvdec, measured faster ({said})")
    return Backend("pyav", "cpu", f"auto: pyav on CPU, NVDEC not measured {MARGIN}x faster ({said})")


class AutoProbe:
    """``auto``'s probe, thread-safe: ``route()`` says which route decodes the next clip (alternating
    until each has ``PROBE_CLIPS // 2`` clips, then the decided one), ``record(route, seconds, frames)``
    adds a timing; ``chosen`` is the decision (None while probing)."""

    def __init__(self, clips: int = PROBE_CLIPS):
        import threading

        self._lock = threading.Lock()
        self._left = clips
        self._times = {"cpu": [0.0, 0], "gpu": [0.0, 0]}
        self._turn = 0
        self.chosen: Backend | None = None

    def route(self) -> str:
        with self._lock:
            if self.chosen is not None:
                return "gpu" if self.chosen.name == "nvdec" else "cpu"
            self._turn += 1
            return "gpu" if self._turn % 2 else "cpu"

    def record(self, route: str, seconds: float, frames: int) -> Backend | None:
        """Add a timing; returns the decision when this one completed the probe (once)."""
        with self._lock:
            if self.chosen is not None:
                return None
            t = self._times[route]
            t[0] += seconds
            t[1] += frames
            self._left -= 1
            if self._left > 0:
                return None
            self.chosen = decide(
                (self._times["cpu"][0], self._times["cpu"][1]), (self._times["gpu"][0], self._times["gpu"][1])
            )
            return self.chosen
