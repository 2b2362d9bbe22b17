"""Choosing the video decoder behind ``decode_backend``: a pure rule over what this machine has, so it is
tested anywhere, and one line saying what was chosen and why.

- ``pyav`` (default): FFmpeg through PyAV on CPU threads; always available.
- ``torchcodec``: FFmpeg through torchcodec on CPU (needs the ``torchcodec`` extra).
- ``nvdec``: NVDEC on the GPU through FFmpeg's CUDA hwaccel in PyAV's own FFmpeg (the PyAV wheels for
  Linux x86-64 are built with it, loading the driver's decoder at run time), so no extra package:
  the GPU decodes, frames come back to host memory and are resized by swscale as with ``pyav``.
- ``auto``: the fastest measured for the machine, which today is ``pyav`` everywhere: on an H200 host
  with 16 cores, NVDEC this way delivered 0.39x the frames/s of PyAV on CPU threads (2-s 1080p clips;
  benchmarks/RESULTS.md), so ``nvdec`` is used only when asked for, and the note says why.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from dsbuild.core.errors import MissingDependency, UsageError

NVDEC = "ffmpeg-cuda"  # the capability probe() reports when PyAV's FFmpeg has the CUDA hwaccel


@dataclass(frozen=True)
class Backend:
    name: str  # pyav | torchcodec | nvdec
    device: str  # where frames are decoded: cpu | cuda
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
            raise UsageError(
                "decode_backend='nvdec' needs a CUDA GPU, and torch.cuda.is_available() is False",
                hint="use decode_backend='pyav' (CPU) or 'auto'",
            )
        if NVDEC not in installed:
            raise UsageError(
                "decode_backend='nvdec' needs PyAV's FFmpeg built with the CUDA hwaccel, and "
                "av.codec.hwaccel.hwdevices_available() does not list 'cuda'",
                hint="install the PyAV wheel from PyPI (Linux x86-64), or use decode_backend='pyav'",
            )
        return Backend("nvdec", "cuda", "nvdec through PyAV's FFmpeg: requested")
    if requested == "auto":
        if not cuda:
            return Backend("pyav", "cpu", "auto: no CUDA GPU, decoding with PyAV on CPU")
        if NVDEC not in installed:
            return Backend("pyav", "cpu", "auto: PyAV's FFmpeg has no CUDA hwaccel, decoding with PyAV on CPU")
        return Backend(
            "pyav",
            "cpu",
            "auto: decoding with PyAV on CPU threads, measured faster than NVDEC through "
            "FFmpeg (0.39x on 2-s 1080p clips, 16 cores); decode_backend='nvdec' uses the GPU",
        )
    raise UsageError(f"decode_backend must be pyav, torchcodec, nvdec or auto, not {requested!r}")


def probe() -> tuple[bool, frozenset[str]]:
    """(CUDA available, installed decoders) on this machine; imports nothing heavy unless present."""
    from av.codec.hwaccel import hwdevices_available

    installed = {n for n in ("torchcodec",) if importlib.util.find_spec(n) is not None}
    if "cuda" in hwdevices_available():
        installed.add(NVDEC)
    cuda = False
    if importlib.util.find_spec("torch") is not None:
        import torch

        cuda = torch.cuda.is_available()
    return cuda, frozenset(installed)
