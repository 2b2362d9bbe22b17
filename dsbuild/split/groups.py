"""The samples of a version seen as sessions and groups: what the split rule is applied to.

Reads the version's per-sample index (verified against the manifest's sha256), collapses it to one record
per session, and maps sessions to group values of a session field. Per-row work stays in Arrow, so a
version with millions of samples costs one pass over a few columns, not a Python object per sample.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from dsbuild.core.arrow import array, to_numpy
from dsbuild.core.errors import LineageError, UsageError
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.index import LOCATOR_COLUMNS
from dsbuild.split.assign import majority_stratum

SESSION_COLUMNS = ("title", "player", "platform", "build", "conditions")
NO_STRATUM = ""  # the stratum label of groups whose sessions lack the --stratify field


@dataclass(frozen=True)
class VersionSamples:
    """One version's samples (locators + session id, sorted by key) and its sessions."""

    version_id: str
    content_id: str
    table: pa.Table
    session_ids: tuple[str, ...]  # sorted
    sessions: dict[str, dict]  # session_id -> {session_id, title, player, platform, build, conditions}
    samples_per_session: dict[str, int]
    row_session: np.ndarray  # per row of ``table``: position of its session in ``session_ids``


def read_version(catalog: Catalog, version_id: str) -> VersionSamples:
    m = catalog.manifest(version_id)
    pin, content_id = m.index, m.content_id
    path = f"{catalog.url}/versions/{version_id}/{pin.path}"
    table = catalog.index(version_id, [*LOCATOR_COLUMNS, "session_id", *SESSION_COLUMNS])
    table = table.sort_by("key")
    encoded = table["session_id"].combine_chunks().dictionary_encode()
    names = encoded.dictionary.to_pylist()
    order = np.argsort(np.array(names, dtype=object), kind="stable") if names else np.zeros(0, np.int64)
    rank = np.empty(len(names), np.int64)
    rank[order] = np.arange(len(names))
    row_session = rank[to_numpy(encoded.indices)] if len(names) else np.zeros(0, np.int64)
    uniq, first, counts = np.unique(row_session, return_index=True, return_counts=True)
    firsts = table.select(["session_id", *SESSION_COLUMNS]).take(array(first, pa.int64())).to_pylist()
    sessions, per_session = {}, {}
    for record, n in zip(firsts, counts, strict=True):
        record["conditions"] = _conditions(record["conditions"], path)
        sessions[record["session_id"]] = record
        per_session[record["session_id"]] = int(n)
    session_ids = tuple(sorted(sessions))
    if len(uniq) and not np.array_equal(uniq, np.arange(len(session_ids))):
        raise LineageError(f"{path}: session ids of the index are inconsistent")
    return VersionSamples(
        version_id,
        content_id,
        table.select([*LOCATOR_COLUMNS, "session_id"]),
        session_ids,
        sessions,
        per_session,
        row_session,
    )


def _conditions(pairs: list | None, path) -> dict:
    return dict(pairs or ())


def field_value(session: dict, name: str) -> str | None:
    """A session's value of ``name`` (a session field or conditions.<key>), in Unicode NFC; None when it
    has none. NFC: the same player typed on two systems (``José`` composed or decomposed) is one group."""
    if name.startswith("conditions."):
        value = session["conditions"].get(name[len("conditions.") :])
    else:
        value = session.get(name)
    return unicodedata.normalize("NFC", value) if isinstance(value, str) and value != "" else None


def group_sessions(vs: VersionSamples, by: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """(session_id -> group value, session ids without the field). Raises if no session has it."""
    groups, missing = {}, []
    for sid in vs.session_ids:
        value = field_value(vs.sessions[sid], by)
        if value is None:
            missing.append(sid)
        else:
            groups[sid] = value
    if not groups:
        raise UsageError(f"--by {by}: no session of version {vs.version_id[:12]} has this field")
    return groups, tuple(missing)


def samples_per_group(vs: VersionSamples, group_of: dict[str, str]) -> dict[str, int]:
    out: Counter = Counter()
    for sid, g in group_of.items():
        out[g] += vs.samples_per_session[sid]
    return dict(sorted(out.items()))


def group_strata(vs: VersionSamples, group_of: dict[str, str], stratify: str) -> tuple[dict[str, str], int]:
    """(group -> stratum label, number of groups spanning several strata).

    A group belongs to the stratum holding most of its samples; sessions without the field count as the
    stratum ``NO_STRATUM``. Raises if no session has the field.
    """
    if all(field_value(vs.sessions[sid], stratify) is None for sid in vs.session_ids):
        raise UsageError(f"--stratify {stratify}: no session of version {vs.version_id[:12]} has this field")
    weights: dict[str, Counter] = {}
    for sid, g in group_of.items():
        label = field_value(vs.sessions[sid], stratify) or NO_STRATUM
        weights.setdefault(g, Counter())[label] += vs.samples_per_session[sid]
    strata = {g: majority_stratum(c) for g, c in sorted(weights.items())}
    return strata, sum(1 for c in weights.values() if len(c) > 1)


def rows_by_split(vs: VersionSamples, group_of: dict[str, str], split_of_group: dict[str, str], split: str) -> pa.Table:
    """The locator rows of one split, sorted by key, with their session, group and split columns."""
    sid_group = [group_of.get(sid) for sid in vs.session_ids]
    sid_split = np.array([split_of_group.get(g) == split if g is not None else False for g in sid_group])
    mask = sid_split[vs.row_session] if len(vs.row_session) else np.zeros(0, bool)
    rows = vs.table.filter(array(mask, pa.bool_()))
    sel = vs.row_session[mask]
    group_col = array(sid_group, pa.string()).take(array(sel, pa.int64()))
    return rows.append_column("group_value", group_col).append_column(
        "split", array([split] * rows.num_rows, pa.string())
    )
