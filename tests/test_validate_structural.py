"""Structural checks: a clean version passes; each kind of damage fails its own check, naming the shard,
sample or member, and never raises."""

from __future__ import annotations

import json
import tarfile

import pytest

from dsbuild.validators import ValidateOptions, validate
from dsbuild.validators.checks.structural import key_order_problems, meta_problems
from tests.helpers import index_rows, manifest
from tests.test_validate_support import copy_catalog, reseal

STRUCTURAL = ("manifest", "shard_hashes", "index", "members", "keys", "unsafe_members")


def failing(report) -> set[str]:
    return {c.name for c in report.checks if c.status == "fail"}


def items(report, check: str) -> list[str]:
    return [o.item for o in report.check(check).offenders]


@pytest.mark.parametrize("fixture", ["wds_catalog", "parquet_catalog"])
def test_clean_versions_pass_every_structural_check(fixture, request):
    cat, vid = request.getfixturevalue(fixture)
    report = validate(cat, vid, options=ValidateOptions(workers=1))
    assert report.accepted and report.level == "structural"
    assert {c.name: c.status for c in report.checks if c.name in STRUCTURAL} == dict.fromkeys(STRUCTURAL, "pass")
    assert report.check("decode").status == "skip" and "--level full" in report.check("decode").message
    assert report.summary["samples"] == len(index_rows(cat, vid))


def test_flipped_byte_fails_shard_hashes_naming_the_shard_and_the_sample(wds_catalog, tmp_path):
    cat = copy_catalog(wds_catalog[0], tmp_path / "cat")
    vid = wds_catalog[1]
    row = index_rows(cat, vid)[4]
    shard = cat / row["shard"]
    data = bytearray(shard.read_bytes())
    data[row["offset"] + row["length"] // 2] ^= 0xFF  # inside this sample's video
    shard.write_bytes(bytes(data))
    report = validate(cat, vid, options=ValidateOptions(workers=1))
    assert not report.accepted and "shard_hashes" in failing(report)
    offenders = report.check("shard_hashes").offenders
    assert offenders[0].kind == "shard" and offenders[0].item == row["shard"] and "altered" in offenders[0].detail
    assert row["key"] in items(report, "shard_hashes")


def test_truncated_shard_names_the_samples_cut_off(wds_catalog, tmp_path):
    cat = copy_catalog(wds_catalog[0], tmp_path / "cat")
    vid = wds_catalog[1]
    rows = [r for r in index_rows(cat, vid) if r["shard"] == manifest(cat, vid)["shards"][0]["path"]]
    last = max(rows, key=lambda r: r["offset"])
    shard = cat / last["shard"]
    shard.write_bytes(shard.read_bytes()[: last["offset"] + 100])
    report = validate(cat, vid, options=ValidateOptions(workers=1))
    assert {"shard_hashes", "members"} <= failing(report)
    assert "truncated" in report.check("shard_hashes").offenders[0].detail
    assert last["key"] in items(report, "members")


def test_missing_shard_names_its_samples(parquet_catalog, tmp_path):
    cat = copy_catalog(parquet_catalog[0], tmp_path / "cat")
    vid = parquet_catalog[1]
    gone = manifest(cat, vid)["shards"][0]["path"]
    (cat / gone).unlink()
    report = validate(cat, vid, options=ValidateOptions(workers=1))
    assert "shard_hashes" in failing(report)
    lost = sorted(r["key"] for r in index_rows(cat, vid) if r["shard"] == gone)
    assert set(lost) <= set(items(report, "shard_hashes"))


def test_edited_manifest_fails_the_manifest_check(wds_catalog, tmp_path):
    cat = copy_catalog(wds_catalog[0], tmp_path / "cat")
    vid = wds_catalog[1]
    path = cat / "versions" / vid / "manifest.json"
    doc = json.loads(path.read_text())
    doc["stats"]["samples"] += 1
    path.write_text(json.dumps(doc, indent=1, sort_keys=True))
    report = validate(cat, vid, options=ValidateOptions(workers=1))
    details = [o.detail for o in report.check("manifest").offenders]
    assert report.check("manifest").status == "fail"
    assert any("not the version id" in d for d in details) and any("stats.samples" in d for d in details)


def test_altered_index_stops_after_the_manifest_check(wds_catalog, tmp_path):
    cat = copy_catalog(wds_catalog[0], tmp_path / "cat")
    vid = wds_catalog[1]
    (cat / "versions" / vid / "index.parquet").write_bytes(b"PAR1 not really")
    report = validate(cat, vid, options=ValidateOptions(workers=1))
    assert failing(report) == {"manifest"} and "index.parquet" in report.check("manifest").message
    skipped = report.check("shard_hashes")
    assert skipped.status == "skip" and "manifest check failed" in skipped.message


def test_metadata_that_disagrees_with_the_index_fails_index_and_keys(wds_catalog, tmp_path):
    cat = copy_catalog(wds_catalog[0], tmp_path / "cat")
    keys = [r["key"] for r in index_rows(cat, wds_catalog[1])]

    def edit(key, members):
        if key not in (keys[1], keys[2]):
            return members
        out = []
        for name, payload in members:
            if name.endswith(".json"):
                meta = json.loads(payload)
                if key == keys[1]:
                    meta["clip"]["frames"] += 7
                else:
                    meta["key"] = "someone-else__000000"
                payload = json.dumps(meta, sort_keys=True).encode()
            out.append((name, payload))
        return out

    vid = reseal(cat, wds_catalog[1], edit)
    report = validate(cat, vid, options=ValidateOptions(workers=1))
    assert failing(report) == {"index", "keys"}  # hashes, manifest and members are consistent
    assert items(report, "index") == [keys[1]] and "frames=" in report.check("index").offenders[0].detail
    assert items(report, "keys") == [keys[2]]


def test_missing_and_extra_members_fail_members_and_pickles_fail_unsafe_members(wds_catalog, tmp_path):
    cat = copy_catalog(wds_catalog[0], tmp_path / "cat")
    keys = [r["key"] for r in index_rows(cat, wds_catalog[1])]

    def edit(key, members):
        if key == keys[0]:
            return [(n, p) for n, p in members if not n.endswith(".actions.npy")]
        if key == keys[3]:
            return members + [(f"{key}.pyd", b"\x80\x04K\x01.")]  # a pickle, never to be loaded
        return members

    vid = reseal(cat, wds_catalog[1], edit, trailing={0: [("orphan__000000.pkl", b"\x80\x04N.")]})
    report = validate(cat, vid, options=ValidateOptions(workers=1))
    assert {"members", "unsafe_members"} <= failing(report)
    members = dict((o.item, o.detail) for o in report.check("members").offenders)
    assert "missing member(s): .actions.npy" in members[keys[0]] and "unexpected member(s): .pyd" in members[keys[3]]
    unsafe = dict((o.item.split(":", 1)[1], o.detail) for o in report.check("unsafe_members").offenders)
    assert "pickle-like" in unsafe[f"{keys[3]}.pyd"]
    assert "pickle-like" in unsafe["orphan__000000.pkl"] and "no sample" in unsafe["orphan__000000.pkl"]


def test_links_in_a_shard_fail_unsafe_members(wds_catalog, tmp_path):
    cat = copy_catalog(wds_catalog[0], tmp_path / "cat")
    vid = wds_catalog[1]
    shard = cat / manifest(cat, vid)["shards"][0]["path"]
    with tarfile.open(shard, "a") as tf:  # appends after the last member (the shard hash breaks too)
        link = tarfile.TarInfo("evil__000000.mp4")
        link.type, link.linkname = tarfile.SYMTYPE, "../../etc/passwd"
        tf.addfile(link)
    report = validate(cat, vid, options=ValidateOptions(workers=1))
    unsafe = [o.detail for o in report.check("unsafe_members").offenders]
    assert report.check("unsafe_members").status == "fail" and any("symlink" in d for d in unsafe)


def test_key_rules_on_the_index_are_pure():
    rows = [{"key": k} for k in ("a__000001", "a__000000", "b__000000", "b__000000")]
    found = key_order_problems(rows)
    assert ("b__000000", "key appears 2 times in the index") in found
    assert any(k == "a__000000" and "not sorted" in d for k, d in found)
    assert meta_problems({"format": "dsbuild.sample/1"})[0] == "metadata lacks key"


def test_object_store_catalogs_validate_through_the_shard_cache(captures, tmp_path, monkeypatch):
    fsspec = pytest.importorskip("fsspec")
    from dsbuild.convert import ConvertConfig, convert

    monkeypatch.setenv("DSBUILD_CACHE", str(tmp_path / "cache"))
    url = f"memory://validate-{tmp_path.name}/cat"
    convert(captures, url, ConvertConfig(clip_seconds=3.0), workers=1)
    assert validate(url, None, options=ValidateOptions(workers=1)).accepted
    fs = fsspec.filesystem("memory")
    shard = sorted(fs.find(url.replace("memory://", "/") + "/shards"))[0]
    data = bytearray(fs.cat(shard))
    data[len(data) // 2] ^= 1
    fs.pipe(shard, bytes(data))
    report = validate(url, None, options=ValidateOptions(workers=1))
    assert report.catalog == url and report.check("shard_hashes").status == "fail"
    assert report.check("shard_hashes").offenders[0].item.endswith(shard.rsplit("/", 1)[1])
