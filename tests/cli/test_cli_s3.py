"""Object storage through the real executable: every command that takes a catalog, REF or capture root
accepts an s3:// URL and keeps it a URL (moto's S3 server on 127.0.0.1, started here)."""

from __future__ import annotations

import json

import pytest

from tests.cli.clitools import make_buckets, run, run_json, start_s3

pytest.importorskip("s3fs")
pytest.importorskip("moto")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server, s3_env = start_s3(tmp_path_factory.mktemp("s3-cache"))
    make_buckets(s3_env, "raw", "data")
    yield s3_env
    server.stop()


@pytest.fixture(scope="module")
def remote(s3, caps, catalog):
    """(version id, the local build's): caps converted into s3://data/cat through the CLI, and the session's
    ``catalog`` fixture, the same captures built locally with the same settings."""
    vid = run("convert", caps, "s3://data/cat", "--clip-seconds", 2, "--quiet", extra_env=s3).stdout.strip()
    return vid, catalog[1]


def s3_keys(s3, prefix: str) -> list[str]:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3["AWS_ENDPOINT_URL"],
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    bucket, _, key = prefix.partition("/")
    return [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=key).get("Contents", [])]


def test_convert_into_s3_writes_the_bucket_not_a_local_folder(s3, remote, tmp_path):
    vid, local_id = remote
    assert vid == local_id  # the same version id as a local build
    assert f"cat/versions/{vid}/manifest.json" in s3_keys(s3, "data/cat/versions")
    assert not (tmp_path / "s3:").exists()


def test_captures_on_s3_convert_to_the_same_version(s3, remote, caps, tmp_path):
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3["AWS_ENDPOINT_URL"],
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    for f in caps.rglob("*"):
        if f.is_file():
            client.upload_file(str(f), "raw", f"caps/{f.relative_to(caps).as_posix()}")
    out = run("convert", "s3://raw/caps", "s3://data/cat2", "--clip-seconds", 2, "--json", extra_env=s3)
    assert json.loads(out.stdout)["version_id"] == remote[0]
    plan = json.loads(
        run(
            "convert", "s3://raw/caps", "s3://data/cat", "--clip-seconds", 2, "--dry-run", "--json", extra_env=s3
        ).stdout
    )
    assert plan["counts"]["reused"] == 3


def test_log_info_tag_verify_query_split_and_shards_work_on_s3(s3, remote):
    vid, _ = remote
    url = "s3://data/cat"
    assert json.loads(run("log", url, "--json", extra_env=s3).stdout)["versions"][0]["version_id"] == vid
    assert run("tag", f"{url}@{vid[:8]}", "gold", extra_env=s3).stdout.strip() == f"gold -> {vid}"
    info = json.loads(run("info", f"{url}@gold", "--json", extra_env=s3).stdout)
    assert info["tags"] == ["gold"] and info["catalog"] == url
    assert json.loads(run("verify", f"{url}@gold", "--json", extra_env=s3).stdout)["ok"] is True
    rows = json.loads(run("query", f"{url}@gold", "select count(*) as n from samples", "--json", extra_env=s3).stdout)
    assert rows == [{"n": info["stats"]["samples"]}]
    run("split", f"{url}@gold", "--name", "main", "--by", "session_id", "--quiet", extra_env=s3)
    run("split", f"{url}@gold", "--name", "main", "--check", "--quiet", extra_env=s3)
    urls = run("shards", f"{url}@gold", extra_env=s3).stdout.split()
    assert urls and all(u.startswith("s3://data/cat/shards/") for u in urls)
    keys = set(s3_keys(s3, "data/cat/shards"))
    assert {u.removeprefix("s3://data/") for u in urls} <= keys
    split_urls = run("shards", f"{url}@gold", "--split", "main/train", "--urls", extra_env=s3).stdout.split()
    assert split_urls and set(split_urls) <= set(urls)
    assert run("diff", f"{url}@gold", url, "--json", extra_env=s3).returncode == 0
    run("gc", url, "--dry-run", "--quiet", extra_env=s3)


def test_concurrent_tag_changes_on_s3_all_land(s3, remote):
    """tags.json is read, changed and written back: eight `dsbuild tag` at once kept one tag of eight. Each
    write is now conditional on the ETag it read (S3 If-Match), and a change that lost the race is redone."""
    from concurrent.futures import ThreadPoolExecutor

    vid, _ = remote
    names = [f"race-{i}" for i in range(8)]
    with ThreadPoolExecutor(len(names)) as pool:
        list(pool.map(lambda n: run("tag", f"s3://data/cat@{vid}", n, "--quiet", extra_env=s3), names))
    tags = run_json("log", "s3://data/cat", extra_env=s3)["versions"][0]["tags"]
    assert set(names) <= set(tags)
    with ThreadPoolExecutor(len(names)) as pool:
        list(pool.map(lambda n: run("tag", "s3://data/cat", n, "--delete", "--quiet", extra_env=s3), names))
    assert not set(names) & set(run_json("log", "s3://data/cat", extra_env=s3)["versions"][0]["tags"])


def test_a_missing_bucket_is_one_clear_line(s3):
    p = run("log", "s3://no-such-bucket/cat", extra_env=s3, check=None)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.startswith("error: "), p.stderr


def test_a_catalog_marker_that_is_a_folder_is_named_on_s3_and_locally(s3, caps, tmp_path):
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3["AWS_ENDPOINT_URL"],
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    client.put_object(Bucket="data", Key="odd/catalog.json/x", Body=b"not a marker")
    local = tmp_path / "odd"
    (local / "catalog.json").mkdir(parents=True)
    for where in ("s3://data/odd", local):
        for args in (("log", where), ("convert", caps, where)):
            p = run(*args, extra_env=s3, check=2)
            assert p.stderr.startswith(f"error: {where}/catalog.json: is a folder"), p.stderr


def test_validate_judges_the_bucket_not_a_cached_copy_damaged_on_local_disk(s3, remote, catalog):
    """A shard copy in the local cache damaged after it arrived (right size, so trusted) made `validate
    --level full` reject a sound catalog on S3, on every run until the cache evicted the copy."""
    from pathlib import Path

    from dsbuild.lineage.catalog import Catalog

    vid, _ = remote
    local, local_vid = catalog
    assert local_vid == vid  # the same captures and settings: the same shards, named alike
    run("validate", "s3://data/cat", "--level", "full", "--quiet", extra_env=s3)  # fills the cache
    firsts = {}
    for row in Catalog.open(local).index(vid).to_pylist():
        if row["shard"] not in firsts or row["byte_offset"] < firsts[row["shard"]]["byte_offset"]:
            firsts[row["shard"]] = row
    for shard, row in firsts.items():
        copy = Path(s3["DSBUILD_CACHE"]) / "shards" / Path(shard).name
        at = row["byte_offset"] + 1024 + -(-row["member_bytes"][0] // 512) * 512 + 100  # in its first video
        data = bytearray(copy.read_bytes())
        data[at] ^= 0xFF
        copy.write_bytes(bytes(data))
    p = run("validate", "s3://data/cat", "--level", "full", "--json", extra_env=s3)
    assert json.loads(p.stdout)["verdict"] == "accepted"
    assert "Traceback" not in p.stderr


def test_a_pull_from_s3_proves_a_cached_copy_and_fetches_a_damaged_one_again(s3, remote, tmp_path):
    """A shard copy damaged in the local cache made every pull blame the source ("a damaged or forged
    source", exit 3) while `verify` of the bucket passed."""
    from pathlib import Path

    vid, _ = remote
    run("pull", f"s3://data/cat@{vid}", tmp_path / "first", "--quiet", extra_env=s3)  # fills the cache
    for copy in (Path(s3["DSBUILD_CACHE"]) / "shards").iterdir():
        data = bytearray(copy.read_bytes())
        data[len(data) // 2] ^= 0xFF
        copy.write_bytes(bytes(data))
    run("pull", f"s3://data/cat@{vid}", tmp_path / "second", "--quiet", extra_env=s3)
    assert run("verify", tmp_path / "second").returncode == 0
    import hashlib

    def damage_cache():
        for copy in (Path(s3["DSBUILD_CACHE"]) / "shards").iterdir():
            data = bytearray(copy.read_bytes())
            data[len(data) // 2] ^= 0xFF
            copy.write_bytes(bytes(data))

    damage_cache()  # export too: it shipped the damaged bytes (wids) or blamed the source (hf)
    run("export", f"s3://data/cat@{vid}", tmp_path / "wids", "--to", "wids", "--quiet", extra_env=s3)
    names = {
        s["sha256"]
        for s in json.loads((tmp_path / "second" / "versions" / vid / "manifest.json").read_text())["shards"]
    }
    tars = sorted((tmp_path / "wids").rglob("*.tar"))
    assert tars and {hashlib.sha256(t.read_bytes()).hexdigest() for t in tars} <= names
    damage_cache()
    run("export", f"s3://data/cat@{vid}", tmp_path / "hf", "--to", "hf", "--quiet", extra_env=s3)


def test_push_and_pull_copy_a_version_with_its_tags_and_split_sets(s3, remote, tmp_path):
    vid, _ = remote
    local = tmp_path / "pulled"
    assert run("tag", f"s3://data/cat@{vid}", "gold", extra_env=s3).returncode == 0
    assert run("split", "s3://data/cat@gold", "--name", "main", "--by", "session_id", extra_env=s3).returncode == 0
    pulled = json.loads(run("pull", "s3://data/cat@gold", local, "--tags", "--splits", "--json", extra_env=s3).stdout)
    assert pulled["version_id"] == vid and pulled["shards_sent"] > 0 and pulled["tags"] == ["gold"]
    assert pulled["split_sets"] == ["main"] and run("verify", f"{local}@gold", extra_env=s3).returncode == 0
    again = json.loads(run("pull", "s3://data/cat@gold", local, "--json", extra_env=s3).stdout)
    assert again["shards_sent"] == 0 and again["version_existed"]  # content addressing: nothing to send
    pushed = json.loads(run("push", f"{local}@gold", "s3://data/copy", "--json", extra_env=s3).stdout)
    assert pushed["shards_sent"] == pulled["shards_sent"]
    assert run("verify", f"s3://data/copy@{vid}", extra_env=s3).returncode == 0
    missing = run("pull", "s3://data/cat@nosuchtag", local, check=2, extra_env=s3)
    assert "no version or tag" in missing.stderr and "Traceback" not in missing.stderr


def test_a_push_that_fails_leaves_no_new_catalog_in_the_bucket(s3, private_catalog):
    """A damaged source shard (exit 3) left catalog.json in a prefix that held nothing."""
    cat, vid = private_catalog
    shard = cat / json.loads((cat / "versions" / vid / "manifest.json").read_text())["shards"][-1]["path"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    p = run("push", cat, "s3://data/failed", check=3, extra_env=s3)
    assert "not what the shard's name and record say" in p.stderr, p.stderr
    assert s3_keys(s3, "data/failed/") == []
