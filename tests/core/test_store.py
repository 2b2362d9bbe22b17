"""Stores never read or write outside their root, whatever keys a hostile bucket or catalog holds."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsbuild.core.errors import FormatError, StorageError
from dsbuild.core.files import UnsafeFile, read_capped
from dsbuild.core.store import FsspecStore, LocalStore, ShardCache, UnsafeKey, check_key
from tests.helpers import unprivileged

HOSTILE = [
    "/etc/passwd",
    "//home/u/.ssh/x",
    "cat//x",
    "versions/../../x",
    "..",
    "a/./b",
    "a\\b",
    "C:/x",
    "c:x",
    "a/\nb",
    "a/\x00b",
    "",
    "a/",
    "/",
    "shards/ab/.hidden",
    "x\x7f",
]


@pytest.mark.parametrize("key", HOSTILE)
def test_hostile_keys_are_refused(key):
    with pytest.raises(UnsafeKey):
        check_key(key)


@given(st.text(max_size=40))
def test_a_key_that_passes_stays_inside_any_root(key):
    try:
        check_key(key)
    except UnsafeKey:
        return
    root = "/srv/catalog"
    assert os.path.normpath(os.path.join(root, key)).startswith(root + "/")


def test_local_store_refuses_keys_through_symlinked_folders(tmp_path):
    root = tmp_path / "cat"
    (root / "versions").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    (root / "versions" / "link").symlink_to(outside)
    store = LocalStore(root)
    with pytest.raises(UnsafeKey):
        store.read("versions/link/secret", 100)
    with pytest.raises(UnsafeKey):
        store.write("versions/link/new", b"x")
    assert not (outside / "new").exists()


def test_reads_are_capped_and_regular_files_only(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"x" * 101)
    with pytest.raises(FormatError, match="larger than the limit of 100"):
        read_capped(p, 100)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafeFile, match="FIFO"):
        read_capped(tmp_path / "fifo", 100)
    with pytest.raises(UnsafeFile, match="device"):
        read_capped("/dev/zero", 100)


def test_a_failed_atomic_replace_leaves_no_temp_file(tmp_path):
    target = tmp_path / "ro" / "tags.json"
    target.parent.mkdir()
    target.write_text("old")
    target.parent.chmod(0o500)
    try:
        out = unprivileged(
            "import sys; from dsbuild.core.errors import StorageError; from dsbuild.core.files import "
            "replace_atomically\ntry:\n    replace_atomically(sys.argv[1], b'new')\n"
            "except StorageError as e:\n    print('refused:', e)",
            target,
        )
    finally:
        target.parent.chmod(0o755)
    assert out.stdout.startswith("refused:") and "cannot write" in out.stdout, out.stderr
    assert target.read_text() == "old" and sorted(p.name for p in target.parent.iterdir()) == ["tags.json"]


def test_a_hostile_bucket_listing_is_filtered_and_cached_files_stay_in_the_cache(tmp_path, monkeypatch):
    fsspec = pytest.importorskip("fsspec", reason="the s3 extra (fsspec) is not installed")

    monkeypatch.setenv("DSBUILD_CACHE", str(tmp_path / "cache"))
    fs = fsspec.filesystem("memory")
    root = f"/bucket-{uuid.uuid4().hex}/cat"
    fs.pipe_file(f"{root}/versions/ok.json", b"{}")
    fs.pipe_file(f"{root}/cat//home/evil", b"x")  # an empty segment
    fs.pipe_file(f"{root}/versions/.hidden", b"x")
    store = FsspecStore(f"memory://{root}")
    assert store.list("") == ["versions/ok.json"]
    assert store.read("versions/ok.json", 100, proven=lambda d: True) == b"{}"
    cached = list((tmp_path / "cache").rglob("ok.json"))
    assert len(cached) == 1 and cached[0].read_bytes() == b"{}"
    with pytest.raises(UnsafeKey):
        store.read("versions/../../../../etc/passwd", 100, proven=lambda d: True)


def test_the_read_cache_keeps_only_bytes_their_reader_proved(tmp_path, monkeypatch):
    """A damaged copy read from the store is returned (the reader reports it) but never cached; once
    the store holds the right bytes again, they are read, not a stale damaged copy. A cached copy
    damaged on disk is read from the store again."""
    fsspec = pytest.importorskip("fsspec", reason="the s3 extra (fsspec) is not installed")

    from dsbuild.core.hashing import hashes_to, sha256_bytes

    monkeypatch.setenv("DSBUILD_CACHE", str(tmp_path / "cache"))
    fs = fsspec.filesystem("memory")
    root = f"/bucket-{uuid.uuid4().hex}/cat"
    good = b'{"right": true}'
    proven = hashes_to(sha256_bytes(good))
    fs.pipe_file(f"{root}/versions/v/manifest.json", b"{ damaged")
    store = FsspecStore(f"memory://{root}")
    assert store.read("versions/v/manifest.json", 100, proven=proven) == b"{ damaged"
    assert not list((tmp_path / "cache").rglob("manifest.json"))
    fs.pipe_file(f"{root}/versions/v/manifest.json", good)  # restored
    assert store.read("versions/v/manifest.json", 100, proven=proven) == good
    copy = next((tmp_path / "cache").rglob("manifest.json"))
    copy.write_bytes(b"{ rotten on disk")
    assert store.read("versions/v/manifest.json", 100, proven=proven) == good
    assert copy.read_bytes() == good


def _memory_store(tmp_path: Path, monkeypatch, shards: int) -> tuple[FsspecStore, dict[str, bytes]]:
    """An fsspec memory store holding ``shards`` random 1000-byte shards (key -> bytes)."""
    fsspec = pytest.importorskip("fsspec", reason="the s3 extra (fsspec) is not installed")

    monkeypatch.setenv("DSBUILD_CACHE", str(tmp_path / "cache"))
    root = f"/bucket-{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    blobs = {f"shards/{i:02d}/x.tar": os.urandom(1000) for i in range(shards)}
    for key, data in blobs.items():
        fs.pipe_file(f"{root}/{key}", data)
    return FsspecStore(f"memory://{root}"), blobs


def test_shard_cache_verifies_bytes_and_evicts_least_recently_used(tmp_path, monkeypatch):
    store, blobs = _memory_store(tmp_path, monkeypatch, 3)
    cache = ShardCache(store, limit=2500, directory=tmp_path / "shards")
    for key, data in blobs.items():
        path = cache.path(key, hashlib.sha256(data).hexdigest(), len(data))
        assert path.read_bytes() == data
    assert len(list((tmp_path / "shards").iterdir())) == 2  # the oldest was evicted
    with pytest.raises(StorageError, match="do not match the manifest"):
        cache.path("shards/00/x.tar", "0" * 64, 1000)
    assert not [p for p in (tmp_path / "shards").iterdir() if p.name.startswith(".")]


def test_a_shard_copy_handed_over_stays_readable_when_another_process_evicts_it(tmp_path, monkeypatch):
    """Processes on one machine share the shard cache. A path handed over could be evicted by another
    process's download before it was opened ("cannot fetch shard: No such file or directory" in a loader);
    ``open`` hands over a descriptor opened before the copy could be evicted."""
    store, blobs = _memory_store(tmp_path, monkeypatch, 2)
    first, second = (ShardCache(store, limit=1500, directory=tmp_path / "shards") for _ in range(2))
    (key0, data0), (key1, data1) = blobs.items()
    path0, fd = first.open(key0, hashlib.sha256(data0).hexdigest(), len(data0))
    try:
        second.path(key1, hashlib.sha256(data1).hexdigest(), len(data1))  # evicts the first copy
        assert not path0.exists()
        assert os.pread(fd, 2000, 0) == data0
    finally:
        os.close(fd)
    path0, fd = first.open(key0, hashlib.sha256(data0).hexdigest(), len(data0))  # fetched again
    os.close(fd)
    assert path0.read_bytes() == data0 and first.downloads == 2


def test_a_missing_file_that_stands_for_a_network_failure_is_a_storage_error():
    """fsspec's HTTP file system turns a refused connection into FileNotFoundError (the real error as its
    cause), which made an unreachable catalog "not a dsbuild catalog"; a 404 is a missing file."""
    from dsbuild.core.store import retry

    def raise_(error: Exception, cause: BaseException | None):
        def fn():
            raise error from cause

        return fn

    with pytest.raises(StorageError, match=r"http://h/cat/catalog.json: ConnectionRefusedError: .*refused"):
        retry("http://h/cat/catalog.json", raise_(FileNotFoundError("x"), ConnectionRefusedError("refused")))
    for cause in (None, ValueError("404, message='Not Found'"), FileNotFoundError("x")):
        with pytest.raises(FileNotFoundError):
            retry("http://h/cat/catalog.json", raise_(FileNotFoundError("x"), cause))


def test_a_conditional_write_on_s3_fails_once_the_object_changed(s3):
    """``write_if`` is the compare-and-swap tag changes are made with: the token of a read (the S3 ETag, or
    "*" for an absent object) no longer holds once another writer changed the object."""
    store = FsspecStore(f"s3://data/cas-{uuid.uuid4().hex[:8]}")
    data, absent = store.read_for_update("tags.json", 1 << 16)
    assert data is None and absent == "*"
    assert store.write_if("tags.json", b"1", absent) and not store.write_if("tags.json", b"2", absent)
    data, token = store.read_for_update("tags.json", 1 << 16)
    assert data == b"1" and store.write_if("tags.json", b"3", token)
    assert not store.write_if("tags.json", b"4", token) and store.read("tags.json", 1 << 16) == b"3"
    local = LocalStore(Path(os.environ["DSBUILD_CACHE"]) / f"cas-{uuid.uuid4().hex[:8]}")
    assert local.read_for_update("tags.json", 1 << 16) == (None, None)  # under the catalog lock: no token


def test_a_fifo_under_a_shards_name_in_the_shared_cache_is_never_waited_on(tmp_path, monkeypatch):
    """The cache (shared by the processes of one machine) opened a cached copy by its path: a FIFO put
    there blocked every reader of that shard forever. It is opened non-blocking, judged, and fetched again."""
    store, blobs = _memory_store(tmp_path, monkeypatch, 1)
    cache = ShardCache(store, limit=5000, directory=tmp_path / "shards")
    ((key, data),) = blobs.items()
    sha = hashlib.sha256(data).hexdigest()
    os.mkfifo(tmp_path / "shards" / f"{sha}.tar")
    assert cache.path(key, sha, len(data)).read_bytes() == data and cache.downloads == 1
