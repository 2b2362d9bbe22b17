"""Object storage end to end against a real S3 endpoint (moto's server) on 127.0.0.1, started here:
convert -> verify -> query -> split -> load, captures on S3, manifest-last visibility, the bounded
shard cache, and a connection dropped in the middle of a read."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from dsbuild.convert import ConvertConfig, convert  # noqa: E402
from dsbuild.lineage.catalog import open_ref  # noqa: E402
from dsbuild.lineage.remote import RemoteCatalog, ShardCache  # noqa: E402
from dsbuild.lineage.verify import verify  # noqa: E402

CONFIG = ConvertConfig(clip_seconds=2.0)


class DroppingProxy:
    """A TCP proxy to the S3 server that, when armed, cuts the next response after ``after`` bytes."""

    def __init__(self, target: int, after: int = 40_000):
        self.target, self.after = target, after
        self.armed = False
        self.drops = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src, dst, response):
        sent = 0
        try:
            while data := src.recv(65536):
                if response and self.armed and sent + len(data) > self.after:
                    self.armed = False
                    self.drops += 1
                    dst.sendall(data[: self.after - sent])
                    raise ConnectionResetError("dropped by the test proxy")
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    proxy = DroppingProxy(server._server.server_port)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "DSBUILD_CACHE": str(tmp_path_factory.mktemp("cache"))}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import boto3

    boto3.client("s3").create_bucket(Bucket="data")
    yield proxy
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


@pytest.fixture(scope="module")
def remote_catalog(s3, captures):
    r = convert(captures, "s3://data/catalog", CONFIG, workers=2)
    return "s3://data/catalog", r


def test_convert_to_s3_is_byte_identical_to_local_and_verifies(remote_catalog, captures, tmp_path):
    url, r = remote_catalog
    local = convert(captures, tmp_path / "local", CONFIG, workers=1)
    assert r.version_id == local.version_id and r.catalog == url
    catalog, vid = open_ref(url)
    assert vid == r.version_id and catalog.remote is not None
    report = verify(catalog, vid)
    assert report.ok and report.shards_checked == r.shards


def test_cli_log_query_tag_and_split_work_on_s3(remote_catalog):
    url, r = remote_catalog
    cli = [sys.executable, "-c", "from dsbuild.cli.app import main; main()"]
    log = json.loads(subprocess.run(cli + ["log", url, "--json"], capture_output=True, text=True).stdout)
    assert log["versions"][0]["version_id"] == r.version_id
    q = subprocess.run(cli + ["query", url, "select count(*) n from samples", "--json"], capture_output=True, text=True)
    assert json.loads(q.stdout) == [{"n": r.samples}]
    assert subprocess.run(cli + ["tag", f"{url}@{r.version_id[:8]}", "gold"], capture_output=True).returncode == 0
    assert subprocess.run(cli + ["split", f"{url}@gold", "--name", "main"], capture_output=True).returncode == 0
    fresh = RemoteCatalog(url)
    import shutil
    shutil.rmtree(fresh.mirror)  # another machine: nothing cached
    cat = fresh.pull()
    assert cat.resolve("gold") == r.version_id
    assert (cat.root / "splits" / r.version_id / "main" / "manifest.json").is_file()


def test_captures_on_s3_give_the_same_version(s3, captures, remote_catalog, tmp_path):
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.put(str(captures), "data/captures", recursive=True)
    r = convert("s3://data/captures", tmp_path / "cat", CONFIG, workers=1)
    assert r.version_id == remote_catalog[1].version_id


def test_a_version_without_its_manifest_is_invisible(remote_catalog):
    import fsspec

    url, r = remote_catalog
    fs = fsspec.filesystem("s3")
    fake = "f" * 64
    fs.pipe(f"data/catalog/versions/{fake}/index.parquet", b"partial upload")
    fs.pipe(f"data/catalog/versions/{fake}/commit.json", b"{}")
    cat = RemoteCatalog(url).pull()
    assert fake not in {v.version_id for v in cat.versions()}


def test_a_dropped_connection_mid_read_is_retried_and_data_is_identical(s3, remote_catalog, tmp_path):
    url, r = remote_catalog
    catalog, vid = open_ref(url)
    big = max(catalog.manifest(vid).shards, key=lambda s: s.bytes)
    cache = ShardCache(catalog.remote, directory=tmp_path / "fresh-cache")
    try:
        s3.armed = True
        path = cache.path(big.path, big.sha256, big.bytes)  # verified against the manifest sha256
    finally:
        s3.armed = False
    assert s3.drops == 1 and path.stat().st_size == big.bytes
