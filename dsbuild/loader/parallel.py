"""Model-parallel layouts as pure arithmetic: which data each rank of a TP/CP/PP job gets.

A job of W ranks with tensor degree tp, context degree cp and pipeline degree pp holds
dp = W / (tp * cp * pp) data-parallel groups. The ``order`` string names the rank layout from the
fastest-varying dimension, as Megatron-LM's ``order`` does: under the default "tp-cp-dp-pp", ranks
0 .. tp-1 are one tensor-parallel group, the tp * cp ranks after them share a context-parallel group,
and the pipeline stage changes slowest. Megatron's own default "tp-cp-ep-dp-pp" is accepted (ep = 1).

- A rank's data depends on its DP index alone: it delivers what a plain loader at
  ``rank = dp index, world_size = dp`` delivers, so TP and CP peers read the same samples.
- CP splits every sequence's time axis into 2C chunks, chunk j spanning floor(n*j/2C) ..
  floor(n*(j+1)/2C), and CP rank i keeps chunks i and 2C-1-i (the load-balanced split of causal
  context-parallel attention, Megatron-LM's ``get_batch_on_this_cp_rank``; any n >= 2C, not only
  multiples of 2C). Text events go with the chunk of the frame they fall in.
- PP stages other than the first and last read nothing; with ``pp_data="split"`` the first stage
  delivers the inputs and the last the targets (Megatron-LM's ``get_batch``), by default both whole.
- ``balance`` reassigns the samples of one global step among the DP ranks, largest first onto the
  least-loaded rank with room (in rounds of one item a rank: vectorised), so that no rank is a
  straggler made by the data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dsbuild.core.errors import UsageError

TOKENS = ("tp", "cp", "ep", "dp", "pp")  # ep: expert parallel, accepted for Megatron's order (degree 1)
REQUIRED = ("tp", "cp", "dp", "pp")
DEFAULT_ORDER = "tp-cp-dp-pp"  # tp fastest: TP peers are neighbouring ranks (one node), pp slowest
MESH_DIMS = ("dp", "dp_replicate", "dp_shard", "tp", "cp", "pp")  # HSDP's two data dims multiply into dp
DATA_DIMS = ("dp_replicate", "dp_shard", "dp")  # outer to inner, as torch's HSDP meshes lay them out
BALANCES = (None, "frames", "tokens")
PP_DATA = ("both", "split")  # both: the first and last stages deliver whole batches; split: inputs / targets
FIELDS = ("frames", "video", "actions", "telemetry", "timestamps", "audio", "text")  # what a split stage picks
WITH = {"audio": ("audio_lengths", "audio_cp_bounds")}  # fields that go where their sequence goes


def parse_order(order: str) -> tuple[str, ...]:
    """The order string's tokens, fastest-varying first; an unknown, repeated or missing token is a
    UsageError naming it."""
    if not isinstance(order, str):
        raise UsageError(f"order must be a string such as {DEFAULT_ORDER!r}, not {order!r}")
    tokens = tuple(order.split("-"))
    for t in tokens:
        if t not in TOKENS:
            raise UsageError(f"order {order!r}: unknown token {t!r}", hint=f"tokens are {', '.join(TOKENS)}")
    for t in tokens:
        if tokens.count(t) > 1:
            raise UsageError(f"order {order!r}: token {t!r} appears {tokens.count(t)} times", hint="name each once")
    missing = [t for t in REQUIRED if t not in tokens]
    if missing:
        raise UsageError(f"order {order!r} lacks {', '.join(missing)}", hint=f"for example {DEFAULT_ORDER!r}")
    return tokens


@dataclass(frozen=True)
class Coords:
    """One rank's place in a layout: its index and group size along each dimension."""

    rank: int
    world: int
    dp: int
    dp_size: int
    tp: int
    tp_size: int
    cp: int
    cp_size: int
    pp: int
    pp_size: int
    fields: tuple[str, ...] | None = None  # a split pipeline's first or last stage: its fields (None: all)

    @property
    def reads(self) -> bool:
        """Whether this rank reads data: the first and the last pipeline stages do (inputs, targets)."""
        return self.pp in (0, self.pp_size - 1)

    @property
    def role(self) -> str:
        """What this rank reads, in words (``stats()["parallel"]["role"]``)."""
        if self.pp_size == 1:
            return "reads (single stage)"
        if self.reads:
            stage = f"{'first' if self.pp == 0 else 'last'} of {self.pp_size} pipeline stages"
            if self.fields is None:
                return f"reads ({stage}: inputs and targets)"
            return f"reads {'inputs' if self.pp == 0 else 'targets'} ({stage}: {', '.join(self.fields)})"
        return f"reads nothing (pipeline stage {self.pp} of {self.pp_size}: neither first nor last)"

    def to_json(self) -> dict:
        return {
            "rank": self.rank,
            "world_size": self.world,
            **{f"{d}_rank": getattr(self, d) for d in ("dp", "tp", "cp", "pp")},
            **{f"{d}_size": getattr(self, f"{d}_size") for d in ("dp", "tp", "cp", "pp")},
            "role": self.role,
        }


@dataclass(frozen=True)
class Parallel:
    """A model-parallel layout: ``Loader(..., rank=r, world_size=W, parallel=Parallel(tp=2, cp=2))``.

    ``tp``, ``cp``, ``pp``: the tensor, context and pipeline degrees (dp = W / (tp * cp * pp));
    ``order``: the rank layout, fastest-varying first (Megatron-LM's meaning); ``pp_data``: under pp > 1,
    "both" (the first and the last stage each deliver whole batches) or "split" (as Megatron-LM's
    ``get_batch``: the first stage delivers the inputs, every sequence field but ``targets``; the last the
    ``targets`` fields; both keep keys, lengths and the other per-sample fields)."""

    tp: int = 1
    cp: int = 1
    pp: int = 1
    order: str = DEFAULT_ORDER
    pp_data: str = "both"
    targets: tuple[str, ...] = ("actions",)

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "pp"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UsageError(f"Parallel: {name} must be an integer >= 1, not {v!r}")
        parse_order(self.order)
        if self.pp_data not in PP_DATA:
            raise UsageError(f"Parallel: pp_data must be one of {', '.join(PP_DATA)}, not {self.pp_data!r}")
        targets = (self.targets,) if isinstance(self.targets, str) else tuple(self.targets)
        bad = [t for t in targets if t not in FIELDS]
        if not targets or bad or len(set(targets)) < len(targets):
            raise UsageError(
                f"Parallel: targets {list(targets)} must be distinct fields among {', '.join(FIELDS)}",
                hint='for example targets=("actions",)',
            )
        object.__setattr__(self, "targets", targets)  # (a list read back from JSON)

    @property
    def model(self) -> int:
        """Ranks per data-parallel index: tp * cp * pp."""
        return self.tp * self.cp * self.pp

    def data_parallel(self, world: int) -> int:
        """dp = world / (tp * cp * pp); a product that does not divide the world is a UsageError."""
        if world % self.model:
            raise UsageError(
                f"tp={self.tp} x cp={self.cp} x pp={self.pp} = {self.model} does not divide world_size {world}",
                hint="choose degrees whose product divides the number of ranks",
            )
        return world // self.model

    def sizes(self, world: int) -> dict[str, int]:
        return {"tp": self.tp, "cp": self.cp, "ep": 1, "dp": self.data_parallel(world), "pp": self.pp}

    def coordinates(self, ranks: np.ndarray, world: int) -> dict[str, np.ndarray]:
        """Each rank's index along every dimension (vectorised): the order's first token varies fastest."""
        sizes = self.sizes(world)
        rest = np.asarray(ranks, dtype=np.int64)
        if rest.size and (rest.min() < 0 or rest.max() >= world):
            bad = int(rest[(rest < 0) | (rest >= world)][0])
            raise UsageError(f"rank {bad} is outside world_size {world}", hint=f"ranks are 0 .. {world - 1}")
        out = {}
        for t in parse_order(self.order):
            out[t] = rest % sizes[t]
            rest = rest // sizes[t]
        return out

    def coords(self, rank: int, world: int) -> Coords:
        """Rank ``rank`` of ``world``: its DP index (what data it gets), TP/CP index and pipeline stage."""
        c = {k: int(v[0]) for k, v in self.coordinates(np.array([rank]), world).items()}
        sizes = self.sizes(world)
        fields = None
        if self.pp_data == "split" and self.pp > 1:
            fields = tuple(f for f in FIELDS if f not in self.targets) if c["pp"] == 0 else self.targets
        return Coords(
            rank,
            world,
            c["dp"],
            sizes["dp"],
            c["tp"],
            self.tp,
            c["cp"],
            self.cp,
            c["pp"],
            self.pp,
            fields,
        )

    def to_json(self, world: int) -> dict:
        """The layout as a checkpoint records it (informative: any layout restores)."""
        return {"world_size": world, "dp": self.data_parallel(world), "tp": self.tp, "cp": self.cp, "pp": self.pp}

    @classmethod
    def from_mesh(cls, mesh, pp_data: str = "both", targets: tuple[str, ...] = ("actions",)) -> Parallel:
        """The layout of a torch ``DeviceMesh`` (as ``init_device_mesh`` makes it: ranks 0 .. W-1 in
        row-major order, the last dimension fastest) whose dimension names are among ``MESH_DIMS``.
        ``dp_replicate`` and ``dp_shard`` (HSDP) multiply into dp and must be neighbours, replicate outer.
        ``pp_data`` and ``targets``: as ``Parallel``'s (the mesh has no say in them)."""
        names = tuple(mesh.mesh_dim_names or ())
        shape = tuple(int(s) for s in mesh.mesh.shape)
        ranks = np.asarray(mesh.mesh.flatten().tolist(), dtype=np.int64)
        return cls.from_mesh_shape(names, shape, ranks, pp_data, targets)

    @classmethod
    def from_mesh_shape(
        cls,
        names: tuple[str, ...],
        shape: tuple[int, ...],
        ranks: np.ndarray,
        pp_data: str = "both",
        targets: tuple[str, ...] = ("actions",),
    ) -> Parallel:
        """``from_mesh`` on the mesh's dimension names, shape and flattened rank table."""
        if len(names) != len(shape):
            raise UsageError(
                f"the DeviceMesh has {len(shape)} dimension(s) but names {list(names)}",
                hint=f"build it with mesh_dim_names among {', '.join(MESH_DIMS)}",
            )
        for n in names:
            if n not in MESH_DIMS or names.count(n) > 1:
                raise UsageError(
                    f"DeviceMesh dimension {n!r} ({list(names)}): names must be distinct, among {', '.join(MESH_DIMS)}"
                )
        if not any(n in DATA_DIMS for n in names):
            raise UsageError(
                f"the DeviceMesh {dict(zip(names, shape))} has no data-parallel dimension",
                hint="name one of its dimensions dp, dp_shard or dp_replicate (size 1 if there is no data parallelism)",
            )
        if "dp" in names and ("dp_shard" in names or "dp_replicate" in names):
            raise UsageError(f"the DeviceMesh names both dp and dp_shard/dp_replicate ({list(names)})")
        world = int(np.prod(shape))
        if not np.array_equal(ranks, np.arange(world)):
            raise UsageError(
                f"the DeviceMesh {dict(zip(names, shape))} does not list ranks 0 .. {world - 1} in row-major order",
                hint="pass the whole job's mesh from init_device_mesh, not a slice of it",
            )
        data = [i for i, n in enumerate(names) if n in DATA_DIMS]
        if data != list(range(data[0], data[0] + len(data))) or [names[i] for i in data] != [
            n for n in DATA_DIMS if n in names
        ]:
            raise UsageError(
                f"the DeviceMesh's data dimensions are not neighbours, dp_replicate outer ({list(names)})",
                hint="order them (dp_replicate, dp_shard) side by side",
            )
        tokens, seen_dp = [], False
        for n in reversed(names):  # the last dimension varies fastest
            if n in DATA_DIMS:
                if not seen_dp:
                    tokens.append("dp")
                seen_dp = True
            else:
                tokens.append(n)
        tokens += [t for t in REQUIRED if t not in tokens]
        sizes = dict(zip(names, shape))
        return cls(
            tp=sizes.get("tp", 1),
            cp=sizes.get("cp", 1),
            pp=sizes.get("pp", 1),
            order="-".join(tokens),
            pp_data=pp_data,
            targets=targets,
        )


def parse_layout(text: str) -> Parallel:
    """'tp=2,cp=2' (also pp=, order=, pp_data=both|split, targets=actions+telemetry) -> ``Parallel``: the
    CLI's spelling of a layout; a bad one is a UsageError naming it."""
    fields: dict[str, int | str | tuple[str, ...]] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or name not in ("tp", "cp", "pp", "order", "pp_data", "targets") or name in fields:
            raise UsageError(
                f"layout {text!r}: {part.strip()!r} is not one of tp=N, cp=N, pp=N, order=ORDER, "
                "pp_data=both|split, targets=FIELD+FIELD (each once)",
                hint="for example --parallel tp=2,cp=2",
            )
        if name in ("order", "pp_data"):
            fields[name] = value
        elif name == "targets":
            fields[name] = tuple(value.split("+"))
        elif value.isdigit():
            fields[name] = int(value)
        else:
            raise UsageError(f"layout {text!r}: {name} must be a whole number >= 1, not {value!r}")
    return Parallel(**fields)  # type: ignore[arg-type]


# -- context parallelism: the time axis in 2C chunks ---------------------------------------------------
def cp_bounds(n, cp: int) -> np.ndarray:
    """The 2C + 1 chunk boundaries of sequences of ``n`` frames (int or array: one row each): chunk j
    spans floor(n*j/2C) .. floor(n*(j+1)/2C)."""
    j = np.arange(2 * cp + 1, dtype=np.int64)
    return np.asarray(n, dtype=np.int64)[..., None] * j // (2 * cp)


def cp_spans(n, cp: int, rank: int) -> np.ndarray:
    """CP rank ``rank``'s two spans of sequences of ``n`` frames: [..., 2 (chunk rank, chunk 2C-1-rank),
    2 (start, stop)]."""
    b = cp_bounds(n, cp)
    first, second = rank, 2 * cp - 1 - rank
    return np.stack(
        [np.stack([b[..., first], b[..., first + 1]], -1), np.stack([b[..., second], b[..., second + 1]], -1)], -2
    )


def check_cp_lengths(lengths: np.ndarray, keys: Sequence[str] | np.ndarray, cp: int, cap: int | None = None) -> None:
    """Every sequence (of ``lengths`` frames, at most ``cap``: packing's budget) must hold at least 2C frames
    under CP degree C: the shortest one is a UsageError naming the clip and its length."""
    lengths = np.asarray(lengths) if cap is None else np.minimum(lengths, cap)
    short = np.flatnonzero(lengths < 2 * cp)
    if cp > 1 and len(short):
        k = int(short[np.argmin(lengths[short])])
        raise UsageError(
            f"clip {keys[k]} delivers {int(lengths[k])} frame(s), fewer than 2 x cp = {2 * cp} "
            f"({len(short)} clip(s) are that short)",
            hint="lower cp, or deliver more frames (frame_stride, clip_frames, max_frames)",
        )


def cp_gather(starts: Sequence[int], lengths: Sequence[int], cp: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions (into a packed row holding segments at ``starts`` with ``lengths``) that CP rank ``rank``
    keeps, in order, and the segment each belongs to: each segment is split on its own (the THD layout)."""
    spans = (
        cp_spans(np.asarray(lengths, np.int64), cp, rank).reshape(-1, 2)
        + np.repeat(np.asarray(starts, np.int64), 2)[:, None]
    )
    sizes = spans[:, 1] - spans[:, 0]
    positions = np.repeat(spans[:, 0] - np.cumsum(sizes) + sizes, sizes) + np.arange(int(sizes.sum()))
    segments = np.repeat(np.arange(len(starts)), sizes.reshape(-1, 2).sum(1))
    return positions, segments


TIME_KEYS = ("actions", "telemetry", "timestamps", "frames")  # arrays [batch, time, ...] sliced along time


def cp_slice(batch: dict, cp: int, rank: int) -> dict:
    """CP rank ``rank``'s share of a collated batch: every row's frames, actions, telemetry and timestamps
    at its two chunks (of each packed sub-sequence on its own: segment ids and ``cu_seqlens`` follow),
    audio at the matching span of its own samples, zero-padded to the longest row, and text events by the
    frame they fall in (``_cp_text``). ``cp_bounds`` holds each
    row's two spans in the sample's frames ([row, 2, 2]; packed: a [segment, 2, 2] array per row), so
    the CP ranks' pieces, put in chunk order, are the sample again. The encoded video (bytes mode) is
    left whole."""
    packed = "segment_ids" in batch
    rows = len(batch["timestamps"])
    if packed:
        segments = [(bounds[:-1], np.diff(bounds)) for bounds in batch["cu_seqlens"]]
    else:
        segments = [(np.zeros(1, np.int64), np.asarray([n])) for n in np.asarray(batch["lengths"]).tolist()]
    taken = [cp_gather(starts, lengths, cp, rank) for starts, lengths in segments]
    width = max(len(pos) for pos, _ in taken)
    index = np.zeros((rows, width), np.int64)
    seg = np.full((rows, width), -1, np.int32)
    for b, (pos, segment) in enumerate(taken):
        index[b, : len(pos)], seg[b, : len(pos)] = pos, segment
    real = seg >= 0
    out = {**batch, "cp_rank": rank, "cp_size": cp}
    for key in TIME_KEYS:
        if key in batch:
            a = batch[key][np.arange(rows)[:, None], index]
            a[~real] = 0
            out[key] = a
    spans = [cp_spans(lengths, cp, rank) for _, lengths in segments]
    if packed:
        out["segment_ids"] = seg
        out["cu_seqlens"] = [
            np.concatenate([[0], np.cumsum(s[:, :, 1] - s[:, :, 0]).reshape(-1, 2)[:, 1]]).astype(np.int32)
            for s in spans
        ]
        out["cp_bounds"] = spans
    else:
        out["lengths"] = real.sum(1).astype(np.int32)
        out["cp_bounds"] = np.concatenate(spans)
    if "audio" in batch:
        out.update(_cp_audio(batch, out["cp_bounds"], np.asarray(batch["lengths"]), cp, rank))
    if "text" in batch:
        texts = [batch["text"][b] if packed else [batch["text"][b]] for b in range(rows)]
        kept = [_cp_text(t, batch["timestamps"][b], *segments[b], cp, rank) for b, t in enumerate(texts)]
        out["text"] = kept if packed else [k[0] for k in kept]
    return out


def _cp_text(texts: list, timestamps, starts: np.ndarray, lengths: np.ndarray, cp: int, rank: int) -> list:
    """Each segment's text events that fall in CP rank ``rank``'s two chunks of its time axis: an event
    belongs to the frame it falls in (the last one stamped at or before it; before the first: the first),
    so each event is on one CP rank, and the ranks' events in chunk order are the segment's again."""
    out = []
    for events, start, n in zip(texts, starts.tolist(), lengths.tolist()):
        ts = np.asarray(timestamps[start : start + n])
        frame = np.clip(np.searchsorted(ts, [e["t"] for e in events], side="right") - 1, 0, n - 1)
        chunk = np.searchsorted(cp_bounds(n, cp), frame, side="right") - 1
        out.append([e for e, c in zip(events, chunk.tolist()) if c in (rank, 2 * cp - 1 - rank)])
    return out


def _cp_audio(batch: dict, bounds: np.ndarray, frames: np.ndarray, cp: int, rank: int) -> dict:
    """The audio of each row's two chunks: frame boundary f is audio sample floor(samples * f / frames)."""
    samples = np.asarray(batch["audio_lengths"], np.int64)
    spans = samples[:, None, None] * bounds // frames[:, None, None]
    sizes = spans[:, :, 1] - spans[:, :, 0]
    audio = np.zeros((*batch["audio"].shape[:2], int(sizes.sum(1).max())), np.float32)
    for b, ((a0, a1), (b0, b1)) in enumerate(spans.tolist()):
        audio[b, :, : a1 - a0] = batch["audio"][b, :, a0:a1]
        audio[b, :, a1 - a0 : a1 - a0 + b1 - b0] = batch["audio"][b, :, b0:b1]
    return {"audio": audio, "audio_lengths": sizes.sum(1).astype(np.int32), "audio_cp_bounds": spans}


# -- balanced data-parallel batches -----------------------------------------------------------------------
def balance(weights: Sequence[int] | np.ndarray, capacities: Sequence[int]) -> np.ndarray:
    """The rank of each item, dealt in rounds: items largest first (ties by index), each round the next
    items, one for every rank with room left (rank k takes ``capacities[k]`` items in all; their sum must
    be the item count), the largest onto the least-loaded rank (ties by rank index). With equal
    capacities the ranks' loads end at most the largest item minus the smallest apart. Vectorised: one
    sort of the ranks a round (max(capacities) rounds), the same deal on every rank."""
    w = np.asarray(weights, dtype=np.int64)
    cap = np.asarray(capacities, dtype=np.int64)
    if int(cap.sum()) != len(w):
        raise ValueError(f"balance: {len(w)} items for capacities summing to {int(cap.sum())}")
    order = np.argsort(-w, kind="stable")
    owner = np.empty(len(w), dtype=np.int64)
    load = np.zeros(len(cap), dtype=np.int64)
    start = 0
    for r in range(int(cap.max(initial=0))):
        ranks = np.flatnonzero(cap > r)  # by index: a stable sort on load breaks ties by rank
        ranks = ranks[np.argsort(load[ranks], kind="stable")]
        items = order[start : start + len(ranks)]
        owner[items] = ranks
        load[ranks] += w[items]
        start += len(ranks)
    return owner


def spread(loads: Sequence[int] | np.ndarray) -> dict:
    """Per-rank work of one step, summarised: min, max and max / mean (1.0: perfectly even)."""
    a = np.asarray(loads, dtype=np.float64)
    mean = float(a.mean()) if len(a) else 0.0
    return {"min": int(a.min()), "max": int(a.max()), "max_over_mean": float(a.max() / mean) if mean else 1.0}


def straggler(loads: np.ndarray) -> dict:
    """Per-rank work of many steps (``loads[step, rank]``) summarised: the least and the most loaded rank's
    work (means over steps), the means of max / min and max / mean, and the predicted straggler cost,
    sum(max) / sum(mean) - 1: how much longer the steps take than an even split would, if a rank's time
    follows its work (every rank waits for the busiest one at the step's collective)."""
    a = np.asarray(loads, dtype=np.float64)
    lo, hi, mean = a.min(1), a.max(1), a.mean(1)
    return {
        "min": float(lo.mean()),
        "max": float(hi.mean()),
        "max_over_min": float((hi / lo).mean()) if lo.min() > 0 else None,
        "max_over_mean": float((hi / np.where(mean > 0, mean, 1)).mean()),
        "straggler_cost": float(hi.sum() / mean.sum() - 1) if mean.sum() > 0 else 0.0,
    }


def stage_fields(batch: dict, fields: tuple[str, ...]) -> dict:
    """A split pipeline stage's share of a batch: the sequence fields (``FIELDS``) named in ``fields`` and
    their companions (audio's lengths and CP bounds), and every per-sample field (keys, lengths, ...)."""
    dropped = {f for f in FIELDS if f not in fields}
    dropped |= {c for f in dropped for c in WITH.get(f, ())}
    return {k: v for k, v in batch.items() if k not in dropped}
