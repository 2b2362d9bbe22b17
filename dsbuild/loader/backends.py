"""Choosing the video decoder behind ``decode_backend``: a pure rule over what this machine has, so it is
tested anywhere, and one line saying what was chosen and why.

- ``pyav`` (default): FFmpeg through PyAV on CPU threads; always available.
- ``torchcodec``: FFmpeg through torchcodec on CPU (needs the ``torchcodec`` extra).
- ``nvdec``: NVDEC on the GPU through torchcodec (needs CUDA and torchcodec built with CUDA).
- ``auto``: ``nvdec`` where CUDA and torchcodec are present, else ``pyav``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from dsbuild.core.errors import MissingDependency, UsageError


@dataclass(frozen=True)
class Backend:
    name: str  # pyav | torchcodec | nvdec
    device: str  # where frames are decoded: cpu | cuda
    note: str  # one line for stats: what was chosen and why


def choose_backend(requested: str, *, cuda: bool, installed: frozenset[str]) -> Backend:
    """The backend for ``requested`` given CUDA availability and the installed decoder packages."""
    if requested == "pyav":
        return Backend("pyav", "cpu", "pyav: requested")
    if requested == "torchcodec":
        if "torchcodec" not in installed:
            raise MissingDependency("decode_backend='torchcodec'", "torchcodec")
        return Backend("torchcodec", "cpu", "torchcodec on CPU: requested")
    if requested == "nvdec":
        if not cuda:
            raise UsageError("decode_backend='nvdec' needs a CUDA GPU, and torch.cuda.is_available() is False",
                             hint="use decode_backend='pyav' (CPU) or 'auto'")
        if "torchcodec" not in installed:
            raise MissingDependency("decode_backend='nvdec'", "torchcodec")
        return Backend("nvdec", "cuda", "nvdec through torchcodec: requested")
    if requested == "auto":
        if cuda and "torchcodec" in installed:
            return Backend("nvdec", "cuda", "auto: CUDA and torchcodec present, decoding with NVDEC")
        why = "no CUDA GPU" if not cuda else "torchcodec is not installed"
        return Backend("pyav", "cpu", f"auto: {why}, decoding with PyAV on CPU")
    raise UsageError(f"decode_backend must be pyav, torchcodec, nvdec or auto, not {requested!r}")


def probe() -> tuple[bool, frozenset[str]]:
    """(CUDA available, installed decoder packages) on this machine; imports nothing heavy unless present."""
    installed = frozenset(n for n in ("torchcodec",) if importlib.util.find_spec(n) is not None)
    cuda = False
    if importlib.util.find_spec("torch") is not None:
        import torch

        cuda = torch.cuda.is_available()
    return cuda, installed
