"""Versions side by side: incremental builds, tags, log, diff, lineage, verify, query and gc."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.errors import UsageError
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.verify import verify
from dsbuild.samples.synthetic import generate, session_spec
from dsbuild.samples.writer import VideoSpec
from tests.helpers import cli, index_rows, manifest

CONFIG = ConvertConfig(clip_seconds=1.0)


def _small_sessions(root: Path, first: int, count: int) -> None:
    specs = [dataclasses.replace(session_spec(8, i, 2), session_id=f"s-{i:03d}", video=VideoSpec(160, 120, 30, 30))
             for i in range(first, first + count)]
    generate(root, sessions=count, seconds=2, seed=8, specs=specs)


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """A 20-session version, then the same captures plus 2 sessions built onto it."""
    base = tmp_path_factory.mktemp("grown")
    caps = base / "caps"
    _small_sessions(caps, 0, 20)
    cat = base / "cat"
    v1 = convert(caps, cat, CONFIG, workers=2)
    _small_sessions(caps, 20, 2)
    v2 = convert(caps, cat, CONFIG, workers=2)
    return caps, cat, v1, v2


def test_incremental_build_writes_only_the_new_sessions(grown):
    caps, cat, v1, v2 = grown
    new_shards = [s for s in manifest(cat, v2.version_id)["shards"] if s["session"] in ("s-020", "s-021")]
    assert v2.parent == v1.version_id and v2.reused_sessions == 20
    assert v2.written_bytes == sum(s["bytes"] for s in new_shards) > 0
    old = {s["path"] for s in manifest(cat, v1.version_id)["shards"]}
    assert old <= {s["path"] for s in manifest(cat, v2.version_id)["shards"]}  # shared, not copied


def test_incremental_version_equals_a_from_scratch_build(grown, tmp_path):
    caps, cat, _, v2 = grown
    fresh = convert(caps, tmp_path / "fresh", CONFIG, workers=1)
    assert (fresh.content_id, fresh.version_id) == (v2.content_id, v2.version_id)


def test_diff_shows_exactly_the_added_samples(grown):
    _, cat, v1, v2 = grown
    r = cli("diff", f"{cat}@{v1.version_id[:10]}", f"{cat}@{v2.version_id}", "--json", "--limit", "100")
    d = json.loads(r.stdout)
    new_keys = sorted(x["key"] for x in index_rows(cat, v2.version_id) if x["session_id"] in ("s-020", "s-021"))
    assert (d["added_keys"], d["removed"], d["changed"]) == (new_keys, 0, 0)
    assert d["drift"]["samples"]["delta"] == len(new_keys)


def test_removed_sessions_drop_out(grown, tmp_path):
    caps, cat, _, v2 = grown
    caps2 = tmp_path / "caps"
    shutil.copytree(caps, caps2)
    shutil.rmtree(caps2 / "s-003")
    v3 = convert(caps2, cat, CONFIG, workers=1)
    d = json.loads(cli("diff", f"{cat}@{v2.version_id}", f"{cat}@{v3.version_id}", "--json").stdout)
    assert d["removed"] == 2 and d["added"] == 0 and v3.written_bytes == 0


def test_log_lists_versions_newest_first_with_parent_and_change(grown):
    _, cat, v1, v2 = grown
    entries = json.loads(cli("log", cat, "--json").stdout)["versions"]
    by_id = {e["version_id"]: e for e in entries}
    assert by_id[v2.version_id]["parent"] == v1.version_id
    assert by_id[v2.version_id]["change"].startswith("+4 -0 ~0")


def test_tags_are_unique_and_moving_needs_force(grown):
    _, cat, v1, v2 = grown
    assert cli("tag", f"{cat}@{v1.version_id[:8]}", "gold").returncode == 0
    moved = cli("tag", f"{cat}@{v2.version_id}", "gold")
    assert moved.returncode == 2 and "--force" in moved.stderr
    assert cli("tag", f"{cat}@{v2.version_id}", "gold", "--force").returncode == 0
    assert Catalog.open(cat).resolve("gold") == v2.version_id
    assert cli("tag", str(cat), "gold", "--delete").returncode == 0
    assert "gold" not in Catalog.open(cat).tags()
    assert cli("tag", f"{cat}@{v2.version_id}", "../x").returncode == 2


def test_unknown_and_ambiguous_versions_are_usage_errors(grown):
    _, cat, _, _ = grown
    with pytest.raises(UsageError, match="no version matches"):
        Catalog.open(cat).resolve("zzzz")
    r = cli("verify", f"{cat}@nope")
    assert r.returncode == 2 and r.stderr.startswith("error:")


def test_lineage_traces_a_sample_to_its_sources(grown):
    caps, cat, _, v2 = grown
    key = index_rows(cat, v2.version_id)[5]["key"]
    info = json.loads(cli("lineage", f"{cat}@{v2.version_id}", key, "--json").stdout)
    assert {s["role"] for s in info["sources"]} >= {"video", "session"}
    assert info["config_hash"] == manifest(cat, v2.version_id)["config_hash"]
    assert info["location"]["shard"].startswith("shards/") and info["window"]["frames"] > 0
    assert cli("lineage", str(cat), "no-such-key").returncode == 2


def test_query_views_read_in_place(grown):
    _, cat, v1, v2 = grown
    rows = json.loads(cli("query", f"{cat}@{v2.version_id}", "select count(*) n, count(distinct session_id) s from samples",
                           "--json").stdout)
    assert rows == [{"n": len(index_rows(cat, v2.version_id)), "s": 22}]
    csv = cli("query", str(cat), "select count(*) from versions", "--csv").stdout.splitlines()
    assert int(csv[1]) >= 2
    lin = json.loads(cli("query", str(cat), "select distinct role from lineage order by 1", "--json").stdout)
    assert [r["role"] for r in lin] == ["actions", "session", "telemetry", "text", "video"]
    bad = cli("query", str(cat), "select nope from samples")
    assert bad.returncode == 2 and "query failed" in bad.stderr


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_verify_names_the_damaged_shard(wds_catalog, tmp_path, damage):
    src, vid = wds_catalog
    cat = tmp_path / "cat"
    shutil.copytree(src, cat)
    shard = cat / manifest(cat, vid)["shards"][1]["path"]
    data = bytearray(shard.read_bytes())
    if damage == "flip":
        data[len(data) // 3] ^= 0x01
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(bytes(data[: len(data) // 2]))
    else:
        shard.unlink()
    r = cli("verify", f"{cat}@{vid}", "--json")
    report = json.loads(r.stdout)
    assert r.returncode == 1 and not report["ok"]
    assert report["problems"][0]["shard"] == manifest(cat, vid)["shards"][1]["path"]
    assert report["problems"][0]["problem"] == {"flip": "altered", "truncate": "truncated", "delete": "missing"}[damage]


def test_verify_sample_checks_a_seeded_subset(wds_catalog):
    cat, vid = wds_catalog
    a = verify(Catalog.open(cat), vid, sample=2, seed=3)
    b = verify(Catalog.open(cat), vid, sample=2, seed=3)
    assert a.ok and a.shards_checked == 2 and a.to_json() == b.to_json()


def test_gc_removes_only_unreferenced_shards(grown, tmp_path):
    _, src, _, _ = grown
    cat = tmp_path / "cat"
    shutil.copytree(src, cat)
    orphan = cat / "shards" / "ff" / ("f" * 64 + ".tar")
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(b"x" * 100)
    dry = json.loads(cli("gc", cat, "--dry-run", "--json").stdout)
    assert dry["shards"] == [orphan.relative_to(cat).as_posix()] and orphan.exists()
    assert cli("gc", cat).returncode == 0 and not orphan.exists()
    for v in Catalog.open(cat).versions():
        assert verify(Catalog.open(cat), v.version_id).ok


def test_two_converts_into_one_catalog_at_once_both_commit(tmp_path):
    _small_sessions(tmp_path / "a", 0, 3)
    _small_sessions(tmp_path / "b", 3, 3)
    cat = tmp_path / "cat"
    Catalog.open(cat, create=True)
    procs = [subprocess.Popen([sys.executable, "-c", "from dsbuild.cli.app import main; main()", "convert",
                               str(tmp_path / d), str(cat), "--clip-seconds", "1", "--workers", "1", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for d in "ab"]
    outs = [p.communicate() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    ids = {json.loads(o)["version_id"] for o, _ in outs}
    assert ids == {v.version_id for v in Catalog.open(cat).versions()} and len(ids) == 2
    for vid in ids:
        assert verify(Catalog.open(cat), vid).ok


def test_log_shows_split_sets_and_diff_compares_them(grown):
    _, cat, v1, v2 = grown
    for v in (v1, v2):
        assert cli("split", f"{cat}@{v.version_id}", "--name", "main", "--by", "session_id").returncode == 0
    entries = {e["version_id"]: e for e in json.loads(cli("log", cat, "--json").stdout)["versions"]}
    assert [s["name"] for s in entries[v2.version_id]["split_sets"]] == ["main"]
    d = json.loads(cli("diff", f"{cat}@{v1.version_id}", f"{cat}@{v2.version_id}", "--split", "main",
                        "--json").stdout)
    assert sorted(d["groups"]["added"]) == ["s-020", "s-021"] and not d["groups"]["moved"]
