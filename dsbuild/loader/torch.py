"""The loader as a ``torch.utils.data.IterableDataset`` for a plain ``DataLoader`` (torch is optional).

Each DataLoader worker takes every K-th of this rank's batches; the DataLoader reads workers round-robin
in order, so the stream is the same for any ``num_workers``. Use ``DataLoader(ds, batch_size=None)``:
batches are built inside the workers. In a worker process every batch array is allocated in shared
memory and filled in place (``collate``'s ``alloc``), and encoded clips (decode="bytes") are packed
into one shared uint8 tensor ``video_data`` with ``video_offsets`` (clip i is
``video_data[video_offsets[i]:video_offsets[i + 1]]``): sample payloads cross to the main process as
shared-memory handles, never pickled. Only small metadata (keys, titles, the checkpoint) is pickled
by torch's queue. Each batch carries ``state``: the checkpoint to save after consuming it
(``loader.state_after(batch)``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info


class SharedAlloc:
    """Zeroed numpy arrays backed by shared-memory torch tensors (kept, so they cross without a copy)."""

    def __init__(self) -> None:
        self.tensors: dict[int, torch.Tensor] = {}

    def __call__(self, shape: tuple, dtype) -> np.ndarray:
        t = torch.zeros(shape, dtype=torch.from_numpy(np.zeros(0, dtype)).dtype).share_memory_()
        arr = t.numpy()
        self.tensors[id(arr)] = t
        return arr

    def tensor(self, arr: np.ndarray) -> torch.Tensor:
        return self.tensors.get(id(arr)) if id(arr) in self.tensors else torch.from_numpy(arr)


def to_torch(batch: dict, alloc: SharedAlloc | None) -> dict:
    out = {}
    for k, v in batch.items():
        if isinstance(v, np.ndarray):
            out[k] = alloc.tensor(v) if alloc is not None else torch.from_numpy(v)
        elif k == "cu_seqlens":
            out[k] = [x.tolist() for x in v]
        else:
            out[k] = v
    if "video" in out:
        clips = out.pop("video")
        sizes = np.array([len(c) for c in clips], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        data = (alloc or np.zeros)((int(offsets[-1]),), np.uint8)
        for c, a in zip(clips, offsets[:-1].tolist()):
            data[a:a + len(c)] = np.frombuffer(c, dtype=np.uint8)
        out["video_data"] = alloc.tensor(data) if alloc is not None else torch.from_numpy(data)
        out["video_offsets"] = torch.from_numpy(offsets)
    return out


class TorchDataset(IterableDataset):
    def __init__(self, loader):
        super().__init__()
        self.loader = loader  # a dsbuild.loader.Mixture (or Loader)

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for step, after in self.loader.steps(worker, workers):
            if step is None:
                return
            alloc = SharedAlloc() if info is not None else None
            batch = to_torch(self.loader.build(step, alloc), alloc)
            batch["state"] = self.loader.state_at(after)
            yield batch
