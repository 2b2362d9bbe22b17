"""The loader as a ``torch.utils.data.IterableDataset`` for a plain ``DataLoader`` (torch is optional).

Each DataLoader worker takes every K-th of this rank's batches; the DataLoader reads workers round-robin
in order, so the stream is the same for any ``num_workers``. Use ``DataLoader(ds, batch_size=None)``:
batches are built inside the workers (moving whole batches, not samples, across processes). Each batch
carries ``position``/``cursors``; ``loader.state_after(batch)`` is the checkpoint to save after it.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from dsbuild.loader.loader import Mixture


class TorchDataset(IterableDataset):
    def __init__(self, loader: Mixture):
        super().__init__()
        self.loader = loader

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        loader = self.loader
        loader._open()
        for _, src, epoch, b, (position, cursors) in loader.my_batches(worker, workers):
            batch = loader._build(src, epoch, b)
            out = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
            if "video" in out:  # memoryviews cannot cross to the main process; worker IPC copies anyway
                out["video"] = [bytes(v) for v in out["video"]]
            out["position"], out["cursors"] = position, cursors
            yield out
