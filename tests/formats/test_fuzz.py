"""hypothesis fuzzing of every parser that meets untrusted bytes: they raise our FormatError (or
return), never anything else. Sized to run in well under a minute; fuzz/ has atheris harnesses for
longer runs."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsbuild.core.errors import FormatError
from dsbuild.core.jsonio import loads_bounded
from dsbuild.formats.sample import SampleMeta, decompress_events
from dsbuild.formats.webdataset import parse_members
from dsbuild.lineage.catalog import CommitRecord
from dsbuild.lineage.index import table_from_bytes
from dsbuild.lineage.manifest import Manifest

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=30,
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(st.binary(max_size=600))
def test_tar_parser_only_raises_format_errors(data):
    try:
        parse_members(data)
    except FormatError:
        pass


@FUZZ
@given(st.binary(max_size=64))
def test_tar_parser_survives_mutated_valid_headers(tail):
    from dsbuild.formats.webdataset import _header

    data = bytearray(_header("k__000001.json", 3) + b"abc" + b"\0" * 509)
    for i, b in enumerate(tail):
        data[(b * 7 + i) % 512] = b
    try:
        parse_members(bytes(data))
    except FormatError:
        pass


@FUZZ
@given(json_values)
def test_manifest_parser_only_raises_format_errors(doc):
    for candidate in (doc, {"format": Manifest.FORMAT, **(doc if isinstance(doc, dict) else {})}):
        try:
            Manifest.from_bytes(json.dumps(candidate).encode(), "fuzz")
        except FormatError:
            pass


@FUZZ
@given(st.binary(max_size=300))
def test_json_reader_only_raises_format_errors(data):
    try:
        loads_bounded(data, max_bytes=1 << 16, what="fuzz")
    except FormatError:
        pass


@FUZZ
@given(st.binary(max_size=300))
def test_events_decompressor_only_raises_format_errors(data):
    try:
        decompress_events(b"\x28\xb5\x2f\xfd" + data, limit=1 << 16)
    except FormatError:
        pass


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400))
def test_index_reader_only_raises_format_errors(data):
    try:
        table_from_bytes(b"PAR1" + data + b"PAR1", "fuzz")
    except FormatError:
        pass


@FUZZ
@given(json_values)
def test_typed_records_only_raise_format_errors(doc):
    for cls in (SampleMeta, CommitRecord):
        for candidate in (doc, {"format": cls.FORMAT, **(doc if isinstance(doc, dict) else {})}):
            try:
                cls.from_json(candidate, "fuzz")
            except FormatError:
                pass
