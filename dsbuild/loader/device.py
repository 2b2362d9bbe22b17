"""Host -> device delivery. Pinned memory and a non-blocking copy on a side CUDA stream when CUDA is
present; plain tensors on CPU (a CPU build of torch cannot pin memory: ``pin_memory()`` raises)."""

from __future__ import annotations

import importlib.util
from collections import deque

import numpy as np

from dsbuild.core.errors import MissingDependency, UsageError


def resolve_device(device: str | None, *, cuda: bool | None = None) -> tuple[str | None, str | None]:
    """(device, note): None -> numpy arrays (no torch needed); 'auto' -> 'cuda' when available, else
    'cpu', and numpy (with a note) when torch is not installed. ``cuda``: whether CUDA is available, where
    the caller has asked already (the bench asks a process of its fork server): torch is then looked up,
    not imported (1.5 s of CPU in a process that has no other use for it)."""
    if device is None:
        return None, None
    if cuda is None or importlib.util.find_spec("torch") is None:
        try:
            import torch
        except ImportError:
            if device == "auto":
                return None, "device='auto': torch is not installed, delivering numpy arrays"
            raise MissingDependency(f"device={device!r}", "torch") from None
        cuda = torch.cuda.is_available()
    if device == "auto":
        return ("cuda", None) if cuda else ("cpu", "device='auto': no CUDA device, torch tensors on CPU")
    if device.startswith("cuda") and not cuda:
        raise UsageError(f"device={device!r} but CUDA is not available", hint="use device='auto' or 'cpu'")
    return device, None


class Transfer:
    """Copies numpy batches to ``device``; on CUDA through pinned buffers on a side stream."""

    def __init__(self, device: str):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        # sources already pinned (a worker process's segment, registered with CUDA) are copied from in
        # place: each batch's are kept until its copy is done, so the worker cannot overwrite them first
        self.copying: deque = deque()

    def __call__(self, batch: dict) -> dict:
        torch = self.torch
        out = {}
        if self.cuda:
            while self.copying and self.copying[0][0].query():
                self.copying.popleft()
            pinned = []
            with torch.cuda.stream(self.stream):
                for k, v in batch.items():
                    if isinstance(v, np.ndarray):
                        src = torch.from_numpy(v)
                        if src.is_pinned():
                            pinned.append(src)
                        out[k] = src.pin_memory().to(self.device, non_blocking=True)  # (pinned: itself)
                    else:
                        out[k] = v
                if pinned:
                    self.copying.append((torch.cuda.current_stream(self.device).record_event(), pinned))
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            for v in out.values():
                if isinstance(v, torch.Tensor):
                    v.record_stream(torch.cuda.current_stream(self.device))
        else:
            for k, v in batch.items():
                out[k] = torch.from_numpy(v) if isinstance(v, np.ndarray) else v
        return out
