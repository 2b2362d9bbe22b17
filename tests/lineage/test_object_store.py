"""Catalogs on S3 (moto's server on 127.0.0.1, started by the tests): convert and verify, captures on
S3, manifest-last visibility, a hostile bucket, the bounded verified shard cache with a dropped
connection, push/pull between catalogs, and gc without locks."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.executor import ExecutorSpec
from dsbuild.core.store import ShardCache
from dsbuild.lineage.catalog import Catalog, open_ref
from dsbuild.lineage.gc import collect
from dsbuild.lineage.history import log_entries
from dsbuild.lineage.splitsets import list_split_sets
from dsbuild.lineage.transfer import transfer
from dsbuild.lineage.verify import verify
from dsbuild.split import SplitOptions, make_split

CONFIG = ConvertConfig(clip_seconds=2.0, shard_size=300_000)


@pytest.fixture(scope="module")
def remote(s3, captures):
    r = convert(captures, "s3://data/catalog", CONFIG, executor=ExecutorSpec(workers=2))
    return "s3://data/catalog", r


def _fs():
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    return fs


def test_convert_to_s3_is_byte_identical_to_local_and_verifies(remote, captures, tmp_path):
    url, r = remote
    local = convert(captures, tmp_path / "local", CONFIG, executor=ExecutorSpec(workers=1))
    assert r.version_id == local.version_id and r.catalog == url and r.shards > 1
    catalog, vid = open_ref(url)
    assert vid == r.version_id and catalog.root is None
    report = verify(catalog, vid)
    assert report.ok and report.shards_checked == r.shards


def test_captures_on_s3_give_the_same_version(s3, captures, remote, tmp_path):
    _fs().put(str(captures), "data/captures", recursive=True)
    r = convert("s3://data/captures", tmp_path / "cat", CONFIG, executor=ExecutorSpec(workers=1))
    assert r.version_id == remote[1].version_id
    # an object `notes` beside `notes/a.txt` cannot be staged as files: the key is named (was "File exists"
    # on a temporary path)
    _fs().pipe("data/both/notes", b"x")
    _fs().pipe("data/both/notes/a.txt", b"y")
    from dsbuild.core.errors import UsageError

    with pytest.raises(UsageError, match="s3://data/both/notes: is both an object and a folder"):
        convert("s3://data/both", tmp_path / "cat2", CONFIG, executor=ExecutorSpec(workers=1))


def test_a_version_without_its_manifest_is_invisible(remote):
    url, _r = remote
    fake = "f" * 64
    _fs().pipe(f"data/catalog/versions/{fake}/index.parquet", b"partial upload")
    assert fake not in {v.version_id for v in Catalog.open(url).versions()}


def test_a_hostile_bucket_cannot_make_dsbuild_write_outside_its_cache(s3, captures, tmp_path):
    url = "s3://data/hostile"
    r = convert(captures, url, CONFIG, executor=ExecutorSpec(workers=1))
    fs = _fs()
    target = tmp_path / "pwned"
    for key in [
        f"data/hostile//{target}",
        f"data/hostile/versions/../../{target.name}",
        f"data/hostile/versions/{r.version_id}/../../../../{target}",
        f"data/hostile/splits/{r.version_id}/x/..\\..\\pwned.json",
    ]:
        fs.pipe(key, b"owned")
    cat = Catalog.open(url)
    assert [v.version_id for v in cat.versions()] == [r.version_id]
    assert verify(cat, r.version_id).ok and log_entries(cat)[0]["version_id"] == r.version_id
    assert list_split_sets(cat, r.version_id) == []
    assert not target.exists() and not (tmp_path.parent / "pwned").exists()
    cache = os.environ["DSBUILD_CACHE"]
    escaped = list(tmp_path.parent.rglob("*pwned*")) + list(Path(cache).rglob("*pwned*"))
    assert escaped == []


def test_the_shard_cache_is_bounded_and_verified_and_never_downloads_twice(remote, tmp_path):
    url, _ = remote
    catalog, vid = open_ref(url)
    shards = catalog.manifest(vid).shards
    sizes = sorted(s.bytes for s in shards)
    cache = ShardCache(catalog.store, limit=sizes[-1] + sizes[-2], directory=tmp_path / "bounded")
    for s in shards:
        cache.path(s.path, s.sha256, s.bytes)
    assert sum(p.stat().st_size for p in cache.dir.iterdir()) <= cache.limit and cache.downloads == len(sizes)
    cache.path(shards[-1].path, shards[-1].sha256, shards[-1].bytes)
    assert cache.downloads == len(sizes)  # cached and verified: not downloaded again


def test_a_dropped_connection_mid_read_is_retried_and_data_is_identical(s3, remote, tmp_path):
    url, _ = remote
    catalog, vid = open_ref(url)
    big = max(catalog.manifest(vid).shards, key=lambda s: s.bytes)
    cache = ShardCache(catalog.store, directory=tmp_path / "fresh-cache")
    drops = s3.drops
    try:
        s3.armed = True
        path = cache.path(big.path, big.sha256, big.bytes)  # verified against the manifest's sha256
    finally:
        s3.armed = False
    assert s3.drops == drops + 1 and path.stat().st_size == big.bytes


def test_a_network_that_cannot_deliver_shards_is_an_environment_error_not_damage(s3, remote):
    """verify (and validate) reported every shard of a sound remote catalog "unreadable": exit 1 and
    REJECTED, as if the data were damaged, when the network or the local cache was the cause."""
    from dsbuild.core.errors import StorageError

    url, _ = remote
    catalog, vid = open_ref(url)
    catalog.manifest(vid)
    s3.down = True
    try:
        with pytest.raises(StorageError, match="cannot read") as e:
            verify(catalog, vid)
        assert "not found damaged" in e.value.hint
    finally:
        s3.down = False
    assert verify(catalog, vid).ok


def test_an_endpoint_that_never_answers_is_a_storage_error_after_our_retries_alone(s3, monkeypatch):
    """s3fs's retries and botocore's, each waiting out a 60-s read timeout, multiplied by ours: a command
    on an endpoint that accepts connections and never answers ran for many minutes. Now each request is
    tried by our loop alone, bounded by the timeouts and a deadline (shortened here)."""
    import dsbuild.core.store as store
    from dsbuild.core.errors import StorageError

    monkeypatch.setattr(store, "READ_TIMEOUT", 1)
    monkeypatch.setattr(store, "DEADLINE", 3.0)
    before = s3.accepted
    s3.silent = True
    try:
        with pytest.raises(StorageError, match="s3://data/silent"):
            Catalog.open("s3://data/silent")
    finally:
        s3.silent = False
    assert s3.accepted - before <= store.RETRIES  # one connection a try, no retries under ours


def test_loader_processes_sharing_a_small_shard_cache_all_read_every_epoch(s3, remote, tmp_path):
    """Ranks on one machine share DSBUILD_CACHE. With a budget of one shard, each process's
    downloads evicted copies another had just been handed, which then failed to open: "cannot open
    shard: No such file or directory". A copy is now opened as it is handed over (an eviction cannot
    take it away) and one evicted before that is fetched again."""
    import subprocess
    import sys

    url, r = remote
    catalog, vid = open_ref(url)
    shards = catalog.manifest(vid).shards
    assert len(shards) >= 4
    code = (
        "from dsbuild.loader import Loader\n"
        "n = 0\n"
        "for epoch in range(3):\n"
        f"    with Loader({url!r}, decode='bytes', batch_size=2, seed=epoch, verify='shard') as loader:\n"
        "        n += sum(len(b['keys']) for b in loader)\n"
        "print(n)\n"
    )
    env = {
        **os.environ,
        "DSBUILD_CACHE": str(tmp_path / "shared"),
        "DSBUILD_CACHE_BYTES": str(max(s.bytes for s in shards) + 1),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-600:] for _, err in outs]
    assert {out.strip() for out, _ in outs} == {str(3 * r.samples)}


def test_an_unwritable_local_cache_is_named_not_the_remote_key(s3, remote, tmp_path, monkeypatch):
    from dsbuild.core.errors import StorageError

    url, r = remote
    (tmp_path / "afile").write_text("not a folder")
    monkeypatch.setenv("DSBUILD_CACHE", str(tmp_path / "afile"))
    with pytest.raises(StorageError, match="cannot write the local cache") as e:
        Catalog.open(url).manifest(r.version_id)
    assert "DSBUILD_CACHE" in e.value.hint  # it blamed s3://.../commit.json: "cannot read (Not a directory)"


def test_push_and_pull_copy_only_what_is_missing_with_tags_and_splits(s3, wds_catalog, tmp_path):
    src_path, vid = wds_catalog
    shutil.copytree(src_path, tmp_path / "src")
    src = Catalog.open(tmp_path / "src")
    src.set_tag("gold", vid)
    make_split(src, vid, "main", SplitOptions(by="session_id"))
    dest = Catalog.open("s3://data/pushed", create=True)
    first = transfer(src, "gold", dest, tags=True, splits=True)
    assert first.shards_sent == len(src.manifest(vid).shards) and not first.version_existed
    assert first.tags == ("gold",) and first.split_sets == ("main",)
    again = transfer(src, vid, dest)
    assert again.shards_sent == 0 and again.version_existed
    assert verify(Catalog.open("s3://data/pushed"), vid).ok
    back = Catalog.open(tmp_path / "back", create=True)
    pulled = transfer(Catalog.open("s3://data/pushed"), "gold", back, tags=True, splits=True)
    assert pulled.version_id == vid and back.resolve("gold") == vid and verify(back, vid).ok
    assert [s.name for s in list_split_sets(back, vid)] == ["main"]


def test_an_interrupted_push_publishes_nothing_and_resumes(s3, wds_catalog):
    src_path, vid = wds_catalog
    src = Catalog.open(src_path)
    dest = Catalog.open("s3://data/resumed", create=True)
    fs = _fs()
    first = src.manifest(vid).shards[0]
    fs.put(str(src_path / first.path), f"data/resumed/{first.path}")  # as far as a killed push got
    assert Catalog.open("s3://data/resumed").versions() == []
    r = transfer(src, vid, dest)
    assert r.shards_skipped == 1 and r.shards_sent == len(src.manifest(vid).shards) - 1
    assert verify(Catalog.open("s3://data/resumed"), vid).ok


def test_object_store_gc_keeps_referenced_and_young_shards(s3, remote):
    url, r = remote
    fs = _fs()
    orphan = "shards/ee/" + "e" * 64 + ".tar"
    fs.pipe(f"data/catalog/{orphan}", b"x" * 10)
    cat = Catalog.open(url)
    kept = collect(cat, dry_run=False, grace=3600)
    assert orphan in kept["kept_young_shards"] and fs.exists(f"data/catalog/{orphan}")
    done = collect(cat, grace=1, now=time.time() + 2)  # two seconds later: the orphan is past its grace
    assert [s["path"] for s in done["shards"]] == [orphan] and not fs.exists(f"data/catalog/{orphan}")
    assert verify(Catalog.open(url), r.version_id).ok


def test_a_record_whose_size_is_not_the_remote_objects_neither_empties_the_cache_nor_downloads(s3, remote, tmp_path):
    """A forged record claiming 2**50 bytes used to evict every cached shard (of any catalog) first."""
    from dsbuild.core.errors import StorageError

    url, r = remote
    catalog = Catalog.open(url)
    shards = catalog.manifest(r.version_id).shards
    cache = ShardCache(catalog.store, directory=tmp_path / "cache")
    kept = [cache.path(s.path, s.sha256, s.bytes) for s in shards[:2]]
    forged = shards[2]
    with pytest.raises(StorageError, match="the manifest says"):
        cache.path(forged.path, forged.sha256, 1 << 50)
    assert all(p.exists() for p in kept) and cache.downloads == 2
    small = ShardCache(catalog.store, limit=forged.bytes - 1, directory=tmp_path / "small")
    with pytest.raises(StorageError, match="do not fit the shard cache"):
        small.path(forged.path, forged.sha256, forged.bytes)


def test_partial_downloads_a_kill_left_behind_are_swept_and_young_ones_kept(s3, remote, tmp_path):
    from dsbuild.core.store import PART_GRACE

    url, r = remote
    catalog = Catalog.open(url)
    shard = catalog.manifest(r.version_id).shards[0]
    cache = ShardCache(catalog.store, directory=tmp_path / "cache")
    old, young = cache.dir / ".dead.tar.1.a.part", cache.dir / ".live.tar.2.b.part"
    old.write_bytes(b"x" * 1000)
    young.write_bytes(b"y" * 1000)
    os.utime(old, (time.time() - PART_GRACE - 60,) * 2)
    cache.path(shard.path, shard.sha256, shard.bytes)
    assert not old.exists() and young.exists()


def test_gc_keeps_a_split_set_whose_pointer_is_damaged_and_young_split_files_on_s3(s3, remote):
    """gc must not take the only copy of a split set for garbage: a pointer it cannot read keeps every
    folder of that name, and on S3 a folder younger than the grace period may be one whose pointer is
    about to be written."""
    url, r = remote
    catalog = Catalog.open(url)
    make_split(catalog, r.version_id, "gcd", SplitOptions(by="session_id"))
    fs = _fs()
    pointer = f"data/catalog/splits/{r.version_id}/gcd.json"
    fs.pipe(pointer, b"{ damaged")
    done = collect(Catalog.open(url), grace=1, now=time.time() + 10)
    assert done["unreadable_split_pointers"] == [f"splits/{r.version_id}/gcd.json"]
    assert not [k for k in done["replaced_split_files"] if "/gcd/" in k]
    assert fs.find(f"data/catalog/splits/{r.version_id}/gcd/")
    fs.rm(pointer)  # as if make_split had written the folder and not yet its pointer
    young = collect(Catalog.open(url))  # default grace: a day
    assert not [k for k in young["replaced_split_files"] if "/gcd/" in k]
    assert fs.find(f"data/catalog/splits/{r.version_id}/gcd/")


def test_a_tag_delete_whose_answer_was_lost_is_done_not_no_such_tag(s3, remote, monkeypatch):
    """The delete's conditional write landed but its answer was lost; the retry, conditional on the old
    ETag, was refused, the change was read and made again, and the tag was gone: "no tag" (exit 2) for
    a delete that had worked. A delete that finds its tag gone on a later try is done."""
    from dsbuild.core.store import FsspecStore

    url, _ = remote
    catalog, vid = open_ref(url)
    catalog.set_tag("lost-answer", vid)
    write_if, after, drops = FsspecStore.write_if, s3.after, s3.drops

    def answer_lost_once(self, key, data, token):
        s3.after, s3.armed = 25, True  # the answer is cut (after an interim "100 Continue", 25 bytes)
        try:
            return write_if(self, key, data, token)
        finally:
            s3.after, s3.armed = after, False

    monkeypatch.setattr(FsspecStore, "write_if", answer_lost_once)
    assert catalog.set_tag("lost-answer", None, delete=True) is None
    assert s3.drops > drops and "lost-answer" not in catalog.tags()


def test_a_cached_copy_damaged_on_local_disk_is_not_reported_as_damage_to_the_version(s3, remote):
    """verify checked every sample's framing in the local cache's copy without proving it: one byte
    flipped there (a bad disk, another program) rejected a sound S3 version (exit 1, `bad locator`), as
    did validate; the cache is proven first and fetched again."""
    from tests.helpers import cli

    url, _ = remote
    assert cli("verify", url).returncode == 0  # fills the cache
    cached = [p for p in (Path(os.environ["DSBUILD_CACHE"]) / "shards").rglob("*") if p.is_file()]
    assert cached
    for p in cached:
        with open(p, "r+b") as f:
            f.seek(100)  # inside the first member's tar header
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 0xFF]))
    for command in ("verify", "validate"):
        p = cli(command, url, "--json")
        assert p.returncode == 0, (command, p.stdout[-600:], p.stderr[-300:])


def test_capture_folders_named_with_spaces_or_accents_convert_from_s3_as_locally(s3, captures, tmp_path):
    """Staging listed capture objects by the catalog's key rule ([A-Za-z0-9._-]): two of three sessions
    named `dd 0 0001` and `kś-0-0000` vanished from an S3 convert, exit 0, nothing reported. A key that
    cannot be a local path is refused, named."""
    from tests.helpers import cli

    mine = tmp_path / "caps"
    for session in sorted(p for p in captures.iterdir() if p.is_dir())[:3]:  # two to rename, one as it was
        shutil.copytree(session, mine / session.name)
    first, second = sorted(p for p in mine.iterdir() if p.is_dir())[:2]
    first.rename(mine / "dd 0 0001")
    second.rename(mine / "kś-0-0000")
    local = convert(mine, tmp_path / "local", CONFIG, executor=ExecutorSpec(workers=1))
    _fs().put(str(mine), "data/named-caps", recursive=True)
    p = cli(
        "convert", "s3://data/named-caps", tmp_path / "cat", "--clip-seconds", "2", "--shard-size", "300000", "--json"
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["version_id"] == local.version_id
    _fs().pipe("data/named-caps/" + "x" * 300 + "/session.json", b"{}")
    p = cli("convert", "s3://data/named-caps", tmp_path / "cat", "--clip-seconds", "2")
    assert p.returncode == 2 and "s3://data/named-caps/xxx" in p.stderr and "longer than a file name" in p.stderr
