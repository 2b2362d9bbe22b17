"""Shards written by convert are read back by the real webdataset, tarfile, GNU tar, pyarrow, duckdb
and polars, and every clip decodes with PyAV to exactly the frames its metadata and arrays claim."""

from __future__ import annotations

import io
import subprocess
import tarfile

import duckdb
import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
import webdataset as wds
import zstandard
from blake3 import blake3

from dsbuild.core.hashing import sha256_file
from dsbuild.formats.sample import members_sha256
from dsbuild.formats.video import decoded_frame_count
from dsbuild.formats.webdataset import parse_members
from tests.helpers import index_rows, manifest, session_records, shard_files


def test_webdataset_library_reads_every_sample_and_clips_decode_to_the_claimed_frames(wds_catalog):
    catalog, vid = wds_catalog
    urls = [str(p) for p in shard_files(catalog, vid)]
    seen = 0
    for s in wds.WebDataset(urls, shardshuffle=False).decode():
        meta = s["json"]
        frames = meta["clip"]["frames"]
        assert meta["video"]["container"] == "mp4" and meta["video"]["has_audio"]  # synthetic captures have sound
        video = s["mp4"]
        assert decoded_frame_count(video) == frames
        assert s["actions.npy"].shape == (frames, len(meta["controls"]))
        assert s["telemetry.npy"].shape == (frames, len(meta["telemetry_channels"]))
        assert s["timestamps.npy"].shape == (frames,)
        assert np.all(np.diff(s["timestamps.npy"]) > 0)
        assert meta["clip"]["t_start"] <= s["timestamps.npy"][0] < meta["clip"]["t_end"]
        seen += 1
    assert seen == manifest(catalog, vid)["stats"]["samples"] > 0


def test_tarfile_and_gnu_tar_list_the_same_members_with_fixed_owner_and_mtime(wds_catalog):
    catalog, vid = wds_catalog
    for shard in shard_files(catalog, vid):
        with tarfile.open(shard) as tf:
            members = tf.getmembers()
        assert all(m.isreg() and m.mtime == 0 and m.uid == 0 and "/" not in m.name for m in members)
        gnu = subprocess.run(["tar", "-tf", str(shard)], capture_output=True, text=True, check=True)
        assert gnu.stdout.split() == [m.name for m in members]
        keys = [m.name.split(".", 1)[0] for m in members]
        assert keys == sorted(keys)


def test_index_byte_ranges_hold_exactly_their_sample_and_hash_matches(wds_catalog):
    catalog, vid = wds_catalog
    rows = index_rows(catalog, vid)
    assert [r["key"] for r in rows] == sorted(r["key"] for r in rows)
    assert len({r["key"] for r in rows}) == len(rows) and all("." not in r["key"] for r in rows)
    for r in rows:
        with open(catalog / r["shard"], "rb") as f:
            f.seek(r["byte_offset"])
            members = parse_members(f.read(r["byte_length"]), key=r["key"])
        assert members_sha256(members) == r["sha256"]
        b3 = blake3()  # the loader's per-read hash, over the same framing: extension, NUL, length, NUL, payload
        for ext, payload in members:
            b3.update(b"%s\0%d\0%s" % (ext.encode(), len(payload), payload))
        assert b3.hexdigest() == r["blake3"]
        assert [len(p) for _, p in members] == r["member_bytes"] and r["row_group"] is None


def test_manifest_hashes_every_source_and_shard(wds_catalog, captures):
    catalog, vid = wds_catalog
    m = manifest(catalog, vid)
    for s in m["shards"]:
        assert sha256_file(catalog / s["path"]) == (s["sha256"], s["bytes"])
    sources = session_records(catalog, vid)["sources"]
    for src in sources:
        assert not src["path"].startswith("/")
        assert sha256_file(captures / src["path"])[0] == src["sha256"]
    roles = {s["role"] for s in sources}
    assert roles == {"session", "video", "actions", "telemetry", "text"}
    assert m["vocabulary"]["controls"] == ["button_a", "button_b", "left", "right", "steer_x"]
    assert (catalog / "versions" / vid / "manifest.json").read_bytes()
    assert sha256_file(catalog / "versions" / vid / "manifest.json")[0] == vid


def test_raw_action_events_are_kept_per_window(wds_catalog):
    catalog, vid = wds_catalog
    for s in wds.WebDataset([str(p) for p in shard_files(catalog, vid)], shardshuffle=False).decode():
        lines = zstandard.ZstdDecompressor().decompress(s["events.jsonl.zst"]).splitlines()
        assert len(lines) == s["json"]["action_events"]
        t0, t1 = s["json"]["clip"]["t_start"], s["json"]["clip"]["t_end"]
        assert all(t0 <= __import__("json").loads(x)["t"] < t1 for x in lines)


def test_parquet_shards_read_by_pyarrow_duckdb_and_polars(parquet_catalog, wds_catalog):
    catalog, vid = parquet_catalog
    files = [str(p) for p in shard_files(catalog, vid)]
    table = pq.read_table(files[0])
    for row in table.to_pylist():
        assert len(row["actions"]) == row["frames"] * len(row["controls"])
        assert len(row["telemetry"]) == row["frames"] * len(row["telemetry_channels"])
        assert len(row["timestamps"]) == row["frames"]
        assert decoded_frame_count(row["video"]) == row["frames"]
    n = duckdb.sql(f"select count(*) from read_parquet({files!r})").fetchall()[0][0]
    assert n == manifest(catalog, vid)["stats"]["samples"] == pl.read_parquet(files).height
    # index row groups/rows point at the right sample
    for r in index_rows(catalog, vid)[:5]:
        rg = pq.ParquetFile(catalog / r["shard"]).read_row_group(r["row_group"], columns=["key"])
        assert rg.column("key")[r["row_index"]].as_py() == r["key"] and r["byte_offset"] is None


def test_every_parquet_column_is_compressed_where_it_pays(parquet_catalog):
    catalog, vid = parquet_catalog
    for shard in shard_files(catalog, vid):
        md = pq.ParquetFile(shard).metadata
        for g in range(md.num_row_groups):
            for c in range(md.num_columns):
                col = md.row_group(g).column(c)
                as_is = col.path_in_schema in ("video", "events")  # already compressed (MP4, zstd)
                assert col.compression == ("UNCOMPRESSED" if as_is else "ZSTD"), col.path_in_schema
                if col.path_in_schema in ("actions.list.element", "telemetry.list.element", "timestamps.list.element"):
                    assert "BYTE_STREAM_SPLIT" in col.encodings


def test_index_columns_use_null_maps_and_timestamps(wds_catalog):
    catalog, vid = wds_catalog
    path = catalog / "versions" / vid / "index.parquet"
    sql = (
        f"select typeof(conditions), typeof(started_at), sum(byte_length), count(row_group) from '{path}' group by all"
    )
    ((types_map, types_ts, total, row_groups),) = duckdb.sql(sql).fetchall()
    assert types_map == "MAP(VARCHAR, VARCHAR)" and types_ts.startswith("TIMESTAMP")
    assert total > 0 and row_groups == 0  # NULL, never -1, where a value does not apply


def test_content_id_is_the_same_for_both_formats(parquet_catalog, wds_catalog):
    assert manifest(*parquet_catalog)["content_id"] == manifest(*wds_catalog)["content_id"]
    assert parquet_catalog[1] != wds_catalog[1]


@pytest.mark.parametrize("ext", ["actions.npy", "telemetry.npy", "timestamps.npy"])
def test_npy_members_never_need_pickle(wds_catalog, ext):
    catalog, vid = wds_catalog
    with tarfile.open(shard_files(catalog, vid)[0]) as tf:
        m = next(m for m in tf.getmembers() if m.name.endswith(ext))
        arr = np.load(io.BytesIO(tf.extractfile(m).read()), allow_pickle=False)
    assert arr.dtype in (np.float32, np.float64)
