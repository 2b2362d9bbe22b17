"""Structural checks: a clean version passes in both formats; each kind of damage fails its own check,
naming the shard, sample or member, and never raises; a catalog that is not what it claims is a
LineageError, a mistake of the caller a UsageError."""

from __future__ import annotations

import json
import tarfile

import pytest

from dsbuild.core.errors import LineageError, UsageError
from dsbuild.core.executor import ExecutorSpec
from dsbuild.lineage.catalog import Catalog
from dsbuild.validators import ValidateOptions, run, validate
from dsbuild.validators.checks.structural import key_order_problems
from tests.validators.support import canonical_meta, copy_catalog, reseal, rows

STRUCTURAL = ("manifest", "shard_hashes", "index", "members", "keys", "unsafe_members")
ONE = ExecutorSpec(workers=1)


def failing(report) -> set[str]:
    return {c.name for c in report.checks if c.status == "fail"}


def items(report, check: str) -> list[str]:
    return [o.item for o in report.check(check).offenders]


@pytest.mark.parametrize("fixture", ["wds_catalog", "parquet_catalog"])
def test_clean_versions_pass_every_structural_check(fixture, request):
    cat, vid = request.getfixturevalue(fixture)
    report = validate(cat, vid, executor=ONE)
    assert report.accepted and report.level == "structural"
    assert {c.name: c.status for c in report.checks if c.name in STRUCTURAL} == dict.fromkeys(STRUCTURAL, "pass")
    assert report.check("decode").status == "skip" and report.check("decode").message == "needs level full"
    assert report.summary.samples == len(rows(cat, vid)) and report.summary.checked_content == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_flipped_byte_fails_shard_hashes_naming_the_shard_and_the_sample(wds_catalog, tmp_path, workers, monkeypatch):
    """The samples are read while the shards are hashed; the damaged shard's samples are read again once
    the hashing has found it (in this process, or after a pool of workers read them unknowing)."""
    monkeypatch.setattr(run, "POOL_MIN", dict.fromkeys(run.POOL_MIN, 0))  # a pool even for this small catalog
    cat = copy_catalog(wds_catalog[0], tmp_path / "cat")
    vid = wds_catalog[1]
    row = rows(cat, vid)[4]
    shard = cat / row.shard
    data = bytearray(shard.read_bytes())
    data[row.byte_offset + row.byte_length // 2] ^= 0xFF  # inside this sample's video
    shard.write_bytes(bytes(data))
    report = validate(cat, vid, executor=ExecutorSpec(workers=workers))
    assert not report.accepted and failing(report) == {"shard_hashes"}
    offenders = report.check("shard_hashes").offenders
    assert offenders[0].kind == "shard" and offenders[0].item == row.shard and "altered" in offenders[0].detail
    damaged = [o for o in offenders if o.kind == "sample"]
    assert [o.item for o in damaged] == [row.key] and "no longer match" in damaged[0].detail


def test_truncated_shard_names_the_samples_cut_off(wds_catalog, tmp_path):
    cat = copy_catalog(wds_catalog[0], tmp_path / "cat")
    vid = wds_catalog[1]
    first = Catalog.open(cat).manifest(vid).shards[0].path
    last = max((r for r in rows(cat, vid) if r.shard == first), key=lambda r: r.byte_offset)
    shard = cat / last.shard
    shard.write_bytes(shard.read_bytes()[: last.byte_offset + 100])
    report = validate(cat, vid, executor=ONE)
    assert failing(report) == {"shard_hashes", "members"}
    assert "size changed" in report.check("shard_hashes").offenders[0].detail
    assert items(report, "members") == [last.key] and last.key in items(report, "shard_hashes")


@pytest.mark.parametrize("workers", [1, 2])
def test_missing_shard_names_its_samples(parquet_catalog, tmp_path, workers, monkeypatch):
    monkeypatch.setattr(run, "POOL_MIN", dict.fromkeys(run.POOL_MIN, 0))
    cat = copy_catalog(parquet_catalog[0], tmp_path / "cat")
    vid = parquet_catalog[1]
    gone = Catalog.open(cat).manifest(vid).shards[0].path
    (cat / gone).unlink()
    report = validate(cat, vid, executor=ExecutorSpec(workers=workers))
    assert failing(report) == {"shard_hashes"}
    lost = sorted(r.key for r in rows(cat, vid) if r.shard == gone)
    offenders = report.check("shard_hashes").offenders
    found = {o.item: o.detail for o in offenders}
    assert found[gone] == "missing" and all("lost with missing shard" in found[k] for k in lost)
    assert sorted(o.item for o in offenders if o.item in lost) == lost  # each once (also "cannot be read")


def test_a_damaged_catalog_is_a_lineage_error_and_a_wrong_version_a_usage_error(wds_catalog, tmp_path):
    cat = copy_catalog(wds_catalog[0], tmp_path / "cat")
    vid = wds_catalog[1]
    (cat / "versions" / vid / "index.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(LineageError, match="index.parquet: does not match the sha256"):
        validate(cat, vid, executor=ONE)
    path = cat / "versions" / vid / "manifest.json"
    doc = json.loads(path.read_text())
    doc["stats"]["samples"] += 1
    path.write_text(json.dumps(doc))
    with pytest.raises(LineageError, match="not the version id"):
        validate(cat, vid, executor=ONE)
    with pytest.raises(UsageError, match="no version or tag 'nope'"):
        validate(cat, "nope", executor=ONE)
    with pytest.raises(UsageError, match="level 'deep'"):
        ValidateOptions(level="deep")


def test_a_wrong_blake3_in_the_index_fails_index_at_every_level(wds_catalog, tmp_path):
    """The loader's per-read check would reject that sample. Structural validation hashed shards only:
    a forged catalog whose shards are sound but whose index lists other sample hashes was accepted by
    the default gate, and the loader then rejected every sample. Each sample is hashed at every level."""
    import pyarrow as pa

    from tests.helpers import with_index

    cat = copy_catalog(wds_catalog[0], tmp_path / "cat")
    victim = rows(cat, wds_catalog[1])[3].key

    def wrong(table):
        values = ["0" * 64 if k == victim else b for k, b in zip(table["key"].to_pylist(), table["blake3"].to_pylist())]
        return table.set_column(table.schema.get_field_index("blake3"), "blake3", pa.array(values, pa.string()))

    vid = with_index(cat, wds_catalog[1], wrong)
    for level in ("structural", "full"):
        report = validate(cat, vid, options=ValidateOptions(level=level), executor=ONE)
        assert items(report, "index") == [victim] and "blake3" in report.check("index").offenders[0].detail


def test_metadata_that_disagrees_with_the_index_fails_index_and_keys(wds_catalog, tmp_path):
    cat = copy_catalog(wds_catalog[0], tmp_path / "cat")
    keys = [r.key for r in rows(cat, wds_catalog[1])]

    def edit(key, members):
        if key == keys[1]:
            return canonical_meta(members, lambda doc: doc["clip"].update(t_end=doc["clip"]["t_end"] + 7))
        if key == keys[2]:
            return canonical_meta(members, lambda doc: doc.update(key="someone-else__000000"))
        return members

    vid = reseal(cat, wds_catalog[1], edit)
    report = validate(cat, vid, executor=ONE)
    assert failing(report) == {"index", "keys"}  # hashes, manifest and members are consistent
    assert items(report, "index") == [keys[1]] and "t_end=" in report.check("index").offenders[0].detail
    assert items(report, "keys") == [keys[2]] and "someone-else" in report.check("keys").offenders[0].detail


def test_non_canonical_and_unparseable_members_fail_members(parquet_catalog, tmp_path):
    cat = copy_catalog(parquet_catalog[0], tmp_path / "cat")
    keys = [r.key for r in rows(cat, parquet_catalog[1])]

    def edit(key, members):
        if key == keys[0]:  # same value, other bytes: the sample hash would not be reproducible
            return [(e, json.dumps(json.loads(p), indent=1).encode() if e == "json" else p) for e, p in members]
        if key == keys[1]:
            return canonical_meta(members, lambda doc: doc["clip"].update(frames="many"))
        return members

    vid = reseal(cat, parquet_catalog[1], edit)
    report = validate(cat, vid, executor=ONE)
    found = {o.item: o.detail for o in report.check("members").offenders}
    assert failing(report) == {"members"} and set(found) == {keys[0], keys[1]}
    assert "member(s) .json are not the canonical encoding" in found[keys[0]]
    assert "clip: frames: expected int" in found[keys[1]]


def test_pickles_orphans_and_links_in_a_tar_fail_unsafe_members(wds_catalog, tmp_path):
    cat = copy_catalog(wds_catalog[0], tmp_path / "cat")
    keys = [r.key for r in rows(cat, wds_catalog[1])]

    def append(n: int, data: bytes) -> bytes:
        if n:
            return data
        tmp = tmp_path / "shard.tar"
        tmp.write_bytes(data)
        with tarfile.open(tmp, "a", format=tarfile.USTAR_FORMAT) as tf:
            for name, payload in ((f"{keys[0]}.pyd", b"\x80\x04K\x01."), ("orphan__000000.pkl", b"\x80\x04N.")):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tf.addfile(info, __import__("io").BytesIO(payload))
            link = tarfile.TarInfo("evil__000000.mp4")
            link.type, link.linkname = tarfile.SYMTYPE, "../../etc/passwd"
            tf.addfile(link)
        return tmp.read_bytes()

    vid = reseal(cat, wds_catalog[1], shard_bytes=append)
    report = validate(cat, vid, executor=ONE)
    # the samples themselves are intact; verify's shard-safety check (the index check here) refuses members
    # after them, where tar's end padding must be: an export would hand them out
    assert failing(report) == {"unsafe_members", "index"}
    assert "padding" in " ".join(o.detail for o in report.check("index").offenders)
    unsafe = {o.item.split(":", 1)[1]: o.detail for o in report.check("unsafe_members").offenders}
    assert "pickle-like" in unsafe[f"{keys[0]}.pyd"]
    assert "pickle-like" in unsafe["orphan__000000.pkl"] and "no sample" in unsafe["orphan__000000.pkl"]
    assert "symlink" in unsafe["evil__000000.mp4"]
    assert report.check("unsafe_members").offenders[0].kind == "member"


def test_key_rules_over_the_index_are_pure():
    found = key_order_problems(["a__000001", "a__000000", "b__000000", "b__000000"])
    assert ("b__000000", "key appears 2 times in the index") in found
    assert any(k == "a__000000" and "not sorted" in d for k, d in found)
    assert key_order_problems(["a__000000", "a__000001"]) == []


def test_object_store_catalogs_validate_through_the_shard_cache(captures, tmp_path, monkeypatch):
    fsspec = pytest.importorskip("fsspec")
    from dsbuild.convert import ConvertConfig, convert

    monkeypatch.setenv("DSBUILD_CACHE", str(tmp_path / "cache"))
    url = f"memory://validate-{tmp_path.name}/cat"
    convert(captures, url, ConvertConfig(clip_seconds=3.0), executor=ONE)
    assert validate(url, None, executor=ONE).accepted
    fs = fsspec.filesystem("memory")
    shard = sorted(fs.find(url.replace("memory://", "/") + "/shards"))[0]
    data = bytearray(fs.cat(shard))
    data[len(data) // 2] ^= 1
    fs.pipe(shard, bytes(data))
    monkeypatch.setenv("DSBUILD_CACHE", str(tmp_path / "fresh-cache"))  # the old cache holds the good bytes
    report = validate(url, None, executor=ONE)
    assert report.catalog == url and failing(report) == {"shard_hashes"}
    offenders = report.check("shard_hashes").offenders
    assert offenders[0].item.endswith(shard.rsplit("/", 1)[1]) and offenders[0].detail.startswith("altered")
    assert {o.kind for o in offenders[1:]} == {"sample"} and all("cannot be read" in o.detail for o in offenders[1:])


def test_the_hashing_beside_the_pass_re_raises_its_error_and_a_cancel_stops_it():
    """``_Beside``: an error of the hashing thread reaches the caller's ``wait``; ``cancel`` (the pass
    failed) sets the stop event the hashing watches and returns once the thread has ended."""
    import threading

    def fails(stop: threading.Event) -> None:
        raise OSError("disk gone")

    b = run._Beside(fails)
    b.thread.start()
    with pytest.raises(OSError, match="disk gone"):
        b.wait()
    seen = []

    def watches(stop: threading.Event) -> None:
        seen.append(stop.wait(timeout=600))  # returns True as soon as the caller cancels

    b = run._Beside(watches)
    b.thread.start()
    b.cancel()
    assert seen == [True] and not b.thread.is_alive()
    run._Beside(watches).cancel()  # never started (the pass failed before its workers existed): no join
