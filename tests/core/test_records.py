"""Typed records: what they write they read back; what they read they validate; their schema says so."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsbuild.core.errors import FormatError
from dsbuild.core.jsonio import depth_ok
from dsbuild.core.records import SHA256, JsonValue, Record, spec
from dsbuild.lineage.catalog import CommitRecord
from dsbuild.lineage.manifest import Manifest, ShardRecord


@dataclass(frozen=True, slots=True)
class Inner(Record):
    name: str
    count: int = field(metadata=spec(minimum=0))


@dataclass(frozen=True, slots=True)
class Outer(Record):
    FORMAT = "test.outer/1"
    digest: str = field(metadata=spec(pattern=SHA256))
    ratio: float
    flag: bool
    items: tuple[Inner, ...]
    labels: dict[str, str]
    note: str | None = None
    extra: JsonValue = None


DEEP: list = []
_cur = DEEP
for _ in range(70):
    _cur.append([])
    _cur = _cur[0]
GOOD = {
    "format": "test.outer/1",
    "digest": "a" * 64,
    "ratio": 1,
    "flag": True,
    "items": [{"name": "x", "count": 2}],
    "labels": {"k": "v"},
    "note": None,
    "extra": {"any": [1, 2]},
}


def test_round_trip_and_ints_are_accepted_as_floats():
    r = Outer.from_json(GOOD, "doc")
    assert r.ratio == 1.0 and isinstance(r.ratio, float) and r.items == (Inner("x", 2),)
    assert Outer.from_json(r.to_json(), "again") == r


@pytest.mark.parametrize(
    "change, message",
    [
        ({"format": "test.outer/2"}, "format is 'test.outer/2'"),
        ({"digest": "zz"}, "does not match"),
        ({"flag": 1}, "expected bool"),
        ({"ratio": True}, "expected float"),
        ({"items": [{"name": "x", "count": -1}]}, "below 0"),
        ({"items": [{"name": "x", "count": 1.5}]}, "expected int"),
        ({"items": {"name": "x"}}, "expected a list"),
        ({"labels": {"k": 1}}, "expected str"),
        ({"surprise": 1}, "unknown field 'surprise'"),
        ({"extra": DEEP}, "nested too deeply"),
    ],
)
def test_every_field_is_validated_with_its_name(change, message):
    with pytest.raises(FormatError, match=message):
        Outer.from_json({**GOOD, **change}, "doc")


@dataclass(frozen=True, slots=True)
class Partial(Record):
    """A reader's view of ``Outer``: its own fields checked, the others left unread."""

    PARTIAL = True
    FORMAT = "test.outer/1"
    digest: str = field(metadata=spec(pattern=SHA256))
    items: tuple[Inner, ...]


def test_a_partial_record_checks_its_own_fields_and_leaves_the_rest_unread():
    assert Partial.from_json({**GOOD, "surprise": object()}, "doc") == Partial("a" * 64, (Inner("x", 2),))
    for change, message in [({"digest": "zz"}, "does not match"), ({"format": "x/1"}, "format is 'x/1'")]:
        with pytest.raises(FormatError, match=message):
            Partial.from_json({**GOOD, **change}, "doc")
    with pytest.raises(FormatError, match="missing field 'items'"):
        Partial.from_json({k: v for k, v in GOOD.items() if k != "items"}, "doc")
    assert Partial.json_schema()["additionalProperties"] is True


def test_the_loaders_view_of_the_session_records_is_the_full_records_own(tmp_path):
    """The loader reads each session's id and array columns only; they are the full records' values."""
    from dsbuild.lineage.manifest import SessionColumns, SessionColumnsTable, SessionTable

    full = SessionTable.json_schema()["properties"]["sessions"]["items"]["properties"]
    for name, schema in SessionColumns.json_schema()["properties"].items():
        assert full[name] == schema, name
    doc = {
        "format": "dsbuild.sessions/1",
        "sessions": [
            {"session_id": "s-1", "path": "s-1", "samples": 2, "controls": ["a"], "telemetry": [], "repairs": {}}
        ],
        "sources": [],
    }
    import json

    data = json.dumps(doc).encode()
    assert SessionColumnsTable.from_bytes(data, "x").sessions == (SessionColumns("s-1", ("a",), ()),)
    assert SessionTable.from_bytes(data, "x").sessions[0].controls == ("a",)


def test_missing_required_fields_are_named_and_defaults_fill_in():
    doc = {k: v for k, v in GOOD.items() if k not in ("note", "extra")}
    assert Outer.from_json(doc, "doc").note is None
    with pytest.raises(FormatError, match="missing field 'digest'"):
        Outer.from_json({k: v for k, v in GOOD.items() if k != "digest"}, "doc")
    with pytest.raises(FormatError, match="expected a JSON object, found list"):
        Outer.from_json([], "doc")


@given(st.dictionaries(st.text(max_size=5), st.none() | st.integers() | st.text(max_size=5), max_size=4))
def test_arbitrary_documents_raise_only_format_errors(doc):
    try:
        Outer.from_json(doc, "doc")
    except FormatError:
        pass


def test_schemas_describe_the_records():
    schema = Manifest.json_schema()
    assert schema["properties"]["format"] == {"const": "dsbuild.manifest/3"}
    assert schema["additionalProperties"] is False and "shards" in schema["required"]
    shard = ShardRecord.json_schema()
    assert shard["properties"]["sha256"]["pattern"] == f"^{SHA256}$" and shard["properties"]["bytes"]["minimum"] == 0
    assert CommitRecord.json_schema()["properties"]["parent"]["anyOf"][1] == {"type": "null"}


def _depth(v) -> int:
    """The reference: containers on the longest path."""
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    return 0


_json = st.recursive(
    st.none() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=30,
)


@given(_json, st.integers(0, 8))
def test_depth_ok_agrees_with_the_longest_path_of_containers(doc, limit):
    assert depth_ok(doc, limit) == (_depth(doc) <= limit)


def test_depth_ok_stops_at_its_limit_on_documents_deeper_than_the_stack():
    doc: object = 0
    for _ in range(100_000):  # a recursive walk of all of it would raise RecursionError
        doc = [doc]
    assert not depth_ok(doc)
