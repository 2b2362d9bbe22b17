"""Structural checks: the version's bytes and layout, without decoding any video.

The manifest's id and the index's pin are proven when the catalog opens them (a damaged catalog is a
``LineageError`` before any check runs). Shard hashes and locators come from ``lineage.verify`` (the
one implementation of that chain); samples are read through their format's reader, so nothing here
knows a shard format's layout.
"""

from __future__ import annotations

from collections import Counter

from dsbuild.formats.capture import parse_started_at
from dsbuild.formats.sample import ARRAY_MEMBERS, KEY_RE, MEMBERS, members_blake3, members_sha256, sample_key
from dsbuild.lineage.index import IndexRow
from dsbuild.lineage.verify import BAD_ARRAY
from dsbuild.validators.base import Check, Judge, Threshold
from dsbuild.validators.facts import SHARD_DAMAGE, VersionFacts
from dsbuild.validators.model import CheckResult
from dsbuild.validators.view import SampleView

ZERO = "any broken sample is a broken training example: none is the only safe default"
CANONICAL = (MEMBERS[0], *ARRAY_MEMBERS)  # members whose bytes must be the canonical encoding of their value
MAX_DETAILS = 4  # index fields named per disagreeing sample


# -- manifest ----------------------------------------------------------------------------------------
def _manifest(j: Judge, d: VersionFacts) -> CheckResult:
    found = [
        (
            p.get("index") or p.get("shard") or p.get("sample") or d.version_id[:12],
            p["problem"] + (f" ({p['detail']})" if p.get("detail") else ""),
            "file",
        )
        for p in d.verify
        if p["problem"] not in (*SHARD_DAMAGE, "bad locator", BAD_ARRAY)
    ]
    return j.result(
        measured=len(found),
        breaches=[f"{len(found)} problem(s)"] if found else [],
        message=found[0][1]
        if found
        else "manifest id and index pin proven; index rows, keys and per-shard sample counts agree with the manifest",
        offenders=found,
    )


# -- shard_hashes ------------------------------------------------------------------------------------
def _damaged_sample(v: SampleView) -> list[str]:
    """In a shard whose bytes changed, the samples whose canonical members no longer hash to their hash."""
    if not v.shard_damaged:
        return []
    if v.members is None:
        return [f"damaged: {v.error}"]
    return [] if members_sha256(v.members) == v.row.sha256 else ["bytes no longer match the sample hash"]


def _shard_hashes(j: Judge, d: VersionFacts) -> CheckResult:
    bad = sorted(d.bad_shards().items())
    samples = [(k, why, "sample") for k, why in d.lost + d.offenders("shard_hashes")]
    limit = j["max_bad_shards"]
    return j.result(
        measured=len(bad),
        breaches=[f"{len(bad)} > max_bad_shards = {limit}"] if len(bad) > limit else [],
        message=f"{len(bad)} of {len(d.manifest.shards)} shards missing, truncated or altered"
        + (f"; {len(samples)} sample(s) inside them damaged" if samples else ""),
        offenders=bad + sorted(samples),
        kind="shard",
    )


# -- index -------------------------------------------------------------------------------------------
def index_disagreements(row: IndexRow, v: SampleView) -> list[str]:
    """Index columns that differ from the sample they locate (the lineage table must tell the truth)."""
    sample, members = v.typed(), v.stored()
    meta = sample.meta
    s, c, vid = meta.session, meta.clip, meta.video
    want = {
        "session_id": s.session_id,
        "title": s.title,
        "player": s.player,
        "platform": s.platform,
        "build": s.build,
        "started_at": parse_started_at(s.started_at),
        "conditions": tuple(sorted(s.conditions.items())),
        "clip_index": c.index,
        "t_start": c.t_start,
        "t_end": c.t_end,
        "frames": c.frames,
        "fps": vid.fps,
        "width": vid.width,
        "height": vid.height,
        "codec": vid.codec,
        "has_audio": vid.has_audio,
        "n_controls": len(meta.controls),
        "n_channels": len(meta.telemetry_channels),
        "video_bytes": len(sample.video),
        "bytes": sum(len(p) for _, p in members),
        "action_events": meta.action_events,
        "text_events": len(meta.text),
        "source_video_sha256": meta.sources.get("video"),
    }
    wrong = [f"{k}={getattr(row, k)!r} (sample: {w!r})" for k, w in want.items() if getattr(row, k) != w]
    # one more pass over the bytes (BLAKE3: a fraction of reading them): a forged catalog whose shards are
    # sound but whose index lists other sample hashes passed every structural check, and the loader then
    # rejected every sample
    if not v.shard_damaged:  # (a shard whose bytes changed: shard_hashes names its changed samples)
        what, ok = (
            ("blake3", members_blake3(members) == row.blake3)
            if row.blake3
            else ("sha256", members_sha256(members) == row.sha256)
        )  # (versions from before BLAKE3)
        if not ok:
            wrong.append(f"{what} does not hash the sample's members (the loader would reject it)")
    if not wrong:
        return []
    more = f" and {len(wrong) - MAX_DETAILS} more" if len(wrong) > MAX_DETAILS else ""
    return ["index disagrees with the sample: " + ", ".join(wrong[:MAX_DETAILS]) + more]


def _index_sample(v: SampleView) -> list[str]:
    return index_disagreements(v.row, v) if v.sample is not None else []


def _index(j: Judge, d: VersionFacts) -> CheckResult:
    found = dict(d.offenders("index"))
    for p in d.verify:
        if p["problem"] == "bad locator":
            found[p["sample"]] = "; ".join(x for x in (f"locator: {p.get('detail', '')}", found.get(p["sample"])) if x)
    return j.count(sorted(found.items()))


# -- members -----------------------------------------------------------------------------------------
def _members(v: SampleView) -> list[str]:
    """Framed, named, typed (``SampleMeta.from_json``) and canonical: re-encoding the typed sample gives
    the stored bytes, so its sample hash is reproducible."""
    if v.sample is None:
        return [v.error or "the sample did not parse"]
    canonical = dict(v.sample.members())
    odd = [ext for ext, payload in v.stored() if ext in CANONICAL and bytes(payload) != canonical[ext]]
    return [f"member(s) {', '.join('.' + e for e in odd)} are not the canonical encoding of their value"] if odd else []


def _members_run(j: Judge, d: VersionFacts) -> CheckResult:
    """The per-sample pass's malformed samples, with those whose .npy headers lineage.verify finds are
    not the arrays the index records (a damaged sample, as the loader counts it)."""
    found = dict(d.offenders("members"))
    for p in d.verify:
        if p["problem"] == BAD_ARRAY:
            found[p["sample"]] = "; ".join(x for x in (p.get("detail", ""), found.get(p["sample"])) if x)
    return j.count(sorted(found.items()))


# -- keys --------------------------------------------------------------------------------------------
def _keys_sample(v: SampleView) -> list[str]:
    key = v.row.key
    if not KEY_RE.fullmatch(key):
        return [f"key {key[:100]!r} breaks [A-Za-z0-9_-]{{1,80}}"]
    if v.sample is None:
        return []
    meta = v.sample.meta
    if meta.key != key:
        return [f"metadata key is {meta.key!r}"]
    want = sample_key(meta.session.session_id, meta.clip.index)
    return [] if key == want else [f"key is not {want[:100]!r} (<session_id>__<clip index:06d>)"]


def key_order_problems(keys: list[str]) -> list[tuple[str, str]]:
    """Dataset-wide key rules over the index's key column: unique, and sorted."""
    counts = Counter(keys)
    out = [(k, f"key appears {n} times in the index") for k, n in sorted(counts.items()) if n > 1]
    out += [(b, f"index is not sorted: {b!r} comes after {a!r}") for a, b in zip(keys, keys[1:]) if b < a]
    return out


def _keys(j: Judge, d: VersionFacts) -> CheckResult:
    found = d.offenders("keys") + key_order_problems([r.key for r in d.rows])
    return j.count(found)


# -- unsafe_members ----------------------------------------------------------------------------------
def _unsafe(j: Judge, d: VersionFacts) -> CheckResult:
    return j.count(sorted(d.unsafe), kind="member")


CHECKS = (
    Check(
        "manifest",
        "structural",
        "The manifest's sha256 is the version id and the index is the file it pins "
        "(else validate stops: the catalog is damaged); lineage.verify finds the index's rows, keys and "
        "per-shard sample counts consistent with the manifest.",
        run=_manifest,
    ),
    Check(
        "shard_hashes",
        "structural",
        "Every shard exists with the size and sha256 the manifest records "
        "(lineage.verify); the samples inside a damaged shard are named.",
        (Threshold("max_bad_shards", 0, "count", ZERO),),
        sample=_damaged_sample,
        run=_shard_hashes,
    ),
    Check(
        "index",
        "structural",
        "Every index row locates its own sample (lineage.verify) and agrees with the "
        "sample's metadata (session fields, window, frames, fps, size, byte counts).",
        (Threshold("max_index_errors", 0, "count", ZERO),),
        counts="index row(s) disagree with their sample",
        sample=_index_sample,
        run=_index,
    ),
    Check(
        "members",
        "structural",
        "Every sample has exactly the canonical members, its metadata is a valid "
        "SampleMeta, its arrays are plain .npy (by their headers, lineage.verify: the dtype, order and "
        "shape the index records), and each member is the canonical encoding of its value.",
        (Threshold("max_malformed_samples", 0, "count", ZERO),),
        counts="sample(s) malformed",
        sample=_members,
        run=_members_run,
    ),
    Check(
        "keys",
        "structural",
        "Keys match [A-Za-z0-9_-]{1,80} (so no dots), are unique, sorted in the index, "
        "equal the metadata's key and are <session_id>__<clip index:06d>.",
        (Threshold("max_key_errors", 0, "count", ZERO),),
        counts="key problem(s)",
        sample=_keys_sample,
        run=_keys,
    ),
    Check(
        "unsafe_members",
        "structural",
        "No shard holds links, devices, paths, pickle-like members, members or "
        "rows no sample owns, or unknown columns (the format reader's scan).",
        (Threshold("max_unsafe_members", 0, "count", "untrusted bytes must never reach a loader"),),
        counts="unsafe member(s)",
        run=_unsafe,
    ),
)
