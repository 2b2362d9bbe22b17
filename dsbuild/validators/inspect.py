"""The per-sample pass, run in worker processes: read each sample of a unit once and report small facts.

A unit is a run of index rows of one shard (whole row groups for Parquet), so a worker opens each shard
once and only small per-sample facts (problems, measurements, a 256-bit hash) cross process boundaries,
never sample bytes. The first unit of each shard also lists the shard's members for ``unsafe_members``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from dsbuild.formats.probe import frame_rate
from dsbuild.validators.checks.content import analyse_video, array_problems, events_problems, text_problems
from dsbuild.validators.checks.structural import meta_problems, sample_problems, scan_shard
from dsbuild.validators.reading import read_samples

UNIT_SAMPLES = {"structural": 256, "full": 16}  # rows per unit: decoding is slow, so smaller units balance
ACTIVE = 0.5  # |value| at which a control counts as in use (buttons are 0/1; axes past half travel)


@dataclass(frozen=True)
class Unit:
    path: str | None  # a local file holding the shard (None: it could not be fetched, see ``unreadable``)
    shard: str  # its path in the catalog, for messages
    shard_format: str
    rows: tuple[dict, ...]
    level: str
    audio_dropped: tuple[str, ...] = ()  # sessions whose build recorded not carrying the audio
    scan_keys: tuple[str, ...] | None = None  # set on a shard's first unit: every key the index gives the shard
    unreadable: str = ""


def make_units(paths: dict[str, tuple[str | None, str]], shard_format: str, rows: list[dict], level: str,
               audio_dropped: set[str]) -> list[Unit]:
    """``paths``: shard -> (local file or None, why it is unreadable)."""
    by_shard: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_shard[r["shard"]].append(r)
    size = UNIT_SAMPLES[level]
    dropped = tuple(sorted(audio_dropped))
    units = []
    for shard in sorted(by_shard):
        srows = by_shard[shard]
        if shard_format == "parquet":  # keep row groups whole: each is read once
            srows = sorted(srows, key=lambda r: (r["row_group"] if r["row_group"] is not None else -1,
                                                 r["row"] if r["row"] is not None else -1))
        else:
            srows = sorted(srows, key=lambda r: r["offset"] if r["offset"] is not None else -1)
        chunk: list[dict] = []
        first = True
        for i, r in enumerate(srows):
            chunk.append(r)
            nxt = srows[i + 1] if i + 1 < len(srows) else None
            boundary = nxt is None or shard_format != "parquet" or nxt["row_group"] != r["row_group"]
            if nxt is None or (len(chunk) >= size and boundary):
                scan = tuple(sorted(x["key"] for x in srows)) if first else None
                path, why = paths.get(shard, (None, "shard is not in the manifest"))
                units.append(Unit(path, shard, shard_format, tuple(chunk), level, dropped, scan, why))
                chunk, first = [], False
    return units


def damaged_samples(path: str | None, shard: str, shard_format: str, rows: list[dict]) -> list[tuple]:
    """(key, detail, "sample") for each sample of a damaged shard whose bytes no longer match its hash."""
    if path is None:
        return []
    out = []
    for row, d in read_samples(path, shard_format, rows, with_hash=True):
        if d.sha256 is None or d.sha256 != row["sha256"]:
            why = "bytes do not match the sample hash" if d.sha256 else "; ".join(x for _, x in d.problems)
            out.append((row["key"], f"damaged in {shard}: {why or 'unreadable'}", "sample"))
    return out


def _usage(meta: dict | None, actions: np.ndarray | None) -> dict | None:
    if meta is None or actions is None or actions.ndim != 2 or actions.shape[1] != len(meta.get("controls") or ()):
        return None
    active = (np.abs(np.nan_to_num(actions)) >= ACTIVE).sum(axis=0)
    return {"controls": list(meta["controls"]), "active": [int(x) for x in active], "frames": int(actions.shape[0])}


def inspect_unit(unit: Unit) -> dict:
    """{"samples": [facts per sample], "unsafe": [(item, detail)]} for one unit."""
    samples = []
    for row, d in read_samples(unit.path, unit.shard_format, list(unit.rows), unit.unreadable):
        problems = sample_problems(row, d, unit.shard_format)
        if d.sha256 is not None and d.sha256 != row["sha256"]:  # Parquet: the row's stored hash
            problems.append(("shard_hashes", f"row in {unit.shard} holds sample hash {d.sha256[:16]}…, "
                                             "not the index's"))
        ok_meta = d.meta is not None and not meta_problems(d.meta)
        fact = {"key": row["key"], "problems": problems, "usage": _usage(d.meta if ok_meta else None, d.actions),
                "video": None, "expect": None, "audio_expected": None, "content": False}
        if unit.level == "full" and ok_meta and d.readable:
            meta = d.meta
            clip, video = meta["clip"], meta["video"]
            fact["content"] = True
            fact["video"] = analyse_video(d.video, clip["frames"])
            ts = d.timestamps
            rate = frame_rate(ts) if isinstance(ts, np.ndarray) and ts.shape == (clip["frames"],) else None
            fact["expect"] = {"frames": clip["frames"], "fps": rate or video["fps"], "width": video["width"],
                              "height": video["height"], "duration": clip["t_end"] - clip["t_start"],
                              "t_start": clip["t_start"], "audio": video.get("audio")}
            dropped = meta["session"]["session_id"] in unit.audio_dropped
            fact["audio_expected"] = bool(video["has_audio"]) and not dropped
            problems += array_problems(meta, d.actions, d.telemetry, d.timestamps)
            problems += events_problems(meta, d.events)
            problems += text_problems(meta)
        samples.append(fact)
    unsafe = scan_shard(unit.path, unit.shard, unit.shard_format, set(unit.scan_keys)) \
        if unit.scan_keys is not None and unit.path else []
    return {"samples": samples, "unsafe": unsafe}
