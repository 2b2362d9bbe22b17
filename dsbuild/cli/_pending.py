"""FOR THE LEAD TO MOVE INTO THE LIBRARY. Library functions the CLI needs that do not exist yet.

The CLI only parses and renders; these are here (small, self-contained) so the commands work until
each moves to its package. Suggested homes:

- ``plan_convert``     -> ``dsbuild.convert.plan`` (uses convert's private ``_sources``; share the
                          parent choice with ``convert.build._parent``)
- ``shard_locations``  -> ``dsbuild.lineage.history`` (or a ``lineage.shards`` module)
- ``parse_damage``     -> ``dsbuild.samples.synthetic``
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from dsbuild.core.errors import CaptureError, UsageError


# -- convert --dry-run ---------------------------------------------------------------------------
@dataclass(frozen=True)
class SessionPlan:
    session: str  # session id (or folder, when session.json cannot be read)
    path: str  # folder relative to the capture root
    state: str  # new | changed | reused | quarantined | removed
    reason: str | None = None  # why quarantined


@dataclass(frozen=True)
class ConvertPlan:
    catalog: str
    parent: str | None  # the version whose samples would be reused
    reusable: bool  # False: no parent, or it was built with other settings (everything is rebuilt)
    sessions: tuple[SessionPlan, ...]

    def count(self, state: str) -> int:
        return sum(s.state == state for s in self.sessions)

    def to_json(self) -> dict:
        states = ("new", "changed", "reused", "quarantined", "removed")
        return {"catalog": self.catalog, "parent": self.parent, "reusable": self.reusable,
                "counts": {s: self.count(s) for s in states},
                "sessions": [s.__dict__ for s in self.sessions]}


def plan_convert(captures: str, out: str, config, onto: str | None = None) -> ConvertPlan:
    """What ``convert(captures, out, config, onto=onto)`` would do, without writing anything: which
    sessions are new, changed (rebuilt), reused from the parent version, quarantined (unreadable
    session.json, duplicated id, unsafe or unreadable source file) or removed (in the parent only).
    Sources are hashed, as convert does; damage found only while cutting video is not predicted."""
    from dsbuild import __version__
    from dsbuild.convert.captures import read_sessions, staged
    from dsbuild.convert.session import _sources, source_set
    from dsbuild.core.hashing import sha256_json
    from dsbuild.core.store import is_url, local_path
    from dsbuild.lineage.catalog import Catalog

    if is_url(captures):
        with staged(str(captures)) as local:
            return plan_convert(str(local), out, config, onto)
    root = local_path(captures)
    if not root.is_dir():
        raise UsageError(f"{root}: capture folder does not exist" if not root.exists() else f"{root}: is not a folder")
    try:
        catalog = Catalog.open(out)
    except UsageError:
        if onto:
            raise
        catalog = None
    parent = catalog.resolve(onto) if catalog is not None and (onto or catalog.versions()) else None
    base = catalog.manifest(parent) if parent else None
    reusable = bool(base) and base.config_hash == sha256_json(config.to_json()) and base.tool_version == __version__
    if onto and not reusable:
        raise UsageError(f"--onto {onto}: version {parent[:12]} was built with other settings",
                         hint="convert without --onto for a fresh build")
    old: dict[str, list] = {}
    for s in base.sources if base else ():
        old.setdefault(s.session, []).append(s)
    sessions, quarantined = read_sessions(root)
    plans = [SessionPlan(q.session, q.path, "quarantined", q.reason) for q in quarantined]
    for s in sessions:
        try:
            mine = source_set(_sources(s, root)[0])
        except CaptureError as e:
            plans.append(SessionPlan(s.session_id, s.rel, "quarantined", e.reason))
            continue
        if s.session_id not in old:
            state = "new"
        else:
            state = "reused" if reusable and source_set(old[s.session_id]) == mine else "changed"
        plans.append(SessionPlan(s.session_id, s.rel, state))
    present = {s.session_id for s in sessions}
    kept = {p.session for p in plans}
    for rec in base.sessions if base else ():
        if rec.session_id not in present and rec.session_id not in kept:
            plans.append(SessionPlan(rec.session_id, rec.path, "removed"))
    return ConvertPlan(catalog.url if catalog is not None else str(out), parent, reusable,
                       tuple(sorted(plans, key=lambda p: (p.path, p.session))))


# -- dsbuild shards ------------------------------------------------------------------------------
def shard_locations(catalog, version_id: str, split: str | None = None) -> list[dict]:
    """The version's shards in manifest order (the order of their samples' keys), each as
    ``{"url", "path", "sha256", "bytes", "samples", "in_split"}``. ``url`` is the fsspec URL (file://
    for a local catalog); ``path`` the local file (None on an object store). With ``split``
    (NAME/SPLIT) only the shards holding samples of that split, and ``in_split`` counts them (shards
    span sessions, so a shard may also hold samples of other splits)."""
    from collections import Counter

    from dsbuild.lineage.splitsets import open_split_set

    m = catalog.manifest(version_id)
    counts = None
    if split is not None:
        name, slash, part = split.partition("/")
        if not slash or not name or not part:
            raise UsageError(f"--split {split!r}: use NAME/SPLIT, e.g. main/train")
        counts = Counter(open_split_set(catalog, version_id, name).table(part, ["shard"])["shard"].to_pylist())
    out = []
    for s in m.shards:
        if counts is not None and not counts.get(s.path):
            continue
        local = catalog.root / s.path if catalog.root is not None else None
        url = local.resolve().as_uri() if local is not None else f"{catalog.url.rstrip('/')}/{s.path}"
        out.append({"url": url, "path": str(local) if local is not None else None, "sha256": s.sha256,
                    "bytes": s.bytes, "samples": s.samples,
                    "in_split": counts.get(s.path, 0) if counts is not None else s.samples})
    return out


# -- dsbuild samples --damage --------------------------------------------------------------------
def parse_damage(items: list[str], sessions: int) -> dict[int, str]:
    """``["truncated_video", "2=bad_json"]`` -> {0: "truncated_video", 2: "bad_json"}: a bare KIND
    damages the session at its position in the list. Indices must name one of ``sessions``."""
    from dsbuild.samples.synthetic import DAMAGE

    plan: dict[int, str] = {}
    for i, item in enumerate(items):
        index, eq, kind = str(item).rpartition("=")
        if kind not in DAMAGE:
            close = difflib.get_close_matches(kind, DAMAGE, n=1)
            raise UsageError(f"--damage {item!r}: unknown kind {kind!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
                             hint=f"kinds: {', '.join(DAMAGE)}")
        try:
            at = int(index) if eq else i
        except ValueError:
            raise UsageError(f"--damage {item!r}: {index!r} is not a session index (use INDEX=KIND)") from None
        if not 0 <= at < sessions:
            raise UsageError(f"--damage {item!r}: session index {at} is out of range; --sessions {sessions} "
                             f"gives indices 0..{sessions - 1}")
        if at in plan:
            raise UsageError(f"--damage: session {at} is damaged twice ({plan[at]} and {kind})")
        plan[at] = kind
    return plan
