"""Peer loaders as in-run baselines of bytes mode: LitData's and Mosaic Streaming's ``StreamingDataset``,
each reading the same member bytes written in its own format by its own writer (the ``peers`` extra).

Every member is stored as a plain bytes column (nothing for the peer to parse per sample, as our bytes
mode parses nothing), and each peer is iterated the way its single-process API is used: one consumer
thread, its own prefetching inside, measured at its steady rate (``baselines.Epochs``). The copy holds the split's samples in key order up to
``COPY_BUDGET`` bytes; it is written once per run, before the rounds (start-up, outside the budget), into
the run's scratch folder. A peer that is not installed is skipped, with the reason in the report.
"""

from __future__ import annotations

import gc
import importlib.util
import sys
from abc import ABC, abstractmethod
from pathlib import Path

from dsbuild.bench.baselines import Epochs, prepared
from dsbuild.bench.dataset import Dataset
from dsbuild.bench.measure import Meter
from dsbuild.core.errors import MissingDependency
from dsbuild.formats.sample import MEMBERS

COPY_BUDGET = 512 << 20
COLUMNS = [m.split(".")[0] for m in MEMBERS]  # json, mp4, actions, telemetry, timestamps, events


def _items(data: Dataset):
    held = 0
    for entry, members in data.source.members(data.items()):
        yield entry.key, {c: bytes(p) for c, (_, p) in zip(COLUMNS, members)}
        held += data.sizes[entry.key]
        if held >= COPY_BUDGET:
            return


class Peer(ABC):
    """Shared by the peers: the copy is written at ``prepare``; ``run`` iterates it round and round."""

    name = package = module = ""

    def __init__(self, data: Dataset, scratch: Path):
        self.data, self.folder = data, scratch / self.name
        self.items: Epochs | None = None

    @classmethod
    def missing(cls) -> str | None:
        """Why this peer cannot run here (None when it can)."""
        # (imported already: Mosaic's package may be the shim of ``export.mds``, which find_spec refuses)
        if cls.module not in sys.modules and importlib.util.find_spec(cls.module) is None:
            return f"{cls.package} is not installed (pip install 'dsbuild[peers]')"
        return None

    def prepare(self) -> None:
        self.folder.mkdir(parents=True)
        self.write(_items(self.data))
        dataset = self.open()
        self.items = Epochs(lambda: dataset)

    def run(self, meter: Meter) -> None:
        sizes = self.data.sizes
        while not meter.over:
            item = prepared(self.items, self.name).next(meter)
            meter.add(1, 0, sizes[item["key"]])

    def close(self) -> None:
        if self.items is not None:
            self.items.close()
            self.items = None

    @abstractmethod
    def write(self, items) -> None:
        """Write ``(key, {column: bytes})`` items into ``self.folder`` with the peer's own writer."""

    @abstractmethod
    def open(self):
        """The peer's dataset over ``self.folder`` (an iterable of dicts with ``key``)."""


class LitData(Peer):
    name, package, module = "litdata", "litdata", "litdata"

    def write(self, items) -> None:
        from litdata.streaming.writer import BinaryWriter

        w = BinaryWriter(str(self.folder), chunk_bytes="64MB")
        for i, (key, columns) in enumerate(items):
            w[i] = {"key": key, **columns}
        w.done()
        w.merge(1)

    def open(self):
        import litdata

        return litdata.StreamingDataset(input_dir=str(self.folder))


class Mosaic(Peer):
    name, package, module = "mosaic", "mosaicml-streaming", "streaming"

    def write(self, items) -> None:
        from dsbuild.export.mds import streaming_dataset

        streaming_dataset()  # imports the package without its torchvision-importing __init__
        from streaming.base.format.mds.writer import MDSWriter

        with MDSWriter(
            out=str(self.folder), columns={"key": "str", **dict.fromkeys(COLUMNS, "bytes")}, size_limit=1 << 26
        ) as w:
            for key, columns in items:
                w.write({"key": key, **columns})

    def open(self):
        from dsbuild.export.mds import streaming_dataset

        dataset_class = streaming_dataset()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        self.dataset = dataset_class(local=str(self.folder), shuffle=False, batch_size=32)
        return self.dataset

    def close(self) -> None:
        """Stop the dataset's threads and collect it, so it unlinks its shared memory (the CLI leaves by
        ``os._exit``, which runs no finalizer: the resource tracker then warned of 6 leaked blocks)."""
        super().close()
        dataset, self.dataset = getattr(self, "dataset", None), None
        if dataset is None:
            return
        if getattr(dataset, "_iterator", None) is not None:  # Mosaic's own end of an epoch
            dataset._iterator.exit()
        if getattr(dataset, "_executor", None) is not None:
            dataset._executor.shutdown(wait=True)
        for shm in _shared_memory(dataset):  # what Mosaic's atexit handlers would release
            shm.cleanup()


def _shared_memory(dataset, depth: int = 6) -> list:
    """Mosaic's shared-memory blocks reachable from ``dataset`` (through its own objects and containers)."""
    from streaming.base.shared.memory import SharedMemory

    found, seen, level = [], {id(dataset)}, [dataset]
    for _ in range(depth):
        deeper = []
        for obj in level:
            for ref in gc.get_referents(obj):
                if id(ref) in seen:
                    continue
                seen.add(id(ref))
                if isinstance(ref, SharedMemory):
                    found.append(ref)
                elif isinstance(ref, (dict, list, tuple)) or type(ref).__module__.startswith("streaming."):
                    deeper.append(ref)
        level = deeper
    return found


PEERS = {p.name: p for p in (LitData, Mosaic)}


def require(name: str) -> None:
    """A peer asked for by name must be installed (MissingDependency otherwise)."""
    why = PEERS[name].missing()
    if why:
        raise MissingDependency(f"--compare {name}", "peers", PEERS[name].package)
