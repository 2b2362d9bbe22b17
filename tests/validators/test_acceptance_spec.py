"""The check registry and the acceptance spec: every check is one definition with its own run code,
defaults round-trip, the committed example documents every key, and mistakes name the file, line and key."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest

import dsbuild.validators
from dsbuild.core.errors import UsageError
from dsbuild.formats import format_names
from dsbuild.validators.base import Check, Threshold
from dsbuild.validators.registry import BY_NAME, CHECKS, THRESHOLDS
from dsbuild.validators.spec import default_spec, load_spec, parse_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "acceptance.toml"
PACKAGE = Path(dsbuild.validators.__file__).parent


def test_every_check_is_one_definition_with_a_doc_a_run_function_and_reasoned_defaults():
    spec = default_spec()
    assert len(BY_NAME) == len(CHECKS)
    for c in CHECKS:
        assert isinstance(c, Check) and c.doc and callable(c.run)
        assert c.stage in ("structural", "content", "dataset") and c.severity in ("fail", "warn")
        for t in c.thresholds:
            assert spec[t.key] == t.default and t.reason
        if c.sample is not None and c.run.__name__ == "count_offenders":
            assert c.thresholds[0].kind == "count"  # the default run counts offenders against it
    assert len(THRESHOLDS) == sum(len(c.thresholds) for c in CHECKS)  # no key belongs to two checks
    assert [c.stage for c in CHECKS] == sorted((c.stage for c in CHECKS), key=("structural", "content", "dataset").index)


def test_a_malformed_check_definition_is_refused():
    with pytest.raises(ValueError):
        Check("x", "structural", "doc", (Threshold("max_x", 0, "counts", "typo in the kind"),))
    with pytest.raises(ValueError):
        Check("x", "content", "doc", level="deep")


def test_no_validators_module_knows_a_shard_format_by_name():
    names = "|".join(map(re.escape, [*format_names(), "tar", "tarfile", "pyarrow.parquet"]))
    pattern = re.compile(rf"""["']({names})["']|import tarfile|pyarrow\.parquet""")
    found = [f"{p.relative_to(PACKAGE)}: {m.group(0)}" for p in PACKAGE.rglob("*.py")
             for m in pattern.finditer(p.read_text())]
    assert found == []


def test_defaults_round_trip_through_their_printed_toml():
    spec = default_spec()
    again = parse_spec(spec.to_toml(), "printed")
    assert (again.thresholds, again.severity, again.max_offenders) == (spec.thresholds, spec.severity,
                                                                        spec.max_offenders)


def test_committed_example_sets_every_threshold_and_parses():
    spec = load_spec(EXAMPLE)
    doc = tomllib.loads(EXAMPLE.read_text())
    assert set(doc["thresholds"]) == set(THRESHOLDS)  # the example documents every key
    assert spec["required_titles"] == ["Kart Storm", "Dungeon Drift", "Sky Rally"]
    assert spec.severity_of("near_duplicates") == "warn" and spec.source == str(EXAMPLE)


def test_keys_left_out_keep_their_defaults():
    spec = parse_spec("[thresholds]\nmax_frozen_fraction = 0.2\n", "s.toml")
    assert spec["max_frozen_fraction"] == 0.2
    assert spec["max_decode_failures"] == 0 and spec.severity_of("decode") == "fail"


@pytest.mark.parametrize("text, message", [
    ("[thresholds]\nmax_decode_failures = 0\nmax_decod_failures = 1\n",
     r"s\.toml:3: unknown threshold 'max_decod_failures' \(did you mean 'max_decode_failures'\?\)"),
    ("[limits]\nx = 1\n", r"s\.toml:1: unknown key 'limits'"),
    ("\n[severity]\nframes = \"warn\"\n", r"s\.toml:3: unknown check 'frames'"),
    ("[severity]\ndecode = \"loud\"\n", r"s\.toml:2: severity of 'decode' must be one of fail, warn, off"),
    ("[report]\nmax_offender = 3\n", r"s\.toml:2: unknown key 'max_offender' in \[report\]"),
    ("[thresholds]\nmax_decode_failures = -1\n", r"s\.toml:2: max_decode_failures must be a number >= 0"),
    ("[thresholds]\nmax_decode_failures = 0.5\n", r"whole number"),
    ("[thresholds]\nmax_frozen_fraction = 2\n", r"fraction between 0 and 1"),
    ("[thresholds]\nrequired_titles = \"Kart Storm\"\n", r"list of strings"),
    ("[thresholds]\nallowed_resolutions = [\"720p\"]\n", r"'720p' is not WxH"),
    ("[thresholds]\nrequired_conditions = [\"rain\"]\n", r"'rain' is not key=value"),
    ("format = \"dsbuild.acceptance/9\"\n", r"s\.toml:1: format"),
])
def test_mistakes_are_usage_errors_naming_the_file_line_and_key(text, message):
    with pytest.raises(UsageError, match=message):
        parse_spec(text, "s.toml")


def test_malformed_toml_names_the_line():
    with pytest.raises(UsageError, match=r"s\.toml: not valid TOML: .*line 3"):
        parse_spec("[thresholds]\nmax_decode_failures = 0\nmax_frozen_fraction = = 1\n", "s.toml")


def test_missing_unreadable_non_utf8_and_special_files_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="acceptance spec not found"):
        load_spec(tmp_path / "nope.toml")
    with pytest.raises(UsageError, match="is a folder"):
        load_spec(tmp_path)
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b"# caf\xe9\n")
    with pytest.raises(UsageError, match="not UTF-8"):
        load_spec(bad)
    fifo = tmp_path / "spec.fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="FIFO"):  # never blocks waiting for a writer
        load_spec(fifo)
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"#" * (2 << 20))
    with pytest.raises(UsageError, match="larger than the limit"):
        load_spec(huge)


def test_the_ci_doc_lists_every_check_with_its_thresholds_and_defaults():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "ci-gate.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line for line in doc.splitlines() if line.startswith("| `")}
    for c in CHECKS:
        assert c.name in rows, c.name
        assert c.severity in rows[c.name] and ("(full)" in rows[c.name]) == (c.level == "full")
        for t in c.thresholds:
            assert f"`{t.key}` = {t.default!r}".replace("'", '"') in rows[c.name], t.key
