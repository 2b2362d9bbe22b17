"""The loader's options: one typed dataclass, each default with its reason.

Options marked ``order=True`` define which samples land in which global batch (the order). A
checkpoint records their values and refuses to restore under other values, naming the option; the
list is derived from these marks (``order_options``), never kept by hand. Everything else may change
between a save and a restore: world size and worker count (elastic restart), decode settings,
verification, the device.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dsbuild.core.errors import UsageError
from dsbuild.loader.parallel import BALANCES, Parallel

SHUFFLES = ("global", "blocks", "none")
BUCKETS = (None, "resolution", "length", "shape")
DECODES = ("frames", "bytes")
POLICIES = ("reepoch", "stop")
MIXES = ("batch", "sample")
VERIFY = ("sample", "shard", "none")
READS = ("map", "pread")
BACKENDS = ("pyav", "torchcodec", "nvdec", "auto")
WORKER_MODES = ("auto", "thread", "process")
AUDIO_CHANNELS = (1, 2)  # mono, stereo (what the remixer lays out)
DEVICE_RE = re.compile(r"cpu|auto|cuda(:[0-9]+)?")


def option(default: Any, doc: str, *, order: bool = False):
    """A field with its reason; ``order=True``: changing it changes the order (checkpoints refuse)."""
    return field(default=default, metadata={"order": order, "doc": doc})


@dataclass(frozen=True)
class LoaderOptions:
    # -- what defines the order --------------------------------------------------------------------
    seed: int = option(0, "the epoch order, crops and map seeds derive from it (never from time or pid)", order=True)
    batch_size: int = option(8, "samples (or packed items) per batch, per rank", order=True)
    shuffle: str = option(
        "global",
        "global: keyed bijection over all samples; blocks: shuffle blocks of "
        "neighbouring samples (I/O locality); none: index order",
        order=True,
    )
    block_size: int = option(256, "blocks mode: neighbouring samples per block (they share shards)", order=True)
    block_window: int = option(4, "blocks mode: blocks shuffled together (reads stay within them)", order=True)
    bucket_by: str | None = option(None, "resolution, length or shape: no batch mixes them", order=True)
    pack_frames: int | None = option(None, "pack clips first-fit into items of this many frames", order=True)
    frame_stride: int = option(1, "keep every n-th frame (and the matching action/telemetry rows)", order=True)
    max_frames: int | None = option(None, "cut clips after this many frames (after stride; counted)", order=True)
    clip_frames: int | None = option(
        None,
        "a seeded random crop of this many frames per sample and epoch (decoded from the keyframe before it)",
        order=True,
    )
    mix: str = option(
        "batch", "mixtures: each batch from one source (batch) or sources mixed within batches (sample)", order=True
    )
    policy: str = option(
        "reepoch", "a mixture source that runs out starts its next epoch, or stops the mixture", order=True
    )
    balance: str | None = option(
        None,
        "frames or tokens (packed items): each global step's samples reassigned among the data-parallel "
        "ranks so their work is even (largest first onto the least-loaded rank); None: as drawn",
        order=True,
    )
    # -- the partition (elastic: may change on restore) ----------------------------------------------
    rank: int = option(0, "this process's rank")
    world_size: int = option(1, "ranks that share the stream; each sample once per epoch across them")
    parallel: Parallel | None = option(  # noqa: RUF009 (a frozen dataclass, or None)
        None,
        "a model-parallel layout (Parallel(tp=, cp=, pp=) or a torch DeviceMesh): data follows the rank's "
        "data-parallel index, CP ranks get their slices, middle pipeline stages read nothing",
    )
    # -- delivery (free to change) ----------------------------------------------------------------------
    num_workers: int = option(2, "threads (or processes, see worker_mode) that read, decode and collate batches")
    worker_mode: str = option(
        "auto",
        "thread: PyAV, preadv and the hashes release the GIL, batches need no hand-off; process: each "
        "worker process builds whole batches into shared memory (uses the cores the GIL keeps threads "
        "from); auto: processes when num_workers > 2 (stats()['workers'] says which and why)",
    )
    prefetch: int = option(
        4, "batches in flight: bounds memory (process mode: per worker, in a ring of prefetch + 1 segments)"
    )
    shm_bytes: int | None = option(
        None, "process mode: shared memory the workers' rings may use in all (None: as much as /dev/shm has)"
    )
    max_batch_bytes: int | None = option(
        None,
        "frames mode: the largest frames batch allowed (batch_size x frames x height x width x 3), checked "
        "from the index before any is allocated; a clip that needs more is refused, named (None: half the "
        "memory this process may use)",
    )
    decode: str = option("frames", "frames: uint8 arrays; bytes: the encoded MP4 for a GPU decoder")
    decode_backend: str = option(
        "pyav", "pyav (CPU, default), torchcodec (CPU), nvdec (NVDEC, frames kept on the GPU), auto"
    )
    decode_fallback: bool = option(
        True, "nvdec: a clip the GPU decoder does not take (codec, profile) decodes on CPU, counted in stats"
    )
    resize: tuple[int, int] | None = option(
        None, "(height, width) via swscale; needed to batch mixed resolutions without buckets"
    )
    device: str | None = option(
        None, "None: numpy; 'cpu'/'cuda'/'auto': torch tensors (auto without torch: numpy, noted in stats)"
    )
    verify: str | bool = option(
        "sample",
        "sample: every sample read is hashed (BLAKE3; sha256 in versions made "
        "before it was recorded); shard: each shard hashed once per process; "
        "none (False): trust the bytes",
    )
    read: str = option(
        "map",
        "map: shards are memory-mapped and samples delivered as read-only views of the "
        "page cache, no copy (the worker faults their pages in); pread: copied into "
        "pooled buffers with preadv, which releases the GIL while a disk reads (data "
        "far larger than RAM on slow disks; shard files another program may truncate "
        "in place while you train). verify='sample' always copies",
    )
    max_open_shards: int = option(64, "open shard files kept (LRU): far below common `ulimit -n` values")
    max_replacements: int = option(16, "corrupt-sample substitutes tried before failing loudly")
    audio: bool = option(False, "deliver the clip's audio as float32 PCM with lengths")
    audio_rate: int = option(16000, "audio sample rate (Hz) after resampling")
    audio_channels: int = option(1, "audio channels after remixing")
    text: bool = option(False, "deliver each sample's text events (parses the sample's JSON)")
    # (option() is field() with a reason: no call result is shared between instances)
    map: Callable[[dict, Any], dict] | None = option(  # noqa: RUF009
        None,
        "map(sample, rng) -> sample, per sample in the "
        "worker threads before collation; rng is seeded "
        "from (seed, epoch, version id, key)",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "verify", self.verify_level)
        _choice("shuffle", self.shuffle, SHUFFLES)
        _choice("bucket_by", self.bucket_by, BUCKETS)
        _choice("decode", self.decode, DECODES)
        _choice("policy", self.policy, POLICIES)
        _choice("mix", self.mix, MIXES)
        _choice("verify", self.verify, VERIFY)
        _choice("read", self.read, READS)
        _choice("decode_backend", self.decode_backend, BACKENDS)
        _choice("worker_mode", self.worker_mode, WORKER_MODES)
        _choice("balance", self.balance, BALANCES)
        for name in (
            "batch_size",
            "block_size",
            "block_window",
            "frame_stride",
            "world_size",
            "prefetch",
            "max_open_shards",
            "audio_rate",
            "audio_channels",
        ):
            _at_least(name, getattr(self, name), 1)
        for name in ("seed", "rank", "num_workers", "max_replacements"):
            _at_least(name, getattr(self, name), 0)
        for name in ("pack_frames", "max_frames", "clip_frames", "shm_bytes", "max_batch_bytes"):
            if getattr(self, name) is not None:
                _at_least(name, getattr(self, name), 1)
        if self.parallel is not None and not isinstance(self.parallel, Parallel):
            self._take_mesh(self.parallel)
        if self.worker_mode == "process" and self.num_workers < 1:
            raise UsageError("worker_mode='process' needs num_workers >= 1", hint="num_workers=0 builds in this thread")
        if self.rank >= self.world_size:
            raise UsageError(
                f"rank {self.rank} is outside world_size {self.world_size}", hint="ranks are 0 .. world_size - 1"
            )
        self.layout.coords(self.rank, self.world_size)  # a product that does not divide the world: said now
        if self.balance == "tokens" and self.pack_frames is None:
            raise UsageError("balance='tokens' needs pack_frames", hint="use balance='frames' for unpacked clips")
        if self.balance is not None and self.bucket_by in ("resolution", "shape"):
            raise UsageError(
                f"balance={self.balance!r} with bucket_by={self.bucket_by!r} would mix shapes in a batch",
                hint="drop one of them, or use resize=(height, width) instead of buckets",
            )
        if self.pack_frames is not None and self.decode != "frames":
            raise UsageError("pack_frames needs decode='frames'", hint="drop pack_frames or decode frames")
        if self.resize is not None and (
            len(self.resize) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in self.resize)
            or min(self.resize) < 1
        ):
            raise UsageError(f"resize must be (height, width), whole numbers >= 1, not {self.resize!r}")
        if self.audio_channels not in AUDIO_CHANNELS:  # (another count failed every sample as damaged)
            raise UsageError(f"audio_channels must be 1 (mono) or 2 (stereo), not {self.audio_channels!r}")
        if self.device is not None and not (isinstance(self.device, str) and DEVICE_RE.fullmatch(self.device)):
            raise UsageError(f"device must be None, 'cpu', 'cuda', 'cuda:N' or 'auto', not {self.device!r}")
        if self.decode == "bytes" and not self.whole_clips:
            raise UsageError(
                "frame_stride, clip_frames and max_frames need decode='frames': bytes mode delivers "
                "whole clips, which rows cut to a crop or stride would not line up with",
                hint="decode frames, or cut the clip's rows yourself after decoding it",
            )
        if self.map is not None and not callable(self.map):
            raise UsageError(f"map must be a function map(sample, rng) -> sample, not {type(self.map).__name__}")

    def _take_mesh(self, mesh: Any) -> None:
        """A torch DeviceMesh as ``parallel``: its layout, and the rank and world size it gives (which a
        rank or world size also given must match)."""
        if not hasattr(mesh, "mesh_dim_names"):
            raise UsageError(f"parallel must be a Parallel or a torch DeviceMesh, not {type(mesh).__name__}")
        layout, world, rank = Parallel.from_mesh(mesh), int(mesh.size()), int(mesh.get_rank())
        if (self.rank, self.world_size) not in ((0, 1), (rank, world)):
            raise UsageError(
                f"rank={self.rank}, world_size={self.world_size}, but the DeviceMesh says rank {rank} of {world}",
                hint="leave rank and world_size out with a DeviceMesh",
            )
        object.__setattr__(self, "parallel", layout)
        object.__setattr__(self, "rank", rank)
        object.__setattr__(self, "world_size", world)

    @property
    def layout(self) -> Parallel:
        """The model-parallel layout (none given: every rank is its own data-parallel index)."""
        return self.parallel or Parallel()

    @property
    def whole_clips(self) -> bool:
        """Every frame of every clip is delivered: no stride, crop or cut."""
        return self.frame_stride == 1 and self.clip_frames is None and self.max_frames is None

    @property
    def verify_level(self) -> str:
        """``verify`` as a name (True is "sample", False "none"; ``__post_init__`` stores it so)."""
        if isinstance(self.verify, bool):
            return "sample" if self.verify else "none"
        return self.verify

    @property
    def mapped(self) -> bool:
        """Shards are read through their mappings: ``read="map"``, unless ``verify="sample"`` (which copies,
        so that the bytes it hashed are the bytes delivered)."""
        return self.read == "map" and self.verify != "sample"

    @property
    def plain(self) -> bool:
        """Nothing runs per sample: bytes mode, whole clips, no map, audio, text or packing (pack_frames
        needs frames). Batches are then collated straight from the read buffers."""
        return self.decode == "bytes" and self.whole_clips and self.map is None and not self.audio and not self.text


def _choice(name: str, value: object, allowed: tuple) -> None:
    if value not in allowed:
        raise UsageError(f"{name} must be one of {', '.join(map(repr, allowed))}, not {value!r}")


def _at_least(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise UsageError(f"{name} must be an integer >= {low}, not {value!r}")


def order_options(o: LoaderOptions) -> dict[str, Any]:
    """The order-defining options by name (JSON-safe values): what a checkpoint must match."""
    return {f.name: getattr(o, f.name) for f in dataclasses.fields(o) if f.metadata.get("order")}


def with_overrides(options: LoaderOptions | None, overrides: dict[str, Any]) -> LoaderOptions:
    """``options`` (default: the defaults) with named fields replaced; an unknown name is a UsageError."""
    names = {f.name for f in dataclasses.fields(LoaderOptions)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise UsageError(f"unknown loader option {unknown[0]!r}", hint=f"options are: {', '.join(sorted(names))}")
    return dataclasses.replace(options or LoaderOptions(), **overrides)
