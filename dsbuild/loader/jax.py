"""The loader as global ``jax.Array``s: ``loader.as_jax_iterator(sharding)``.

Each JAX process is one rank (``rank=jax.process_index()``, ``world_size=jax.process_count()``): it
loads its own batch of every global step and ``jax.make_array_from_process_local_data`` assembles the
global array, laid out by ``sharding`` (a ``NamedSharding`` over the batch axis), without moving
samples between hosts. Model axes: a mesh's model (tp) axis replicates the batch (processes of one
data-parallel index supply the same rows: the global batch is dp x batch_size); under a loader layout
with cp > 1 the time axis is each process's two CP chunks, the global time cp x that, for a sharding
whose spec splits axis 1 over the mesh's cp axis (arrays without time take the batch axis's spec alone). Global arrays need the same shape on every process and step, so batches are
padded to fixed shapes known from the index alone: ``batch_size`` items (``valid`` marks real ones),
the longest clip's delivered frames (or ``pack_frames``), and one frame size (``resize=`` or a single
resolution). Every process yields one batch per global step: where the stream ends mid-step, a
rank without a batch there gives an all-padding one. Metadata (keys, titles, ...) stays host-local lists of this process's items; ``state`` is
the checkpoint after the batch (the same on every process). Without ``jax_enable_x64``, JAX holds the
float64 timestamps as float32 (exact to ~0.1 ms over an hour of session time).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from dsbuild.core.errors import MissingDependency, UsageError

PADDED_TIME = ("actions", "telemetry", "timestamps", "frames", "segment_ids")


def _pad(arr: np.ndarray, batch: int, time: int | None) -> np.ndarray:
    widths = [(0, batch - arr.shape[0])] + [(0, 0)] * (arr.ndim - 1)
    if time is not None:
        widths[1] = (0, time - arr.shape[1])
    fill = -1 if arr.dtype == np.int32 and time is not None else 0
    return np.pad(arr, widths, constant_values=fill)


def _empty(loader, time: int) -> dict:
    """An all-padding local batch (every item invalid), for a rank with no batch in the last global step:
    every process must take part in every global array."""
    o = loader.options
    b = o.batch_size
    out = {
        "actions": np.zeros((b, time, len(loader.controls)), np.float32),
        "telemetry": np.zeros((b, time, len(loader.channels)), np.float32),
        "timestamps": np.zeros((b, time), np.float64),
    }
    if o.pack_frames:
        out["segment_ids"] = np.full((b, time), -1, np.int32)
    else:
        out["lengths"] = np.zeros(b, np.int32)
    if o.decode == "frames":
        h, w = o.resize or (int(loader.sources[0].height[0]), int(loader.sources[0].width[0]))
        out["frames"] = np.zeros((b, time, h, w, 3), np.uint8)
    return {**out, "keys": []}


def jax_batches(loader, sharding) -> Iterator[dict]:
    try:
        import jax
        from jax.sharding import NamedSharding, PartitionSpec
    except ImportError:
        raise MissingDependency("as_jax_iterator", "jax") from None
    o = loader.options
    if o.decode_backend == "nvdec":  # its frames are a torch tensor in torch's CUDA memory
        raise UsageError(
            "as_jax_iterator delivers numpy-backed jax.Arrays; decode_backend='nvdec' keeps frames in torch's "
            "CUDA memory",
            hint="use decode_backend='pyav' or 'auto' (auto collates on the host)",
        )
    loader.open()
    procs, me = jax.process_count(), jax.process_index()
    if (o.world_size, o.rank) != (procs, me):
        raise UsageError(
            f"as_jax_iterator: this is JAX process {me} of {procs}, the loader has rank={o.rank}, "
            f"world_size={o.world_size}",
            hint=f"construct it with rank={me}, world_size={procs}",
        )
    if o.device is not None or o.audio:
        raise UsageError("as_jax_iterator delivers numpy-backed jax.Arrays", hint="use device=None and audio=False")
    at = loader.coords
    if at.pp_size > 1:
        raise UsageError(
            f"as_jax_iterator: pipeline parallelism (pp={at.pp_size}) is not supported: every JAX process "
            "takes part in every global array",
            hint="iterate the loader itself on the first and last stages",
        )
    sizes = {(int(w), int(h)) for s in loader.sources for w, h in set(zip(s.width, s.height))}
    if o.decode == "frames" and o.resize is None and len(sizes) > 1:
        raise UsageError(f"as_jax_iterator needs one frame size; the data has {len(sizes)}", hint="use resize=(h, w)")
    time = o.pack_frames or max(int(p.lengths.max()) for p in loader.plans)
    dp, cp = at.dp_size, at.cp_size
    if cp > 1 and not o.pack_frames:  # a CP rank's two chunks of the longest clip
        time = 2 * -(-time // (2 * cp))
    flat = NamedSharding(sharding.mesh, PartitionSpec(*tuple(sharding.spec)[:1]))  # the batch axis alone
    start, mine = loader.position.step, 0

    def to_global(batch: dict) -> dict:
        n = len(batch["keys"])
        out = {k: v for k, v in batch.items() if not isinstance(v, np.ndarray)}
        valid = np.zeros(o.batch_size, dtype=bool)
        valid[:n] = True
        arrays = {
            k: _pad(v, o.batch_size, time if k in PADDED_TIME else None)
            for k, v in batch.items()
            if isinstance(v, np.ndarray)
        }
        arrays["valid"] = valid
        for k, local in arrays.items():
            timed = k in PADDED_TIME
            shape = (dp * local.shape[0], *((cp * local.shape[1],) if timed else local.shape[1:2]), *local.shape[2:])
            out[k] = jax.make_array_from_process_local_data(sharding if timed else flat, local, shape)
        out["state"] = loader.state_dict()
        return out

    for batch in loader:
        mine += 1
        yield to_global(batch)
    global_steps = -(-(loader.position.step - start) // dp)
    for _ in range(global_steps - mine):  # the stream ended mid-step: this rank still takes part
        yield to_global(_empty(loader, time))
