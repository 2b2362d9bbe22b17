"""The check registry and the acceptance spec: every check is one definition with its own run code,
defaults round-trip, the committed example documents every key, and mistakes name the file, line and key."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

import dsbuild.validators
from dsbuild.core.errors import UsageError
from dsbuild.formats import format_names
from dsbuild.validators.base import Check, Threshold
from dsbuild.validators.registry import BY_NAME, CHECKS, THRESHOLDS
from dsbuild.validators.spec import default_spec, load_spec, parse_spec
from tests.cli.clitools import run
from tests.validators.support import build, write_moving_session

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
    assert [c.stage for c in CHECKS] == sorted(
        (c.stage for c in CHECKS), key=("structural", "content", "dataset").index
    )


def test_a_malformed_check_definition_is_refused():
    with pytest.raises(ValueError):
        Check("x", "structural", "doc", (Threshold("max_x", 0, "counts", "typo in the kind"),))
    with pytest.raises(ValueError):
        Check("x", "content", "doc", level="deep")


def test_no_validators_module_knows_a_shard_format_by_name():
    names = "|".join(map(re.escape, [*format_names(), "tar", "tarfile", "pyarrow.parquet"]))
    pattern = re.compile(rf"""["']({names})["']|import tarfile|pyarrow\.parquet""")
    found = [
        f"{p.relative_to(PACKAGE)}: {m.group(0)}"
        for p in PACKAGE.rglob("*.py")
        for m in pattern.finditer(p.read_text())
    ]
    assert found == []


def test_defaults_round_trip_through_their_printed_toml():
    spec = default_spec()
    again = parse_spec(spec.to_toml(), "printed")
    assert (again.thresholds, again.severity, again.max_offenders) == (
        spec.thresholds,
        spec.severity,
        spec.max_offenders,
    )


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


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "[thresholds]\nmax_decode_failures = 0\nmax_decod_failures = 1\n",
            r"s\.toml:3: unknown threshold 'max_decod_failures' \(did you mean 'max_decode_failures'\?\)",
        ),
        ("[limits]\nx = 1\n", r"s\.toml:1: unknown key 'limits'"),
        ('\n[severity]\nframes = "warn"\n', r"s\.toml:3: unknown check 'frames'"),
        ('[severity]\ndecode = "loud"\n', r"s\.toml:2: severity of 'decode' must be one of fail, warn, off"),
        # integrity and safety cannot be switched off (a flipped shard passed --level full)
        ('[severity]\nshard_hashes = "off"\n', r"s\.toml:2: 'shard_hashes' proves the version is whole .* always fail"),
        ('[severity]\nmanifest = "warn"\n', r"'manifest' proves .* not 'warn'"),
        ('[severity]\nunsafe_members = "off"\n', r"'unsafe_members' proves"),
        ("[report]\nmax_offender = 3\n", r"s\.toml:2: unknown key 'max_offender' in \[report\]"),
        ("[thresholds]\nmax_decode_failures = -1\n", r"s\.toml:2: max_decode_failures must be a whole number in \[0, "),
        ("[thresholds]\nmax_decode_failures = 0.5\n", r"whole number"),
        # beyond 64 bits the JSON report could not be written (exit 70): counts end where JSON stays exact
        (
            "[thresholds]\nmax_bad_shards = 99999999999999999999\n",
            r"max_bad_shards must be a whole number in \[0, 9007199254740991\]",
        ),
        ("[thresholds]\nmax_frozen_fraction = 2\n", r"max_frozen_fraction must be a fraction in \[0, 1\], not 2"),
        ('[thresholds]\nrequired_titles = "Kart Storm"\n', r"list of strings"),
        ('[thresholds]\nallowed_resolutions = ["720p"]\n', r"'720p' is not WxH"),
        ('[thresholds]\nrequired_conditions = ["rain"]\n', r"'rain' is not key=value"),
        ('format = "dsbuild.acceptance/9"\n', r"s\.toml:1: format"),
        # written as a dotted key, an inline table or a quoted header: the line was not found
        ("# gate\nthresholds.max_decod_failures = 1\n", r"s\.toml:2: unknown threshold"),
        ("# gate\nthresholds = { max_decod_failures = 1 }\n", r"s\.toml:2: unknown threshold"),
        ('# gate\n["thresholds"]\nmax_decod_failures = 1\n', r"s\.toml:3: unknown threshold"),
    ],
)
def test_mistakes_are_usage_errors_naming_the_file_line_and_key(text, message):
    with pytest.raises(UsageError, match=message):
        parse_spec(text, "s.toml")


NUMERIC = {k: t for k, (_, t) in THRESHOLDS.items() if t.kind != "strings"}
FRACTIONS = sorted(k for k, t in NUMERIC.items() if t.kind == "fraction")


def allowed(t: Threshold) -> str:
    """The words the refusal of a value of ``t`` must hold: its kind and its range."""
    lo, hi = t.allowed
    what = {"count": "a whole number", "fraction": "a fraction", "number": "a finite number"}[t.kind]
    return (
        f"{what} in [{lo:g}, {hi:{'d' if isinstance(hi, int) else 'g'}}]" if math.isfinite(hi) else f"{what} >= {lo:g}"
    )


def outside(t: Threshold) -> list[str]:
    """TOML literals a threshold of this kind and range must refuse."""
    lo, hi = t.allowed
    out = ["nan", "inf", "-inf", "true", '"1"', repr(lo - 0.5)] + ([repr(hi + 0.5)] if math.isfinite(hi) else [])
    return out + (["2.0", "1e30"] if t.kind == "count" else ["1" + "0" * 400])  # 1e400 as an integer


@pytest.mark.parametrize("key", sorted(NUMERIC))
def test_a_threshold_outside_its_range_is_refused_naming_it_and_the_range(key):
    for literal in outside(NUMERIC[key]):
        with pytest.raises(UsageError) as e:
            parse_spec(f"[thresholds]\n{key} = {literal}\n", "s.toml")
        assert str(e.value).startswith(f"s.toml:2: {key} must be {allowed(NUMERIC[key])}, not "), literal


@pytest.mark.parametrize("key", sorted(NUMERIC))
def test_a_threshold_at_either_end_of_its_range_is_kept(key):
    lo, hi = NUMERIC[key].allowed
    for edge in (lo, hi) if math.isfinite(hi) else (lo,):
        value = parse_spec(f"[thresholds]\n{key} = {edge!r}\n", "s.toml")[key]
        assert value == edge and type(value) is (int if NUMERIC[key].kind == "count" else float)


def test_every_fraction_is_a_fraction_of_one():
    assert FRACTIONS and all(NUMERIC[k].allowed == (0, 1) for k in FRACTIONS)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A real one-session catalog for the CLI to validate."""
    root = tmp_path_factory.mktemp("tiny")
    write_moving_session(root / "caps", "mv-a", "Kart Storm", "p-1")
    return build(root / "caps", root / "cat")[0]


def validate_with(tiny: Path, tmp_path: Path, line: str, *args, check: int) -> subprocess.CompletedProcess:
    """`dsbuild validate` of the tiny catalog under a spec holding one threshold ``line``."""
    spec = tmp_path / "spec.toml"
    spec.write_text(f"[thresholds]\n{line}\n")
    return run("validate", tiny, "--acceptance", spec, *args, check=check)


def test_cli_refuses_a_fraction_above_one_or_below_zero_with_exit_2(tiny, tmp_path):
    """Through the executable: a bad fraction is exit 2 naming file, line and range (each key's range is
    checked in-process above), and every fraction at 1 is accepted by one whole validate run."""
    key = FRACTIONS[0]
    for value in (1.5, -0.01):
        p = validate_with(tiny, tmp_path, f"{key} = {value}", check=2)
        assert p.stderr.startswith(
            f"error: {tmp_path / 'spec.toml'}:2: {key} must be a fraction in [0, 1], not {value}"
        ), p.stderr
    validate_with(tiny, tmp_path, "\n".join(f"{k} = 1" for k in FRACTIONS), "--quiet", check=0)


@pytest.mark.parametrize(
    "line, message",
    [
        ("max_decode_failures = 2.0", "max_decode_failures must be a whole number in [0, 9007199254740991], not 2.0"),
        (
            "max_decode_failures = 1e30",
            "max_decode_failures must be a whole number in [0, 9007199254740991], not 1e+30",
        ),
        ("near_duplicate_bits = 65", "near_duplicate_bits must be a whole number in [0, 64], not 65"),
        ("black_luma = 300", "black_luma must be a finite number in [0, 255], not 300"),
        ("duration_tolerance_frames = inf", "duration_tolerance_frames must be a finite number >= 0, not inf"),
        ("max_action_imbalance = 0.5", "max_action_imbalance must be a finite number >= 1, not 0.5"),
        ("min_hours_per_title = 1" + "0" * 400, "min_hours_per_title must be a finite number >= 0, not 1000"),
        ("max_decode_failures = 1" + "0" * 5000, "not valid TOML"),
    ],
)
def test_cli_refuses_a_count_or_number_outside_its_range_with_exit_2(tiny, tmp_path, line, message):
    error = json.loads(validate_with(tiny, tmp_path, line, "--json", check=2).stderr)
    assert error["exit_code"] == 2 and message in error["error"], error


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
