"""What a convert would do, without doing it (`convert --dry-run`, like `dvc status`): which sessions are
new, changed, reused from the parent version, quarantined or removed.

Sources are hashed (or found in the hash cache) exactly as convert does; nothing is written. Damage
that only cutting the video reveals (an undecodable stream) is not predicted.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsbuild.convert.build import parent_base, reusable_parent
from dsbuild.convert.captures import read_sessions, staged
from dsbuild.convert.config import ConvertConfig
from dsbuild.convert.session import hash_sources, source_set
from dsbuild.core.errors import CaptureError, UsageError
from dsbuild.core.records import Record
from dsbuild.core.store import is_url, local_path
from dsbuild.lineage.catalog import Catalog

STATES = ("new", "changed", "reused", "healed", "quarantined", "removed")


@dataclass(frozen=True, slots=True)
class SessionPlan(Record):
    session: str  # session id (or the folder, when session.json cannot be read)
    path: str  # folder relative to the capture root
    state: str  # new | changed | reused | healed (unchanged, in a missing parent shard) | quarantined | removed
    reason: str | None = None  # why quarantined


@dataclass(frozen=True, slots=True)
class ConvertPlan(Record):
    catalog: str
    parent: str | None  # the version whose samples would be reused
    reusable: bool  # False: no parent, or it was built with other settings (everything is rebuilt)
    sessions: tuple[SessionPlan, ...]

    def count(self, state: str) -> int:
        return sum(s.state == state for s in self.sessions)

    def to_json(self) -> dict:
        return {**Record.to_json(self), "counts": {s: self.count(s) for s in STATES}}


def plan_convert(captures: str, out: str, config: ConvertConfig, onto: str | None = None) -> ConvertPlan:
    """What ``convert(captures, out, config, onto=onto)`` would do, writing nothing."""
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
    parent, same_settings = reusable_parent(catalog, config, onto) if catalog is not None else (None, None)
    # what a build could take from the parent: its rows, and which sessions sit in a missing shard
    reusable = (
        parent_base(catalog, parent, same_settings, False, 4)
        if catalog is not None and parent is not None and same_settings is not None
        else None
    )
    base = catalog.sessions(parent) if catalog is not None and parent else None
    old: dict[str, list] = {}
    for src in base.sources if base else ():
        old.setdefault(src.session, []).append(src)
    sessions, quarantined = read_sessions(root)
    plans = [SessionPlan(q.session, q.path, "quarantined", q.reason) for q in quarantined]
    for s in sessions:
        try:
            mine = source_set(hash_sources(s, root)[0])
        except CaptureError as e:
            plans.append(SessionPlan(s.session_id, s.rel, "quarantined", e.reason))
            continue
        if s.session_id not in old:
            state = "new"
        elif reusable is None or source_set(old[s.session_id]) != mine:
            state = "changed"
        else:  # unchanged: reused, unless a parent shard holding its samples is missing (processed again)
            state = "healed" if s.session_id in reusable.broken else "reused"
        plans.append(SessionPlan(s.session_id, s.rel, state))
    present = {s.session_id for s in sessions}
    kept = {p.session for p in plans}
    for rec in base.sessions if base else ():
        if rec.session_id not in present and rec.session_id not in kept:
            plans.append(SessionPlan(rec.session_id, rec.path, "removed"))
    return ConvertPlan(
        catalog.url if catalog is not None else str(out),
        parent,
        reusable is not None,
        tuple(sorted(plans, key=lambda p: (p.path, p.session))),
    )
