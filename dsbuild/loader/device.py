"""Host -> device delivery. Pinned memory and a non-blocking copy on a side CUDA stream when CUDA is
present; plain tensors on CPU (a CPU build of torch cannot pin memory: ``pin_memory()`` raises)."""

from __future__ import annotations

import numpy as np

from dsbuild.core.errors import UsageError


def resolve_device(device: str | None) -> str | None:
    """None -> numpy arrays (no torch needed); 'auto' -> 'cuda' when available, else 'cpu'."""
    if device is None:
        return None
    try:
        import torch
    except ImportError:
        raise UsageError("device= needs torch: pip install 'dsbuild[torch]' (or device=None for numpy)") from None
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"device={device!r} but CUDA is not available; use device='auto' or 'cpu'")
    return device


class Transfer:
    """Copies numpy batches to ``device``; on CUDA through pinned buffers on a side stream."""

    def __init__(self, device: str):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None

    def __call__(self, batch: dict) -> dict:
        torch = self.torch
        out = {}
        if self.cuda:
            with torch.cuda.stream(self.stream):
                for k, v in batch.items():
                    out[k] = torch.from_numpy(v).pin_memory().to(self.device, non_blocking=True) \
                        if isinstance(v, np.ndarray) else v
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            for v in out.values():
                if isinstance(v, torch.Tensor):
                    v.record_stream(torch.cuda.current_stream(self.device))
        else:
            for k, v in batch.items():
                out[k] = torch.from_numpy(v) if isinstance(v, np.ndarray) else v
        return out
