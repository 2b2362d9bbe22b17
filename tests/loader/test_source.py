"""Opening a version proves its index and refuses one that could make the loader misbehave; checkpoints
are range-checked. Forged versions are made the way an attacker would: a new index, and a manifest
whose pin matches it (so only the loader's own checks stand between them and the reader)."""

from __future__ import annotations

import dataclasses
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dsbuild.core.errors import FormatError, LineageError, UsageError
from dsbuild.core.hashing import sha256_bytes
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.manifest import FilePin
from dsbuild.loader import Loader, LoaderOptions
from dsbuild.loader.options import order_options
from dsbuild.loader.source import Source
from tests.loader.conftest import run


def forge(path: str, vid: str, mutate) -> str:
    """A new version of the catalog at ``path`` whose index is ``mutate(index rows)``, pinned correctly."""
    cat = Catalog.open(path)
    rows = mutate(cat.index(vid).to_pylist())
    table = pa.Table.from_pylist(rows, schema=cat.index(vid).schema)
    sink = io.BytesIO()
    pq.write_table(table, sink, store_schema=False)
    data = sink.getvalue()
    m = cat.manifest(vid)
    forged = dataclasses.replace(m, index=FilePin(m.index.path, sha256_bytes(data), len(rows), len(data)))
    new = forged.version_id
    folder = cat.root / "versions" / new
    folder.mkdir()
    (folder / m.index.path).write_bytes(data)
    (folder / m.sessions.path).write_bytes((cat.root / "versions" / vid / m.sessions.path).read_bytes())
    (folder / "manifest.json").write_bytes(forged.to_bytes())
    return new


def test_an_index_that_does_not_match_the_manifest_pin_is_refused(cat_copy):
    ref, vid = cat_copy
    index = Catalog.open(ref).root / "versions" / vid / "index.parquet"
    data = bytearray(index.read_bytes())
    data[100] ^= 1
    index.write_bytes(bytes(data))
    with pytest.raises(LineageError, match="pinned in the manifest"):
        Loader(ref, decode="bytes").state_dict()


def test_a_duplicated_index_row_is_refused_at_open(cat_copy):
    ref, vid = cat_copy
    forged = forge(ref, vid, lambda rows: rows + [rows[3]])
    with pytest.raises(FormatError, match=f"lists sample {Catalog.open(ref).index(vid)['key'][3]} more than once"):
        Loader(f"{ref}@{forged}", decode="bytes").state_dict()


def test_a_huge_length_is_a_format_error_naming_the_sample_not_a_memory_error(cat_copy):
    ref, vid = cat_copy

    def huge(rows):
        rows[2]["byte_length"] = 1 << 40
        return rows

    forged = forge(ref, vid, huge)
    key = Catalog.open(ref).index(vid)["key"][2]
    with pytest.raises(FormatError, match=f"{key}: index byte range .* lies outside its shard"):
        Loader(f"{ref}@{forged}", decode="bytes").state_dict()


@pytest.mark.parametrize("damage", ["overlap", "member_sizes", "row_count"])
def test_an_index_whose_ranges_overlap_or_whose_members_do_not_fit_is_refused(cat_copy, damage):
    ref, vid = cat_copy

    def mutate(rows):
        busiest = max({r["shard"] for r in rows}, key=lambda sh: sum(r["shard"] == sh for r in rows))
        same = [r for r in rows if r["shard"] == busiest]
        if damage == "overlap":
            same[1]["byte_offset"] = same[0]["byte_offset"] + 512
        elif damage == "member_sizes":
            rows[0]["member_bytes"] = [rows[0]["member_bytes"][0] + rows[0]["byte_length"]] + rows[0]["member_bytes"][
                1:
            ]
        else:
            rows[0]["member_bytes"] = rows[0]["member_bytes"][:5]
        return rows

    forged = forge(ref, vid, mutate)
    with pytest.raises(FormatError, match="overlaps|do not fit|member sizes"):
        Source(f"{ref}@{forged}").open()


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("width", 1_000_000, "1000000x.* picture, outside"),
        ("height", 0, "x0 picture, outside"),
        ("key", "../../etc/passwd\x1b[2J", "is not a sample key"),
        ("key", "k" * 100_000, "is not a sample key"),
    ],
)
def test_an_index_with_forged_picture_sizes_or_keys_is_refused_at_open(cat_copy, field, value, message):
    """Frame buffers were sized from the index's width and height before anything was decoded (30000 x
    30000: a MemoryError traceback; 1500 x 1500 for 160 x 210 clips: gigabytes), and any string was
    delivered as a key (100-KB keys, paths, terminal escapes)."""
    ref, vid = cat_copy

    def mutate(rows):
        rows[1][field] = value
        return rows

    forged = forge(ref, vid, mutate)
    with pytest.raises(FormatError, match=message):
        Source(f"{ref}@{forged}").open()


def test_a_split_loads_only_its_samples_and_is_named_by_its_hash(cat_copy):
    from dsbuild.split import SplitOptions, make_split

    ref, vid = cat_copy
    make_split(ref, vid, "main", SplitOptions(by="player", ratios="train=0.7,val=0.3"))
    src = Source(ref, "main/train").open()
    rows = {r["key"]: r for r in Catalog.open(ref).index(vid).to_pylist()}
    keys = set(rows)
    assert 0 < len(src) < len(keys) and set(src.keys.tolist()) <= keys
    # the samples' hashes are read only when asked for, and are the split's own rows'
    assert src.sha256 == [rows[k]["sha256"] for k in src.keys.tolist()]
    assert src.blake3 == [rows[k]["blake3"] for k in src.keys.tolist()]
    state = Loader(ref, "main/train", decode="bytes").state_dict()
    assert state["sources"][0]["split"] == "main/train" and len(state["sources"][0]["split_hash"]) == 64
    unhashed = {**state, "sources": [{**state["sources"][0], "split_hash": None}]}
    with pytest.raises(UsageError, match="no split hash"):  # was a TypeError from the message itself
        Loader(ref, "main/train", decode="bytes").load_state_dict(unhashed)
    with pytest.raises(UsageError, match="NAME/SPLIT"):
        Source(ref, "train").open()


@pytest.mark.parametrize(
    "field,value",
    [
        ("position", 1 << 63),
        ("position", -1),
        ("cursors", [{"epoch": 1 << 63, "at": 0}]),
        ("cursors", [{"epoch": 0, "at": 10**6}]),
        ("inner", 10**9),
        ("position", "3"),
        ("format", "dsbuild.loader/1"),
    ],
)
def test_checkpoint_fields_are_range_checked_naming_the_field(cat, field, value):
    ref, _ = cat
    _, state = run(ref, n=1)
    bad = {**state, field: value}
    with pytest.raises(FormatError, match=f"loader checkpoint.*{field.rstrip('s') if field != 'format' else 'format'}"):
        Loader(ref, decode="bytes", batch_size=3, seed=5).load_state_dict(bad)


@pytest.mark.parametrize("mix, past", [("sample", 3), ("sample", 0), ("batch", -4)])
def test_an_inner_position_past_its_planning_chunk_is_refused(cat, mix, past):
    """mix="sample": ``inner`` counts batches of the chunk at the cursors; it was checked against the chunk's
    sample count, so an edited one was taken and gave an empty epoch. mix="batch" has no inner position."""
    ref, _ = cat
    loader = Loader(ref, decode="bytes", batch_size=3, seed=5, mix=mix)
    n = len(loader)  # the whole epoch is one planning chunk
    inner = n + past
    state = {**loader.state_dict(), "inner": inner}
    with pytest.raises(FormatError, match=f"inner = {inner}, but the planning chunk there has"):
        Loader(ref, decode="bytes", batch_size=3, seed=5, mix=mix).load_state_dict(state)
    state["inner"] = n - 1 if mix == "sample" else 0
    resumed = Loader(ref, decode="bytes", batch_size=3, seed=5, mix=mix)
    resumed.load_state_dict(state)
    assert len(list(resumed)) == (1 if mix == "sample" else n)


def test_a_position_the_cursors_do_not_account_for_is_refused(cat, wds_catalog):
    """The global position was taken as written: an edited one made a per-batch mixture deal the next
    batches to other sources than the uninterrupted run (no error, another order)."""
    from dsbuild.loader import Mixture

    ref, _ = cat

    def mixture():
        return Mixture([(ref, None, 0.7), (str(wds_catalog[0]), None, 0.3)], decode="bytes", batch_size=1, seed=2)

    m = mixture()
    batches = iter(m)
    sources = [next(batches)["source"][0] for _ in range(20)]
    state = m.state_dict()
    nxt = next(batches)["source"][0]
    other = 1 - nxt  # one more batch, credited to the source the schedule does not give it to
    cursors = [dict(c) for c in state["cursors"]]
    cursors[other]["at"] += 1
    for bad, message in [
        ({**state, "position": 25}, "position = 25, but the cursors say the sources gave 20"),
        ({**state, "position": 21, "cursors": cursors}, "first 21 batches draw .* but the cursors say"),
    ]:
        with pytest.raises(FormatError, match=message):
            mixture().load_state_dict(bad)
    assert sources.count(0) == state["cursors"][0]["at"]  # the checks' premise, on the run itself
    single = Loader(ref, decode="bytes", batch_size=3, seed=5)
    with pytest.raises(FormatError, match="position = 7, but the cursors say the sources gave 0"):
        single.load_state_dict({**single.state_dict(), "position": 7})
    # mixing per sample: the cursors count samples; one credited to the source the first slot does not go to
    from dsbuild.loader.mixture import normalise, schedule

    per_sample = Mixture(
        [(ref, None, 0.7), (str(wds_catalog[0]), None, 0.3)], per="sample", decode="bytes", batch_size=1, seed=2
    )
    state = per_sample.state_dict()
    wrong = 1 - int(schedule(normalise([0.7, 0.3]), 2, 0, 1)[0])
    cursors = [{"epoch": 0, "at": int(k == wrong)} for k in range(2)]
    with pytest.raises(FormatError, match="first 1 samples draw .* but the cursors say"):
        per_sample.load_state_dict({**state, "cursors": cursors})


def test_state_is_small_json_and_lists_exactly_the_order_options(cat):
    ref, _ = cat
    _, state = run(ref, n=2)
    assert json.loads(json.dumps(state)) == state and len(json.dumps(state)) < 1000
    marked = set(order_options(LoaderOptions()))
    assert set(state["order"]) == marked
    assert {"block_size", "block_window", "seed", "batch_size", "shuffle", "mix", "policy"} <= marked
    assert not {"rank", "world_size", "num_workers", "verify", "device", "resize"} & marked


def test_options_are_validated_with_the_fix():
    with pytest.raises(UsageError, match="shuffle must be one of"):
        LoaderOptions(shuffle="random")
    with pytest.raises(UsageError, match="rank 2 is outside world_size 2"):
        LoaderOptions(rank=2, world_size=2)
    with pytest.raises(UsageError, match="unknown loader option 'batchsize'"):
        Loader("x", batchsize=3)
    assert LoaderOptions(verify=True).verify == "sample" and LoaderOptions(verify=False).verify == "none"
