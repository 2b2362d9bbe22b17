"""Versions side by side: incremental builds, tags, log, diff, lineage, verify, query and gc (in process).

The command line over the same functions is tested in tests/cli/.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.errors import LineageError, UsageError
from dsbuild.core.executor import ExecutorSpec
from dsbuild.lineage.catalog import Catalog, open_ref
from dsbuild.lineage.diff import diff_versions
from dsbuild.lineage.gc import collect
from dsbuild.lineage.history import log_entries, sample_lineage, version_info
from dsbuild.lineage.query import run_query
from dsbuild.lineage.verify import verify
from dsbuild.samples.synthetic import generate, session_spec
from dsbuild.samples.writer import VideoSpec
from tests.helpers import as_older_version, index_rows, manifest

CONFIG = ConvertConfig(clip_seconds=1.0, shard_size=120_000)


def _small_sessions(root: Path, first: int, count: int) -> None:
    specs = [
        dataclasses.replace(session_spec(8, i, 2), session_id=f"s-{i:03d}", video=VideoSpec(160, 120, 30, 30))
        for i in range(first, first + count)
    ]
    generate(root, sessions=count, seconds=2, seed=8, specs=specs)


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """A 20-session version, then the same captures plus 2 sessions built onto it."""
    base = tmp_path_factory.mktemp("grown")
    caps = base / "caps"
    _small_sessions(caps, 0, 20)
    cat = base / "cat"
    v1 = convert(caps, cat, CONFIG, executor=ExecutorSpec(workers=2))
    _small_sessions(caps, 20, 2)
    v2 = convert(caps, cat, CONFIG, executor=ExecutorSpec(workers=2))
    return caps, cat, v1, v2


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "cat"
    shutil.copytree(src, dst)
    return dst


def test_incremental_build_rewrites_only_the_shards_near_the_change(grown):
    _caps, cat, v1, v2 = grown
    assert v2.parent == v1.version_id and v2.reused_sessions == 20
    assert v1.shards >= 6 and v2.written_shards <= 3 and v2.reused_shards >= v2.shards - 3
    old = {s["path"] for s in manifest(cat, v1.version_id)["shards"]}
    new = {s["path"] for s in manifest(cat, v2.version_id)["shards"]}
    assert len(old & new) == v2.reused_shards  # shared, not copied
    assert v2.written_bytes == sum(s["bytes"] for s in manifest(cat, v2.version_id)["shards"] if s["path"] not in old)


def test_shards_span_sessions_and_follow_the_size_target(grown):
    _, cat, _, v2 = grown
    shards = manifest(cat, v2.version_id)["shards"]
    sessions_per_shard = {}
    for row in index_rows(cat, v2.version_id):
        sessions_per_shard.setdefault(row["shard"], set()).add(row["session_id"])
    assert max(len(s) for s in sessions_per_shard.values()) > 1
    assert all(60_000 <= s["bytes"] <= 240_000 for s in shards[:-1])


def test_incremental_version_equals_a_from_scratch_build(grown, tmp_path):
    caps, _, _, v2 = grown
    fresh = convert(caps, tmp_path / "fresh", CONFIG, executor=ExecutorSpec(workers=1))
    assert (fresh.content_id, fresh.version_id) == (v2.content_id, v2.version_id)


def test_a_build_reuses_the_newest_version_with_its_settings_not_only_the_newest(grown, tmp_path):
    """A version built with other settings in between (an experiment with 2-s clips) made the next
    1-s build start from nothing: the newest version was the only candidate."""
    caps, src, _, v2 = grown
    cat = _copy(src, tmp_path)
    other = convert(caps, cat, dataclasses.replace(CONFIG, clip_seconds=2.0), executor=ExecutorSpec(workers=1))
    assert other.reused_sessions == 0
    again = convert(caps, cat, CONFIG, executor=ExecutorSpec(workers=1))
    assert (again.version_id, again.existed) == (v2.version_id, True)  # built onto v2: nothing new
    assert again.reused_sessions == 22 and again.written_shards == 0 and again.parent == v2.parent


@pytest.mark.parametrize("damage", ["index.parquet removed", "sessions.json cut short"])
def test_the_same_build_restores_a_versions_index_or_session_records(grown, tmp_path, damage):
    """A version whose index or session records were lost stopped every later convert into the catalog
    (exit 3, even with other captures and settings), and the same convert could not bring them back:
    the version existed, so nothing was written."""
    caps, src, _, v2 = grown
    cat = _copy(src, tmp_path)
    name = damage.split()[0]
    path = cat / "versions" / v2.version_id / name
    before = path.read_bytes()
    if "removed" in damage:
        path.unlink()
    else:
        path.write_bytes(before[:-10])
    # verify names the heal (it did for damaged shards only), and still proves the shards (a lost index
    # stopped it before any was hashed: their damage hid behind it)
    report = verify(Catalog.open(cat), v2.version_id)
    assert not report.ok and report.heal.startswith("dsbuild convert ") and report.shards_checked > 0
    again = convert(caps, cat, CONFIG, executor=ExecutorSpec(workers=1))
    assert again.version_id == v2.version_id and again.existed
    assert path.read_bytes() == before and verify(Catalog.open(cat), v2.version_id).ok
    other = convert(caps, cat, dataclasses.replace(CONFIG, clip_seconds=2.0), executor=ExecutorSpec(workers=1))
    assert other.version_id != v2.version_id


def test_a_pinned_file_is_never_read_past_its_pinned_size(grown, tmp_path):
    """index.parquet and sessions.json were read up to a global cap (4 GiB and 1 GiB) before their hash
    was checked: a forged large object filled memory first."""
    import resource

    _, src, _, v2 = grown
    cat = _copy(src, tmp_path)
    with open(cat / "versions" / v2.version_id / "index.parquet", "r+b") as f:
        f.truncate(400 << 20)  # sparse: 400 MB of zeros past the real index
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(LineageError, match="does not match the sha256 pinned"):
        Catalog.open(cat).index(v2.version_id)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB


def test_a_setting_given_as_an_int_is_the_same_setting_as_a_float(grown, tmp_path):
    """``clip_seconds=1`` hashed as 1, not 1.0: another version id for the same build, no reuse, and a
    heal command (which passes --clip-seconds 1.0) refused as "other settings ()"."""
    caps, src, _, v2 = grown
    assert ConvertConfig(clip_seconds=1, shard_size=120_000).to_json() == CONFIG.to_json()
    again = convert(
        caps, _copy(src, tmp_path), ConvertConfig(clip_seconds=1, shard_size=120_000), executor=ExecutorSpec(workers=1)
    )
    assert again.version_id == v2.version_id


@pytest.mark.parametrize("older", [("index", "shards"), ("shards",)])
def test_a_parent_from_before_blake3_was_recorded_is_built_again_not_reused(grown, tmp_path, older):
    """Reusing its rows or shard records would carry NULL blake3 values into the new version, which would
    then differ from a fresh build; with --onto it is a usage error naming what is missing."""
    caps, src, _, v2 = grown
    cat = _copy(src, tmp_path)
    old = as_older_version(cat, v2.version_id, remove=True, older=older)
    with pytest.raises(UsageError, match="index columns or shard hashes"):
        convert(caps, cat, CONFIG, executor=ExecutorSpec(workers=2), onto=old)
    again = convert(caps, cat, CONFIG, executor=ExecutorSpec(workers=2))
    assert again.version_id == v2.version_id
    assert None not in [r["blake3"] for r in index_rows(cat, again.version_id)]


def test_diff_shows_exactly_the_added_samples(grown):
    _, cat, v1, v2 = grown
    c = Catalog.open(cat)
    d = diff_versions(c, v1.version_id, c, v2.version_id, limit=100)
    new_keys = sorted(x["key"] for x in index_rows(cat, v2.version_id) if x["session_id"] in ("s-020", "s-021"))
    assert (d["added_keys"], d["removed"], d["changed"]) == (new_keys, 0, 0)
    assert d["drift"]["samples"]["delta"] == len(new_keys)


def test_removed_sessions_drop_out_and_cost_a_shard_or_two(grown, tmp_path):
    caps, src, _, v2 = grown
    cat = _copy(src, tmp_path)
    caps2 = tmp_path / "caps"
    shutil.copytree(caps, caps2)
    shutil.rmtree(caps2 / "s-003")
    v3 = convert(caps2, cat, CONFIG, executor=ExecutorSpec(workers=1))
    c = Catalog.open(cat)
    d = diff_versions(c, v2.version_id, c, v3.version_id)
    assert d["removed"] == 2 and d["added"] == 0 and v3.written_shards <= 3


def test_log_lists_versions_newest_first_with_parent_and_change(grown):
    _, cat, v1, v2 = grown
    entries = log_entries(Catalog.open(cat))
    by_id = {e["version_id"]: e for e in entries}
    assert entries[0]["version_id"] == v2.version_id
    assert by_id[v2.version_id]["parent"] == v1.version_id
    assert by_id[v2.version_id]["change"] == {"added": 4, "removed": 0, "changed": 0}
    assert by_id[v1.version_id]["change"] is None and by_id[v1.version_id]["samples"] == v1.samples


def test_info_summarises_one_version(grown):
    _, cat, v1, _ = grown
    info = version_info(Catalog.open(cat), v1.version_id)
    assert info["stats"]["samples"] == v1.samples and info["format"] == "webdataset"
    assert info["config"]["clip_seconds"] == 1.0 and info["quarantined"] == []


def test_tags_are_unique_moving_needs_force_and_typos_get_suggestions(grown, tmp_path):
    _, src, v1, v2 = grown
    c = Catalog.open(_copy(src, tmp_path))
    assert c.set_tag("gold", v1.version_id[:8]) == v1.version_id
    with pytest.raises(UsageError) as e:
        c.set_tag("gold", v2.version_id)
    assert "--force" in e.value.hint
    c.set_tag("gold", v2.version_id, force=True)
    assert c.resolve("gold") == v2.version_id
    with pytest.raises(UsageError, match="did you mean 'gold'"):
        c.resolve("gould")
    c.set_tag("gold", None, delete=True)
    assert "gold" not in c.tags()
    with pytest.raises(UsageError, match="use a letter"):
        c.set_tag("../x", v2.version_id)


def test_unknown_and_ambiguous_versions_are_usage_errors(grown):
    _, cat, _, _ = grown
    with pytest.raises(UsageError, match="no version or tag"):
        Catalog.open(cat).resolve("zzzz")
    with pytest.raises(UsageError, match="no version or tag"):
        open_ref(f"{cat}@nope")


def test_lineage_traces_a_sample_to_its_sources(grown):
    _, cat, _, v2 = grown
    key = index_rows(cat, v2.version_id)[5]["key"]
    info = sample_lineage(Catalog.open(cat), v2.version_id, key)
    assert {s["role"] for s in info["sources"]} >= {"video", "session"}
    assert info["config_hash"] == manifest(cat, v2.version_id)["config_hash"]
    assert info["location"]["shard"].startswith("shards/") and info["window"]["frames"] > 0
    with pytest.raises(UsageError, match="no sample"):
        sample_lineage(Catalog.open(cat), v2.version_id, "no-such-key")


def test_query_views_are_created_only_when_named_and_read_in_place(grown):
    _, cat, _, v2 = grown
    c = Catalog.open(cat)
    _cols, rows = run_query(c, v2.version_id, "select count(*) n, count(distinct session_id) s from samples")
    assert rows == [(len(index_rows(cat, v2.version_id)), 22)]
    assert run_query(c, v2.version_id, "select count(*) from versions")[1][0][0] >= 2
    roles = run_query(c, v2.version_id, "select distinct role from lineage order by 1")[1]
    assert [r for (r,) in roles] == ["actions", "session", "telemetry", "text", "video"]
    with pytest.raises(UsageError, match="query failed"):
        run_query(c, v2.version_id, "select nope from samples")


@pytest.mark.parametrize(
    "sql",
    [
        "select * from read_csv('/etc/passwd')",
        "copy (select 1) to '/tmp/dsbuild-x.csv'",
        "select * from glob('/root/*')",
        "attach '/tmp/dsbuild-y.db'",
        "install httpfs",
        "load httpfs",
        "set enable_external_access=true",
    ],
)
def test_query_is_sandboxed(grown, sql):
    _, cat, _, v2 = grown
    with pytest.raises(UsageError, match="query (refused|failed)"):
        run_query(Catalog.open(cat), v2.version_id, sql)
    assert not Path("/tmp/dsbuild-x.csv").exists() and not Path("/tmp/dsbuild-y.db").exists()


def test_unsafe_query_lifts_the_sandbox(grown, tmp_path):
    _, cat, _, v2 = grown
    out = tmp_path / "keys.csv"
    run_query(Catalog.open(cat), v2.version_id, f"copy (select key from samples) to '{out}'", unsafe=True)
    assert out.read_text().startswith("key")


def test_catalog_paths_with_glob_and_quote_characters_do_not_widen_views(grown, tmp_path):
    _, src, _, v2 = grown
    weird = tmp_path / "we'ird[1]*"
    shutil.copytree(src, weird)
    other = tmp_path / "we'ird1-other"  # what the glob pattern we'ird[1]* would also match
    shutil.copytree(src, other)
    n = run_query(Catalog.open(weird), v2.version_id, "select count(*) from samples")[1][0][0]
    assert n == len(index_rows(src, v2.version_id))


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_verify_names_the_damaged_shard_and_the_command_that_heals(wds_catalog, tmp_path, damage):
    src, vid = wds_catalog
    cat = _copy(src, tmp_path)
    rec = manifest(cat, vid)["shards"][1]
    shard = cat / rec["path"]
    data = bytearray(shard.read_bytes())
    if damage == "flip":
        data[len(data) // 3] ^= 0x01
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(bytes(data[: len(data) // 2]))
    else:
        shard.unlink()
    report = verify(Catalog.open(cat), vid)
    assert not report.ok and report.problems[0]["shard"] == rec["path"]
    assert report.problems[0]["problem"] == {"flip": "altered", "truncate": "size changed", "delete": "missing"}[damage]
    assert report.heal.startswith("dsbuild convert ") and "--rehash" in report.heal
    hashed = sum(s["bytes"] for s in manifest(cat, vid)["shards"]) - (rec["bytes"] if damage != "flip" else 0)
    assert report.bytes_checked == hashed  # a shard missing or of another size is not read
    sound = [r["key"] for r in index_rows(cat, vid) if r["shard"] != rec["path"]]
    assert report.samples_checked == len(sound)  # entries of the damaged shard were not checked


def test_the_heal_command_gives_every_setting_of_the_build_by_its_convert_flag():
    """The heal command once left the settings out and rebuilt another version: each field of a build's
    config has its `dsbuild convert` flag in it, or none (derived from another, or fixed by the CLI)."""
    import typer

    from dsbuild.cli.app import app
    from dsbuild.lineage.verify import CONVERT_FLAGS

    assert set(CONVERT_FLAGS) == {f.name for f in dataclasses.fields(ConvertConfig)} - {"transcode_encoder"}
    params = typer.main.get_command(app).commands["convert"].params
    options = {opt for p in params for opt in (*p.opts, *p.secondary_opts)}
    assert {opt for flag in CONVERT_FLAGS.values() for opt in flag.split("/")} <= options


@pytest.mark.parametrize("older", [False, True])
def test_verify_proves_shards_by_their_recorded_blake3_or_by_sha256_in_older_versions(wds_catalog, tmp_path, older):
    import hashlib

    from blake3 import blake3

    src, vid = wds_catalog
    cat = _copy(src, tmp_path)
    if older:
        vid = as_older_version(cat, vid, remove=True)
    shards = manifest(cat, vid)["shards"]
    for rec in shards:  # both hashes of the bytes on disk, by the libraries themselves
        data = (cat / rec["path"]).read_bytes()
        assert rec["sha256"] == hashlib.sha256(data).hexdigest() and ("blake3" in rec) is not older
        assert older or rec["blake3"] == blake3(data).hexdigest()
    assert verify(Catalog.open(cat), vid).ok
    shard = cat / shards[-1]["path"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x80
    shard.write_bytes(bytes(data))
    problems = verify(Catalog.open(cat), vid).problems
    assert [(p["shard"], p["problem"]) for p in problems] == [(shards[-1]["path"], "altered")]
    assert problems[0]["detail"].startswith("sha256 " if older else "blake3 ")


def test_verify_refuses_a_manifest_edited_to_match_a_flipped_shard(wds_catalog, tmp_path):
    """A forger flips a shard and rewrites the manifest's sha256 for it: the version id (the folder
    name) no longer matches the manifest, and the shard's name no longer matches its hash."""
    import hashlib

    src, vid = wds_catalog
    cat = _copy(src, tmp_path)
    mpath = cat / "versions" / vid / "manifest.json"
    doc = json.loads(mpath.read_bytes())
    shard = cat / doc["shards"][0]["path"]
    data = bytearray(shard.read_bytes())
    data[2000] ^= 0xFF
    shard.write_bytes(bytes(data))
    doc["shards"][0]["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
    mpath.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    report = verify(Catalog.open(cat), vid)
    assert not report.ok and "not the version id" in report.problems[0]["detail"]
    with pytest.raises(LineageError, match="not the version id"):
        Catalog.open(cat).manifest(vid)


def test_pull_refuses_bytes_that_are_not_what_their_shard_name_says(wds_catalog, tmp_path):
    """A forged catalog pairs an honest shard's name (its sha256) with other bytes of the same size and
    their BLAKE3, in a re-sealed manifest (a self-consistent version). Pulling it must not store those
    bytes under the honest name: the destination skips any shard already present by name, so an honest
    version pulled afterwards would be left pointing at the forged bytes."""
    import hashlib

    from blake3 import blake3

    from dsbuild.lineage.manifest import Manifest
    from tests.helpers import cli

    src, vid = wds_catalog
    forged = _copy(src, tmp_path / "forged")
    doc = manifest(forged, vid)
    rec = doc["shards"][0]
    first = min((r for r in index_rows(forged, vid) if r["shard"] == rec["path"]), key=lambda r: r["byte_offset"])
    data = bytearray((forged / rec["path"]).read_bytes())
    data[first["byte_offset"] + first["byte_length"] // 2] ^= 0xFF  # inside the first clip: framing intact
    (forged / rec["path"]).write_bytes(bytes(data))
    rec["blake3"] = blake3(bytes(data)).hexdigest()
    sealed = Manifest.from_json(doc, "manifest").to_bytes()
    fid = hashlib.sha256(sealed).hexdigest()
    shutil.move(forged / "versions" / vid, forged / "versions" / fid)
    (forged / "versions" / fid / "manifest.json").write_bytes(sealed)
    assert verify(Catalog.open(forged), fid).ok  # self-consistent: only the name tells

    dest = tmp_path / "dest"
    refused = cli("pull", f"{forged}@{fid}", dest, "--json")
    assert refused.returncode != 0
    assert rec["path"] in refused.stderr and "sha256" in refused.stderr and "forged" in refused.stderr
    assert not dest.exists()  # the catalog the refused pull created is gone with what it sent
    honest = cli("pull", f"{src}@{vid}", dest, "--json")
    assert honest.returncode == 0, honest.stderr
    assert json.loads(honest.stdout)["shards_sent"] == len(doc["shards"])
    assert verify(Catalog.open(dest), vid).ok


def test_an_index_with_a_duplicated_row_is_refused_by_its_pin(wds_catalog, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src, vid = wds_catalog
    cat = _copy(src, tmp_path)
    path = cat / "versions" / vid / "index.parquet"
    table = pq.read_table(path)
    pq.write_table(pa.concat_tables([table, table.slice(0, 1)]), path)
    with pytest.raises(LineageError, match="pinned in the manifest"):
        Catalog.open(cat).index(vid)
    assert not verify(Catalog.open(cat), vid).ok


def test_verify_stops_when_its_caller_no_longer_needs_the_answer(wds_catalog):
    """validate hashes beside its sample pass and sets ``stop`` when the pass fails (a dead worker,
    Ctrl-C): the hashing must end there, not after every queued shard."""
    import threading

    from dsbuild.lineage.verify import Stopped

    cat, vid = wds_catalog
    stop = threading.Event()
    stop.set()
    with pytest.raises(Stopped):
        verify(Catalog.open(cat), vid, threads=2, stop=stop)
    assert verify(Catalog.open(cat), vid, threads=2, stop=threading.Event()).ok  # unset: a normal verify


def test_verify_sample_checks_a_seeded_subset(wds_catalog):
    cat, vid = wds_catalog
    a = verify(Catalog.open(cat), vid, sample=2, seed=3)
    b = verify(Catalog.open(cat), vid, sample=2, seed=3)
    assert a.ok and a.shards_checked == 2 and a.to_json() == b.to_json()


def test_a_lost_shard_is_healed_by_running_the_same_convert_again(grown, tmp_path):
    caps, src, _, v2 = grown
    cat = _copy(src, tmp_path)
    lost = manifest(cat, v2.version_id)["shards"][2]
    (cat / lost["path"]).unlink()
    truncated = cat / manifest(cat, v2.version_id)["shards"][4]["path"]
    truncated.write_bytes(truncated.read_bytes()[:1000])
    again = convert(caps, cat, CONFIG, executor=ExecutorSpec(workers=2))
    assert again.version_id == v2.version_id and again.healed_sessions > 0
    assert verify(Catalog.open(cat), v2.version_id).ok


def test_rehash_heals_a_shard_damaged_in_place(grown, tmp_path):
    caps, src, _, v2 = grown
    cat = _copy(src, tmp_path)
    shard = cat / manifest(cat, v2.version_id)["shards"][3]["path"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    assert convert(caps, cat, CONFIG, rehash=True).healed_sessions > 0
    assert verify(Catalog.open(cat), v2.version_id).ok


def test_no_version_is_committed_that_references_a_missing_shard(grown, tmp_path):
    """Building onto a version whose shard vanished: the new version is complete, never dangling."""
    caps, src, _, v2 = grown
    cat = _copy(src, tmp_path)
    (cat / manifest(cat, v2.version_id)["shards"][0]["path"]).unlink()
    caps2 = tmp_path / "caps"
    shutil.copytree(caps, caps2)
    _small_sessions(caps2, 22, 1)
    v3 = convert(caps2, cat, CONFIG)
    for s in manifest(cat, v3.version_id)["shards"]:
        assert (cat / s["path"]).stat().st_size == s["bytes"]
    assert verify(Catalog.open(cat), v3.version_id).ok


def test_gc_removes_unreferenced_shards_and_stale_builds_and_lists_them(grown, tmp_path):
    _, src, _, _ = grown
    cat = _copy(src, tmp_path)
    orphan = cat / "shards" / "ff" / ("f" * 64 + ".tar")
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(b"x" * 100)
    stale = cat / ".tmp" / "0123abcd"  # a build folder whose build died (its lock is free)
    stale.mkdir(parents=True)
    (stale / "lock").write_bytes(b"")
    (stale / "shard-000000.tar.part").write_bytes(b"y" * 10)
    c = Catalog.open(cat)
    dry = collect(c, dry_run=True)
    assert [s["path"] for s in dry["shards"]] == [orphan.relative_to(cat).as_posix()] and orphan.exists()
    assert dry["stale_builds"] == ["0123abcd"] and stale.exists()
    done = collect(c)
    assert not orphan.exists() and not stale.exists() and done["bytes"] == 100
    for v in c.versions():
        assert verify(c, v.version_id).ok


def test_gc_removes_old_temp_files_of_interrupted_writes_and_keeps_young_ones(grown, tmp_path):
    import os

    _, src, v1, _ = grown
    cat = _copy(src, tmp_path)
    old = cat / "versions" / v1.version_id / (".manifest.json." + "a" * 32 + ".tmp")  # kill -9 mid-write
    young = cat / (".catalog.json." + "b" * 32 + ".tmp")  # a write that may still be in progress
    old.write_bytes(b"{")
    young.write_bytes(b"{")
    os.utime(old, (old.stat().st_mtime - 7200,) * 2)
    c = Catalog.open(cat)
    dry = collect(c, dry_run=True)
    assert dry["interrupted_writes"] == [old.relative_to(cat).as_posix()] and old.exists()
    assert collect(c)["interrupted_writes"] == dry["interrupted_writes"]
    assert not old.exists() and young.exists() and verify(c, v1.version_id).ok


def test_a_catalog_whose_creation_was_killed_mid_write_can_be_created_again(tmp_path):
    import os
    import time

    cat = tmp_path / "cat"
    cat.mkdir()
    left = cat / (".catalog.json." + "c" * 32 + ".tmp")
    left.write_bytes(b"")  # kill -9 before the rename
    os.utime(left, (time.time() - 120, time.time() - 120))
    Catalog.open(cat, create=True)
    assert sorted(p.name for p in cat.iterdir()) == [".tmp", "catalog.json"]
    # a young one may be another process creating the same catalog now: kept (removing it failed that one)
    young = tmp_path / "young"
    young.mkdir()
    (young / (".catalog.json." + "d" * 32 + ".tmp")).write_bytes(b"")
    Catalog.open(young, create=True)
    assert sorted(p.name for p in young.iterdir()) == [".catalog.json." + "d" * 32 + ".tmp", ".tmp", "catalog.json"]
    other = tmp_path / "other"  # a folder holding anything else is still refused
    other.mkdir()
    (other / ".notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        Catalog.open(other, create=True)


def test_a_damaged_commit_record_is_one_clear_error(grown, tmp_path):
    _, src, v1, _ = grown
    cat = _copy(src, tmp_path)
    (cat / "versions" / v1.version_id / "commit.json").write_text("[]")
    with pytest.raises(LineageError, match="commit.json: expected a JSON object") as e:
        Catalog.open(cat).versions()
    assert "delete it" in e.value.hint


def test_a_commit_record_that_is_a_fifo_or_a_symlink_is_refused(grown, tmp_path):
    import os

    _, src, v1, _ = grown
    cat = _copy(src, tmp_path)
    commit = cat / "versions" / v1.version_id / "commit.json"
    commit.unlink()
    os.mkfifo(commit)
    with pytest.raises(Exception, match="FIFO"):
        Catalog.open(cat).versions()
    commit.unlink()
    commit.symlink_to("/etc/hostname")
    with pytest.raises(Exception, match="outside"):
        Catalog.open(cat).versions()


def test_two_converts_into_one_catalog_at_once_both_commit(tmp_path):
    import subprocess
    import sys

    _small_sessions(tmp_path / "a", 0, 3)
    _small_sessions(tmp_path / "b", 3, 3)
    cat = tmp_path / "cat"
    Catalog.open(cat, create=True)
    code = (
        "import sys, json; from dsbuild.convert import convert, ConvertConfig; "
        "r = convert(sys.argv[1], sys.argv[2], ConvertConfig(clip_seconds=1.0)); print(r.version_id)"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / d), str(cat)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for d in "ab"
    ]
    outs = [p.communicate() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    ids = {o.strip() for o, _ in outs}
    assert ids == {v.version_id for v in Catalog.open(cat).versions()} and len(ids) == 2
    for vid in ids:
        assert verify(Catalog.open(cat), vid).ok


def test_an_incremental_build_hashes_and_processes_only_what_changed(grown, tmp_path, monkeypatch):
    import dsbuild.convert.build as build_mod
    import dsbuild.core.hashcache as hashcache

    caps, src, _, _v2 = grown
    cat = _copy(src, tmp_path)
    caps2 = tmp_path / "caps"
    shutil.copytree(caps, caps2)  # new inodes: the first build from this copy hashes everything
    convert(caps2, cat, CONFIG, executor=ExecutorSpec(workers=1))
    _small_sessions(caps2, 30, 1)
    hashed_files, jobs = [], []
    real_hash = hashcache.sha256_file
    monkeypatch.setattr(hashcache, "sha256_file", lambda p, root=None: hashed_files.append(p) or real_hash(p, root))
    real_process = build_mod.process_session
    monkeypatch.setattr(build_mod, "process_session", lambda job: jobs.append(job.session.rel) or real_process(job))
    r = convert(caps2, cat, CONFIG, executor=ExecutorSpec(workers=1))
    assert r.reused_sessions == 22 and r.written_shards <= 3
    assert {p.parent.name for p in hashed_files} == {"s-030"}
    assert jobs == ["s-030"]


def test_session_records_live_beside_the_manifest_pinned_and_are_read_only_when_needed(grown, tmp_path):
    _, src, v1, _ = grown
    cat = _copy(src, tmp_path)
    vid = v1.version_id
    doc = manifest(cat, vid)
    assert "sources" not in doc and doc["sessions"]["rows"] == 20
    records = json.loads((cat / "versions" / vid / "sessions.json").read_bytes())
    assert len(records["sessions"]) == 20 and len(records["sources"]) >= 40
    (cat / "versions" / vid / "sessions.json").write_bytes(b"{}")  # damaged
    c = Catalog.open(cat)
    assert version_info(c, vid)["stats"]["sessions"] == 20  # summary, index, diff, query: never read it
    assert run_query(c, vid, "select count(*) from samples")[1] == [(v1.samples,)]
    assert diff_versions(c, vid, c, vid)["changed"] == 0
    with pytest.raises(LineageError, match="sessions.json: does not match the sha256 pinned"):
        c.sessions(vid)
    with pytest.raises(LineageError, match="sessions.json: does not match"):
        run_query(c, vid, "select count(*) from sources")
    assert [p["sessions"] for p in verify(c, vid).problems if "sessions" in p] == ["sessions.json"]


def test_a_manifest_of_another_format_is_refused_with_what_to_do(grown, tmp_path):
    _, src, v1, _ = grown
    cat = _copy(src, tmp_path)
    doc = manifest(cat, v1.version_id)
    doc["format"] = "dsbuild.manifest/2"
    data = json.dumps(doc).encode()
    import hashlib

    vid = hashlib.sha256(data).hexdigest()
    (cat / "versions" / vid).mkdir()
    (cat / "versions" / vid / "manifest.json").write_bytes(data)
    with pytest.raises(LineageError, match="format is 'dsbuild.manifest/2', expected 'dsbuild.manifest/3'") as e:
        Catalog.open(cat).manifest(vid)
    assert "convert the captures again" in e.value.hint


def test_index_columns_convert_timestamps_like_pyarrow(grown):
    import pyarrow as pa

    from dsbuild.lineage.index import index_schema, table_columns

    _, cat, v1, _ = grown
    table = Catalog.open(cat).index(v1.version_id)
    assert table_columns(table) == table.to_pydict()
    odd = pa.table(
        {
            "started_at": pa.array([0, None, -1_500_000, 1_700_000_000_123_456], type=pa.int64()).cast(
                index_schema().field("started_at").type
            )
        }
    )
    assert table_columns(odd) == odd.to_pydict()  # before 1970, NULL, microseconds


def test_a_commit_whose_pinned_files_differ_from_the_pins_publishes_nothing(grown, tmp_path):
    from dsbuild.lineage.catalog import CommitRecord

    _, src, v1, _ = grown
    cat = _copy(src, tmp_path)
    c = Catalog.open(cat)
    m = c.manifest(v1.version_id)
    pinned = c.pinned_files(v1.version_id)
    pinned["sessions.json"] = pinned["sessions.json"].replace(b"s-000", b"s-999")
    other = dataclasses.replace(m, content_id="0" * 64)  # a new version id, so nothing exists yet
    before = sorted(p.name for p in (cat / "versions").iterdir())
    with c.build_area() as area, pytest.raises(LineageError, match="sessions.json is not the file its manifest pins"):
        c.commit(
            area,
            [],
            other,
            pinned,
            CommitRecord(
                "2026-01-01T00:00:00Z",
                0,
                None,
                None,
                "webdataset",
                m.stats.samples,
                m.stats.bytes,
                other.content_id,
                {},
            ),
        )
    assert sorted(p.name for p in (cat / "versions").iterdir()) == before


def _builds_forever(cache: str, started, stop) -> None:
    os.environ["DSBUILD_CACHE"] = cache
    catalog = Catalog.open("memory://builds-race/cat", create=True)
    started.set()
    while not stop.is_set():
        catalog.clean_stale_builds()


def test_cleaning_dead_builds_never_takes_a_live_one_of_an_object_store_catalog(tmp_path, monkeypatch):
    """Object stores' catalogs share one local builds folder and have no catalog lock: a cleaner in
    another process must not see a new build folder before its lock is held (it deleted live ones)."""
    import multiprocessing

    pytest.importorskip("fsspec", reason="the s3 extra (fsspec) is not installed")

    monkeypatch.setenv("DSBUILD_CACHE", str(tmp_path / "cache"))
    catalog = Catalog.open("memory://builds-race/cat", create=True)
    ctx = multiprocessing.get_context("spawn")
    started, stop = ctx.Event(), ctx.Event()
    cleaner = ctx.Process(target=_builds_forever, args=(str(tmp_path / "cache"), started, stop))
    cleaner.start()
    try:
        assert started.wait(120)
        for _ in range(500):
            with catalog.build_area() as area:
                (area.path / "segment").write_bytes(b"x")  # FileNotFoundError if a cleaner took it
    finally:
        stop.set()
        cleaner.join(60)
    assert cleaner.exitcode == 0


def test_a_failed_copy_never_removes_a_version_another_command_committed_meanwhile(grown, tmp_path):
    """A failed push into a location that held nothing clears it: not when another command has committed
    a version there since (its data is not the failed command's to remove)."""
    from dsbuild.lineage.catalog import catalog_to_fill
    from dsbuild.lineage.transfer import transfer

    _, cat, v1, _ = grown
    dest = tmp_path / "dest"
    with pytest.raises(RuntimeError, match="the push failed"), catalog_to_fill(dest):
        transfer(Catalog.open(cat), v1.version_id, Catalog.open(dest))  # another command's pull
        raise RuntimeError("the push failed")
    assert Catalog.open(dest).resolve(v1.version_id) == v1.version_id and verify(Catalog.open(dest), v1.version_id).ok
    with pytest.raises(RuntimeError), catalog_to_fill(tmp_path / "alone"):
        raise RuntimeError("the push failed")
    assert not (tmp_path / "alone").exists()


def test_gc_during_a_push_keeps_the_shards_the_push_has_sent(grown, tmp_path):
    """A push sends shards straight into the destination's ``shards/``, unreferenced until its manifest
    lands: a gc there meanwhile removed them and the push failed ("did not arrive"). The push names each
    shard in its live build folder first, and gc keeps what a live build holds."""
    from dsbuild.lineage.transfer import transfer

    _, cat, v1, _ = grown
    dest = Catalog.open(tmp_path / "dest", create=True)
    kept: list[list[str]] = []

    def gc_meanwhile(state) -> None:
        g = collect(dest)
        assert not g["shards"]
        kept.append(g["kept_held_shards"])

    report = transfer(Catalog.open(cat), v1.version_id, dest, progress=gc_meanwhile)
    shards = [s.path for s in Catalog.open(cat).manifest(v1.version_id).shards]
    assert report.shards_sent == len(shards) >= 2 and kept[-1] == sorted(shards)
    assert verify(dest, v1.version_id).ok and not collect(dest)["kept_held_shards"]  # the push is over


def test_a_pulled_older_version_takes_its_place_by_date_and_does_not_become_the_newest(grown, tmp_path):
    """Commit sequences are per catalog: a copy got the next one, so pulling last year's release made it
    the destination's newest (what a plain ref, `@` and a plain convert's parent mean)."""
    from dsbuild.lineage.transfer import transfer

    _, src, v1, v2 = grown
    cat = _copy(src, tmp_path)
    commit = cat / "versions" / v1.version_id / "commit.json"
    doc = json.loads(commit.read_text())
    commit.write_text(json.dumps({**doc, "created_at": "2020-01-01T00:00:00Z"}))  # made long before v2
    source, dest = Catalog.open(cat), Catalog.open(tmp_path / "dest", create=True)
    transfer(source, v2.version_id, dest)
    transfer(source, v1.version_id, dest)
    assert [v.version_id for v in dest.versions()] == [v2.version_id, v1.version_id]
    assert dest.resolve(None) == v2.version_id


@given(
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["2024", "2025", "2026"])), max_size=6),
    st.sampled_from(["2023", "2025", "2027"]),
    st.data(),
)
def test_a_copy_sorts_after_every_version_made_earlier_and_its_parent_and_before_later_ones(existing, created_at, data):
    from dsbuild.lineage.transfer import copy_sequence

    parent = data.draw(st.sampled_from(existing)) if existing and data.draw(st.booleans()) else None
    seq = copy_sequence(created_at, existing, parent)
    assert seq >= 0 and all((s, at) < (seq, created_at) for s, at in existing if at < created_at)
    if parent is not None:  # a child after its parent, whatever the clocks said (same second, skew)
        assert parent < (seq, created_at)
    if (parent is None or parent[1] < created_at) and sorted(existing) == sorted(existing, key=lambda e: (e[1], e[0])):
        assert all((s, at) > (seq, created_at) for s, at in existing if at > created_at)  # sequences agree with
        # dates and the parent is older: the copy sorts before every later version (its children too)


def test_a_chain_pushed_in_the_same_second_keeps_its_order(grown, tmp_path):
    """Two versions made in one second and copied in order both got sequence 0 and the same time: the
    id decided which was the newest, often the parent."""
    from dsbuild.lineage.transfer import transfer

    _, src, v1, v2 = grown
    cat = _copy(src, tmp_path)
    for v in (v1, v2):
        commit = cat / "versions" / v.version_id / "commit.json"
        commit.write_text(json.dumps({**json.loads(commit.read_text()), "created_at": "2026-01-01T00:00:00Z"}))
    dest = Catalog.open(tmp_path / "dest", create=True)
    transfer(Catalog.open(cat), v1.version_id, dest)
    transfer(Catalog.open(cat), v2.version_id, dest)
    assert dest.resolve(None) == v2.version_id


def test_a_failed_first_build_never_removes_another_builds_work_in_the_same_new_catalog(tmp_path):
    """A first convert that fails clears the location it was given (no empty catalog behind); another
    convert building into the same new catalog meanwhile lost its build folder."""
    from dsbuild.lineage.catalog import catalog_to_fill

    location = tmp_path / "cat"
    b = None
    with pytest.raises(RuntimeError, match="A failed"), catalog_to_fill(location):
        b = Catalog.open(location, create=True).build_area()  # B, running meanwhile (and after A)
        area = b.__enter__()
        (area.path / "shard-000000.tar.part").write_bytes(b"x")
        raise RuntimeError("A failed")
    try:
        assert (area.path / "shard-000000.tar.part").exists()  # B's build was live: nothing removed
    finally:
        b.__exit__(None, None, None)
    with pytest.raises(RuntimeError), catalog_to_fill(location / "other"):
        raise RuntimeError("alone")
    assert not (location / "other").exists()


def test_a_shard_found_at_the_destination_and_removed_before_the_commit_is_sent_again(grown, tmp_path):
    """A copy resumed after an interrupt finds shards already there and skips them; one removed after
    that (a gc that had read the push's holds a moment before) failed the push at its commit ("did not
    arrive"). The commit, under the lock gc takes, sends what is missing."""
    import shutil

    from dsbuild.lineage.transfer import transfer

    _, cat, v1, _ = grown
    dest = Catalog.open(tmp_path / "dest", create=True)
    shards = Catalog.open(cat).manifest(v1.version_id).shards
    for rec in shards:  # left by an interrupted copy
        (dest.root / rec.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cat / rec.path, dest.root / rec.path)

    def removed_meanwhile(state) -> None:
        if state.done == 1:
            (dest.root / shards[0].path).unlink()

    report = transfer(Catalog.open(cat), v1.version_id, dest, progress=removed_meanwhile)
    assert (report.shards_sent, report.shards_skipped) == (1, len(shards) - 1) and verify(dest, v1.version_id).ok


def test_a_damaged_old_version_never_blocks_a_build_with_other_settings(grown, tmp_path):
    """Looking for a parent built with the same settings read every version's manifest: one damaged
    manifest of an unrelated older version failed every later convert (exit 3) and its dry run."""
    from dsbuild.convert import plan_convert

    caps, src, v1, v2 = grown
    cat = _copy(src, tmp_path)
    (cat / "versions" / v1.version_id / "manifest.json").write_bytes(b'{"damaged": true}')
    other = dataclasses.replace(CONFIG, clip_seconds=2.0)
    assert plan_convert(caps, cat, other).reusable is False
    r = convert(caps, cat, other, executor=ExecutorSpec(workers=1))
    assert r.parent == v2.version_id and r.reused_sessions == 0 and r.samples > 0


def test_a_catalog_another_process_creates_meanwhile_is_opened_not_called_foreign(tmp_path, monkeypatch):
    """Two converts creating one new catalog at once: one looked for the marker before the other wrote
    it, then found it while listing the folder and refused it ("folder is not empty and not a dsbuild
    catalog", exit 2; 3 runs in 700 of a racing script). The interleaving, made certain here."""
    from dsbuild.core.store import open_store

    Catalog.open(tmp_path / "cat", create=True)  # the other process, done first
    store_type = type(open_store(str(tmp_path / "cat")))
    real, asked = store_type.exists, []

    def exists(self, key):
        asked.append(key)
        return False if len(asked) == 1 else real(self, key)  # looked before the other one wrote

    monkeypatch.setattr(store_type, "exists", exists)
    assert Catalog.open(tmp_path / "cat", create=True).versions() == []
    assert asked[0] == "catalog.json"


def test_a_local_catalogs_shard_has_no_cached_copy_to_open(wds_catalog):
    """Only an object store's shards come through a cache; asking a local catalog for its copy is a
    LineageError, not an AttributeError from the local store (or an assert that ``python -O`` drops)."""
    cat = Catalog.open(wds_catalog[0])
    record = cat.manifest(wds_catalog[1]).shards[0]
    with pytest.raises(LineageError, match="local catalog"):
        cat.open_shard_copy(record)
    assert cat.drop_shard_copy(record, lambda st: True) is False
