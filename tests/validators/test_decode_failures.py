"""The decode check counts every clip of the index that did not decode: one that fails mid-decode, and one
that could not be read at all (a malformed member, a member missing, a truncated or missing shard, a
row whose shard the manifest lacks), each named with the reason. Through the library and the real CLI."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from dsbuild.core.executor import ExecutorSpec
from dsbuild.validators import ValidateOptions, validate
from tests.cli.clitools import run
from tests.helpers import shard_files, with_index
from tests.validators.support import build, copy_catalog, reseal, rows, write_moving_session

FULL = ValidateOptions(level="full")


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """Two moving sessions of 2 s in one shard, 1 s clips: four samples that all decode."""
    root = tmp_path_factory.mktemp("decode")
    write_moving_session(root / "caps", "mv-a", "Kart Storm", "p-1", seed=1)
    write_moving_session(root / "caps", "mv-b", "Sky Rally", "p-2", seed=2)
    return build(root / "caps", root / "cat", clip_seconds=1.0)


def decode_failures(cat, vid) -> tuple[object, dict[str, str]]:
    """The decode check's result and its offenders (key -> reason)."""
    check = validate(cat, vid, options=FULL, executor=ExecutorSpec(workers=1)).check("decode")
    return check, {o.item: o.detail for o in check.offenders}


def garbage_json(victim):
    return lambda key, members: [(e, b"{garbage" if e == "json" and key == victim else p) for e, p in members]


def without_video(victim):
    return lambda key, members: [(e, p) for e, p in members if not (e == "mp4" and key == victim)]


@pytest.mark.parametrize("damage, reason", [(garbage_json, "invalid JSON"), (without_video, "not the canonical")])
def test_a_sample_that_cannot_be_read_is_a_decode_failure_with_its_reason(clean, tmp_path, damage, reason):
    cat = copy_catalog(clean[0], tmp_path / "cat")
    victim = [r.key for r in rows(*clean)][1]
    check, found = decode_failures(cat, reseal(cat, clean[1], damage(victim)))
    assert check.status == "fail" and check.measured == check.offender_count == 1
    assert list(found) == [victim] and found[victim].startswith("not decoded: the sample cannot be read")
    assert reason in found[victim]


def test_samples_cut_off_by_a_truncated_shard_are_decode_failures(clean, tmp_path):
    cat = copy_catalog(clean[0], tmp_path / "cat")
    vid = reseal(cat, clean[1], shard_bytes=lambda n, data: data[: len(data) // 2])
    check, found = decode_failures(cat, vid)
    cut = [k for k in found if "shard ends inside the sample" in found[k]]
    assert cut and sorted(cut) == sorted(found) and check.measured == len(found) < len(rows(cat, vid))


def test_every_clip_of_a_missing_shard_is_a_decode_failure(clean, tmp_path):
    cat = copy_catalog(clean[0], tmp_path / "cat")
    shard_files(cat, clean[1])[0].unlink()
    check, found = decode_failures(cat, clean[1])
    assert sorted(found) == [r.key for r in rows(cat, clean[1])] and check.measured == 4
    assert all(why.startswith("not decoded: lost with missing shard") for why in found.values())


def test_a_row_whose_shard_the_manifest_lacks_is_a_decode_failure(clean, tmp_path):
    cat = copy_catalog(clean[0], tmp_path / "cat")
    victim = [r.key for r in rows(*clean)][2]
    nowhere = "shards/00/" + "0" * 64 + ".tar"

    def elsewhere(table: pa.Table) -> pa.Table:
        shards = [nowhere if k == victim else s for k, s in zip(table["key"].to_pylist(), table["shard"].to_pylist())]
        return table.set_column(
            table.schema.get_field_index("shard"),
            table.schema.field("shard"),
            pa.array(shards, table.schema.field("shard").type),
        )

    check, found = decode_failures(cat, with_index(cat, clean[1], elsewhere, remove=True))
    assert found == {victim: f"not decoded: never read from its shard {nowhere}"} and check.measured == 1


def test_cli_reports_an_unreadable_sample_as_a_decode_failure(clean, tmp_path):
    cat = copy_catalog(clean[0], tmp_path / "cat")
    victim = next(r.key for r in rows(*clean))
    reseal(cat, clean[1], garbage_json(victim))
    p = run("validate", cat, "--level", "full", "--json", check=1)
    decode = next(c for c in json.loads(p.stdout)["checks"] if c["name"] == "decode")
    assert (decode["status"], decode["measured"]) == ("fail", 1)
    assert [o["item"] for o in decode["offenders"]] == [victim] and "invalid JSON" in decode["offenders"][0]["detail"]
    assert "decode" in json.loads(p.stderr.splitlines()[-1])["error"]  # the gate names it among the failed checks
