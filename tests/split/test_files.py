"""Split sets on disk, made from real catalogs converted from generated captures.

Each module-level catalog is a private copy of a conftest catalog, so the split sets written here never
show up in other tests' catalogs.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import unicodedata
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.errors import UsageError
from dsbuild.core.executor import ExecutorSpec
from dsbuild.core.hashing import sha256_bytes, sha256_file
from dsbuild.core.jsonio import canonical_json, pretty_json
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.index import LOCATOR_COLUMNS
from dsbuild.lineage.splitsets import SPLIT_FORMAT, SplitManifest, publish_split_set
from dsbuild.samples.synthetic import generate
from dsbuild.samples.writer import SessionSpec, VideoSpec
from dsbuild.split import (
    SplitOptions,
    check_split,
    diff_split_sets,
    list_split_sets,
    load_split,
    make_split,
    open_split,
)
from dsbuild.split.files import split_schema, table_bytes
from dsbuild.split.make import SAMPLE_SHARE_TOLERANCE
from tests.cli.clitools import run, run_json
from tests.helpers import index_rows

LOCATORS = list(LOCATOR_COLUMNS)


@pytest.fixture(scope="module")
def catalog(wds_catalog, tmp_path_factory) -> tuple[Path, str]:
    src, vid = wds_catalog
    dst = tmp_path_factory.mktemp("split") / "catalog"
    shutil.copytree(src, dst, symlinks=True)
    return dst, vid


@pytest.fixture(scope="module")
def grown(captures, wds_catalog, tmp_path_factory) -> tuple[Path, str, str]:
    """(catalog, v1, v2): v2 converts the same captures plus four new sessions into the same catalog."""
    src, v1 = wds_catalog
    base = tmp_path_factory.mktemp("grown")
    cat = base / "catalog"
    shutil.copytree(src, cat, symlinks=True)
    caps = base / "captures"
    shutil.copytree(captures, caps, symlinks=True)
    generate(caps, sessions=4, seconds=4.0, seed=12)
    v2 = convert(
        caps, cat, ConvertConfig(format="webdataset", clip_seconds=3.0), executor=ExecutorSpec(workers=1)
    ).version_id
    assert v2 != v1
    return cat, v1, v2


@pytest.fixture(scope="module")
def partial(tmp_path_factory) -> tuple[Path, str]:
    """A catalog where one session lacks conditions.track and one has a title of its own."""
    base = tmp_path_factory.mktemp("partial")
    video = VideoSpec(160, 120, 30, 30)
    specs = [
        SessionSpec("s-a", "Kart Storm", "p-1", video, conditions={"track": "harbor"}),
        SessionSpec("s-b", "Kart Storm", "p-2", video, conditions={"track": "city"}),
        SessionSpec("s-c", "Sky Rally", "p-3", video, conditions={}),
    ]
    generate(base / "captures", sessions=3, seconds=2.0, seed=5, specs=specs)
    r = convert(base / "captures", base / "catalog", ConvertConfig(clip_seconds=1.0), executor=ExecutorSpec(workers=1))
    return base / "catalog", r.version_id


@pytest.fixture(scope="module")
def whale(tmp_path_factory) -> Path:
    """A catalog where one player holds 9 of the 10 samples: whatever split the hash gives them is far
    from its ratio in samples."""
    base = tmp_path_factory.mktemp("whale")
    video = VideoSpec(160, 120, 30, 30)
    specs = [SessionSpec(f"w-{k}", "Kart Storm", "whale", video) for k in range(9)]
    specs.append(SessionSpec("s-0", "Kart Storm", "p-0", video))
    generate(base / "captures", sessions=len(specs), seconds=1.0, seed=5, specs=specs)
    convert(base / "captures", base / "catalog", ConvertConfig(clip_seconds=1.0), executor=ExecutorSpec(workers=1))
    return base / "catalog"


def _keys(table: pa.Table) -> list[str]:
    return table["key"].to_pylist()


# -- what is written -------------------------------------------------------------------------------


def test_split_set_lists_every_sample_once_with_the_index_locators(catalog):
    cat, vid = catalog
    r = make_split(cat, vid, "main")
    folder = Path(r.path)
    assert r.state == "created" and folder.parent == cat / "splits" / vid / "main"
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "test.parquet", "train.parquet", "val.parquet"]
    index = {row["key"]: row for row in index_rows(cat, vid)}
    seen = []
    for split in ("test", "train", "val"):
        table = load_split(cat, vid, f"main/{split}")
        assert table.schema.names == split_schema().names
        assert _keys(table) == sorted(_keys(table))
        for row in table.to_pylist():
            assert {k: row[k] for k in LOCATORS} == {k: index[row["key"]][k] for k in LOCATORS}
            assert row["group_value"] == index[row["key"]]["player"] and row["split"] == split
        seen += _keys(table)
    assert sorted(seen) == sorted(index)


def test_manifest_has_sorted_keys_its_own_hash_and_the_file_hashes(catalog):
    cat, vid = catalog
    folder = Path(make_split(cat, vid, "main").path)
    raw = (folder / "manifest.json").read_bytes()
    doc = json.loads(raw)
    assert raw == pretty_json(doc)  # sorted keys, deterministic layout
    assert doc["format"] == SPLIT_FORMAT and doc["version_id"] == vid and doc["name"] == "main"
    assert doc["hash"] == sha256_bytes(canonical_json({k: v for k, v in doc.items() if k != "hash"}))
    assert doc["parameters"]["ratios"] == {"test": 0.1, "train": 0.8, "val": 0.1}
    for rec in doc["splits"].values():
        assert sha256_file(folder / rec["file"]) == (rec["sha256"], rec["bytes"])
        assert rec["samples"] == pq.read_metadata(folder / rec["file"]).num_rows
    assert sum(r["groups"] for r in doc["splits"].values()) == doc["totals"]["groups"]
    assert sum(r["samples"] for r in doc["splits"].values()) == doc["totals"]["assigned_samples"]
    empty = [s for s, r in doc["splits"].items() if r["groups"] == 0]
    assert [w for w in doc["warnings"] if "is empty" in w] == [f"split {s!r} is empty (0 groups)" for s in empty]


def test_identical_rerun_is_a_no_op_and_a_different_one_needs_force(catalog):
    cat, vid = catalog
    first = make_split(cat, vid, "rerun", SplitOptions(salt="a"))
    folder = Path(first.path)
    stamp = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    again = make_split(cat, vid, "rerun", SplitOptions(salt="a"))
    assert again.state == "existed" and again.manifest == first.manifest
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamp
    with pytest.raises(UsageError, match="a different split set") as e:
        make_split(cat, vid, "rerun", SplitOptions(salt="b"))
    assert "--force" in e.value.hint
    replaced = make_split(cat, vid, "rerun", SplitOptions(salt="b"), force=True)
    assert replaced.state == "replaced" and open_split(cat, vid, "rerun").hash == replaced.manifest.to_json()["hash"]
    assert check_split(cat, vid, "rerun").ok
    assert sorted(p.name for p in folder.parent.iterdir()) == sorted([folder.name, Path(replaced.path).name])


def test_incomplete_folders_are_not_split_sets(catalog):
    cat, vid = catalog
    make_split(cat, vid, "main")
    (cat / "splits" / vid / "half-written").mkdir()
    (cat / "splits" / vid / "half-written" / "train.parquet").write_bytes(b"PAR1")
    names = [s.name for s in list_split_sets(cat, vid)]
    assert "main" in names and "half-written" not in names
    with pytest.raises(UsageError, match="no split set 'half-written'"):
        load_split(cat, vid, "half-written/train")


def test_duckdb_reads_split_files_in_place_and_proves_groups_are_disjoint(catalog):
    cat, vid = catalog
    r = make_split(cat, vid, "by-session", SplitOptions(by="session_id", ratios="train=0.5,val=0.25,test=0.25"))
    glob = f"{r.path}/*.parquet"
    con = duckdb.connect()
    counts = con.execute(
        f"SELECT split, count(*), count(DISTINCT group_value) FROM '{glob}' GROUP BY split ORDER BY split"
    ).fetchall()
    assert {s: (n, g) for s, n, g in counts} == {
        s: (rec["samples"], rec["groups"]) for s, rec in r.manifest.to_json()["splits"].items() if rec["samples"]
    }
    shared = con.execute(
        f"SELECT group_value FROM '{glob}' GROUP BY group_value HAVING count(DISTINCT split) > 1"
    ).fetchall()
    assert shared == []
    joined = con.execute(
        f"SELECT s.key, i.title FROM '{r.path}/train.parquet' s "
        f"JOIN '{cat}/versions/{vid}/index.parquet' i USING (key) ORDER BY s.key"
    ).fetchall()
    assert [k for k, _ in joined] == _keys(load_split(cat, vid, "by-session/train"))


# -- properties over real catalogs -----------------------------------------------------------------


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    salt=st.text(max_size=6),
    by=st.sampled_from(["player", "session_id", "title", "conditions.track", "build"]),
    weights=st.lists(st.integers(1, 9), min_size=1, max_size=4),
)
def test_any_parameters_give_disjoint_complete_checkable_split_sets(catalog, salt, by, weights):
    cat, vid = catalog
    names = ["train", "val", "test", "extra"][: len(weights)]
    ratios = ",".join(f"{n}={w / sum(weights)!r}" for n, w in zip(names, weights))
    name = "p-" + sha256_bytes(f"{salt}|{by}|{ratios}".encode())[:16]
    r = make_split(cat, vid, name, SplitOptions(by=by, ratios=ratios, salt=salt))
    owner: dict[str, str] = {}
    keys = []
    for split in r.manifest.to_json()["splits"]:
        table = load_split(cat, vid, f"{name}/{split}")
        for g in set(table["group_value"].to_pylist()):
            assert owner.setdefault(g, split) == split
        keys += _keys(table)
    assert sorted(keys) == sorted(row["key"] for row in index_rows(cat, vid))
    assert check_split(cat, vid, name).ok


def test_check_catches_a_moved_sample_and_a_damaged_file(catalog, tmp_path):
    cat, vid = catalog
    folder = Path(make_split(cat, vid, "tamper", SplitOptions(by="session_id", ratios="train=0.5,val=0.5")).path)
    doc = json.loads((folder / "manifest.json").read_bytes())
    train, val = pq.read_table(folder / "train.parquet"), pq.read_table(folder / "val.parquet")
    moved = train.slice(0, 1)
    moved = moved.set_column(moved.schema.get_field_index("split"), "split", pa.array(["val"]))
    # a careful forger: files rewritten and the manifest's file hashes and own hash updated to match
    files = {"train": train.slice(1), "val": pa.concat_tables([val, moved])}
    for split, table in files.items():
        data = table_bytes(table)
        (folder / f"{split}.parquet").write_bytes(data)
        doc["splits"][split].update(sha256=sha256_bytes(data), bytes=len(data))
    sealed = SplitManifest.from_json({**doc, "hash": ""}, "forged").sealed().to_json()
    moved_folder = folder.parent / sealed["hash"]
    folder.rename(moved_folder)  # the forger keeps the content-addressed layout and repoints the set
    folder = moved_folder
    (folder / "manifest.json").write_bytes(pretty_json(sealed))
    (folder.parent.parent / "tamper.json").write_bytes(
        pretty_json({"format": "dsbuild.splitref/1", "hash": sealed["hash"]})
    )
    result = check_split(cat, vid, "tamper")
    assert not result.ok
    assert any("differs from the rule" in p for p in result.problems)
    assert any("more than one split" in p for p in result.problems)  # its session is now in both
    (folder / "val.parquet").write_bytes(b"garbage")
    result = check_split(cat, vid, "tamper")
    assert any("does not match the sha256" in p for p in result.problems)
    # one replaced by a larger file is refused at its recorded size, unread (a 200 MB one was read whole)
    (folder / "val.parquet").write_bytes(b"x" * (doc["splits"]["val"]["bytes"] * 50))
    from dsbuild.core.errors import LineageError

    with pytest.raises(LineageError, match=f"larger than the limit of {doc['splits']['val']['bytes']} bytes"):
        load_split(cat, vid, "tamper/val")


# -- groups, strata, pins --------------------------------------------------------------------------


def test_sessions_without_the_group_field_are_unassigned_never_trained_on(partial):
    cat, vid = partial
    r = make_split(cat, vid, "track", SplitOptions(by="conditions.track", ratios="train=0.5,test=0.5"))
    un = r.manifest.to_json()["unassigned"]
    assert un["sessions"] == ["s-c"] and un["samples"] > 0
    assert any("unassigned" in w for w in r.warnings)
    keys = [k for s in ("train", "test") for k in _keys(load_split(cat, vid, f"track/{s}"))]
    assert keys and not [k for k in keys if k.startswith("s-c")]
    assert (
        r.manifest.to_json()["totals"]["assigned_samples"] + un["samples"] == r.manifest.to_json()["totals"]["samples"]
    )
    with pytest.raises(UsageError, match="no session of version"):
        make_split(cat, vid, "nope", SplitOptions(by="conditions.weather"))


def test_stratify_reaches_every_split_where_a_stratum_has_enough_groups(partial, catalog):
    cat, vid = catalog
    r = make_split(cat, vid, "strat", SplitOptions(by="session_id", stratify="title", ratios="train=0.5,val=0.5"))
    st_ = r.manifest.to_json()["stratification"]
    for rep in st_["strata"].values():
        assert rep["groups"] >= 2 and rep["missing"] == [] and all(rep["per_split"].values())
    assert check_split(cat, vid, "strat").ok
    pcat, pvid = partial
    small = make_split(pcat, pvid, "strat", SplitOptions(by="player", stratify="title", ratios="train=0.5,test=0.5"))
    rep = small.manifest.to_json()["stratification"]
    assert "Sky Rally" in rep["uncovered"]  # one group cannot reach two splits: reported
    assert any("Sky Rally" in w for w in small.warnings)


def test_a_title_with_no_group_of_its_own_is_reported_when_it_misses_a_split(tmp_path):
    """Every player's sessions are mostly Dungeon Drift; one also played Kart Storm once. Kart Storm is
    no group's stratum, so stratification cannot place it: the split used to report every stratum
    covered while Kart Storm was missing from a split (validate's coverage check then failed)."""
    video = VideoSpec(160, 120, 30, 30)
    specs = [SessionSpec(f"dd-{p}-{k}", "Dungeon Drift", f"p-{p}", video) for p in range(4) for k in range(2)]
    specs.append(SessionSpec("ks-0", "Kart Storm", "p-0", video))
    generate(tmp_path / "captures", sessions=len(specs), seconds=1.0, seed=5, specs=specs)
    r = convert(
        tmp_path / "captures", tmp_path / "catalog", ConvertConfig(clip_seconds=1.0), executor=ExecutorSpec(workers=1)
    )
    split = make_split(
        tmp_path / "catalog", r.version_id, "s", SplitOptions(by="player", stratify="title", ratios="train=0.5,val=0.5")
    )
    assert split.manifest.to_json()["stratification"]["uncovered"] == []  # no stratum is missing...
    assert any("'Kart Storm' reaches no sample of split(s)" in w for w in split.warnings)  # ...but said


def test_a_split_whose_sample_share_is_far_from_its_ratio_is_warned_about(whale):
    """Asked 0.8/0.1/0.1 of a catalog one player dominates, the split used to report its table and no
    warning although a split held far more or fewer samples than asked."""
    args = ("split", whale, "--name", "main", "--ratios", "train=0.8,val=0.1,test=0.1")
    doc = run_json(*args)
    off = {
        s: (x["requested"], x["ratio_samples"])
        for s, x in doc["splits"].items()
        if x["groups"] and abs(x["ratio_samples"] - x["requested"]) > SAMPLE_SHARE_TOLERANCE
    }
    assert off  # the whale's split, at least
    stderr = run(*args).stderr
    for split, (requested, got) in off.items():
        line = f"split {split!r}: sample share {got:.3f}, requested {requested:.3f}"
        assert sum(w.startswith(line) for w in doc["warnings"]) == 1
        assert f"warning {line}" in stderr
    assert sum("sample share" in w for w in doc["warnings"]) == len(off)


def test_check_passes_a_split_set_stored_before_a_warning_was_added(whale):
    """Warnings comment on the data; they are not the rule: a split set that an older dsbuild stored
    without the sample share warning still matches its rule."""
    make_split(whale, None, "older", SplitOptions(ratios="train=0.8,val=0.1,test=0.1"))
    stored = open_split(whale, None, "older")
    older = dataclasses.replace(
        stored.manifest, warnings=tuple(w for w in stored.manifest.warnings if "sample share" not in w)
    ).sealed()
    assert older.warnings != stored.manifest.warnings
    files = {stored.manifest.splits[s].file: stored.file_bytes(s) for s in stored.splits}
    publish_split_set(Catalog.open(whale), stored.version_id, "older", files, older, force=True)
    run("split", whale, "--name", "older", "--check")


def test_pinned_test_set_never_changes_whatever_the_ratios(catalog, tmp_path):
    cat, vid = catalog
    players = sorted({row["player"] for row in index_rows(cat, vid)})
    pin = tmp_path / "frozen.txt"
    pin.write_text(f"# frozen evaluation players\n{players[0]}\n\n")
    pinned_keys = None
    for i, ratios in enumerate(["train=0.8,val=0.1,test=0.1", "train=0.5,val=0.4,test=0.1", "train=0.2,test=0.8"]):
        r = make_split(cat, vid, f"pin{i}", SplitOptions(ratios=ratios, pins=[("test", pin)]))
        table = load_split(cat, vid, f"pin{i}/test")
        assert set(table["group_value"].to_pylist()) == {players[0]}
        assert r.manifest.to_json()["splits"]["test"]["pinned"] and r.manifest.to_json()["parameters"]["pins"]["test"][
            "groups"
        ] == [players[0]]
        pinned_keys = pinned_keys or _keys(table)
        assert _keys(table) == pinned_keys
        assert check_split(cat, vid, f"pin{i}").ok


def test_pinned_values_are_compared_in_nfc_like_group_values(tmp_path):
    """A pin file typed on another system (José decomposed) names the same player as the captures."""
    import unicodedata

    video = VideoSpec(160, 120, 30, 30)
    composed = unicodedata.normalize("NFC", "José")
    specs = [SessionSpec(f"s-{i}", "Kart Storm", composed if i == 0 else f"p-{i}", video) for i in range(3)]
    generate(tmp_path / "captures", sessions=3, seconds=1.0, seed=5, specs=specs)
    r = convert(
        tmp_path / "captures", tmp_path / "catalog", ConvertConfig(clip_seconds=1.0), executor=ExecutorSpec(workers=1)
    )
    pin = tmp_path / "pin.txt"
    pin.write_text(unicodedata.normalize("NFD", "José") + "\n")
    make_split(tmp_path / "catalog", r.version_id, "p", SplitOptions(ratios="train=0.5,test=0.5", pins=[("test", pin)]))
    assert set(load_split(tmp_path / "catalog", r.version_id, "p/test")["group_value"].to_pylist()) == {composed}


@pytest.mark.parametrize(
    "players, pin_text, pinned",
    [
        # pin lines were stripped: " Alice" pinned the other player "Alice"
        ([" Alice", "Alice", "Bob", "Cy"], "# the held-out player\n Alice\n\n", {" Alice"}),
        # '#' starts a comment line, so a player called "#7" could not be pinned at all: a backslash escapes it
        (["#7", "\\x", "Bob", "Cy"], "# held out\n\\#7\n\\\\x\n", {"#7", "\\x"}),
    ],
)
def test_a_pin_line_is_its_group_value_exactly(tmp_path, players, pin_text, pinned):
    video = VideoSpec(160, 120, 30, 30)
    specs = [SessionSpec(f"s-{i}", "Kart Storm", p, video) for i, p in enumerate(players)]
    generate(tmp_path / "captures", sessions=4, seconds=1.0, seed=5, specs=specs)
    r = convert(
        tmp_path / "captures", tmp_path / "catalog", ConvertConfig(clip_seconds=1.0), executor=ExecutorSpec(workers=1)
    )
    pin = tmp_path / "pin.txt"
    pin.write_text(pin_text)
    make_split(tmp_path / "catalog", r.version_id, "p", SplitOptions(ratios="train=0.5,test=0.5", pins=[("test", pin)]))
    assert set(load_split(tmp_path / "catalog", r.version_id, "p/test")["group_value"].to_pylist()) == pinned


def test_unknown_pinned_group_is_one_clear_line_and_exit_2(catalog, tmp_path):
    cat, vid = catalog
    pin = tmp_path / "pin.txt"
    pin.write_text("nobody-1\nnobody-2\n")
    with pytest.raises(UsageError, match="2 group value") as e:
        make_split(cat, vid, "badpin", SplitOptions(pins=[("test", pin)]))
    assert "nobody-1" in str(e.value)
    assert not (cat / "splits" / vid / "badpin").exists()


def test_a_pin_file_that_is_a_fifo_or_too_large_is_refused_without_reading_it(catalog, tmp_path):
    """The size limit was checked with stat (0 for a FIFO or device): a FIFO hung the command until
    killed, a device was read until memory ran out."""
    import os

    from dsbuild.split.params import MAX_PIN_BYTES

    cat, vid = catalog
    fifo, big = tmp_path / "pins.fifo", tmp_path / "big.txt"
    os.mkfifo(fifo)
    with open(big, "wb") as f:
        f.truncate(MAX_PIN_BYTES + 1)  # sparse: no bytes written
    for path, message in ((fifo, "FIFO"), (big, "larger than the limit")):
        with pytest.raises(UsageError, match=message):
            make_split(cat, vid, "badpin", SplitOptions(pins=[("test", path)]))


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(ratios="train=0.8,val=0.3"), "sum to"),
        (dict(by="favourite_colour"), "not a session field"),
        (dict(by="conditions.nothing"), "no session of version"),
        (dict(stratify="conditions.nothing"), "no session of version"),
        (dict(pins=[("test", Path("/nonexistent/pins.txt"))]), "does not exist"),
        (dict(pins=[("tset", ["p-1"])]), "not one of the splits"),
        (dict(from_split="ffffffff/main"), "no version or tag"),
    ],
)
def test_bad_options_are_one_clear_usage_error(catalog, options, message):
    cat, vid = catalog
    with pytest.raises(UsageError, match=message):
        make_split(cat, vid, "bad", SplitOptions(**options))


# -- growth and carry-over -------------------------------------------------------------------------


@pytest.mark.parametrize("by", ["player", "session_id"])
def test_adding_captures_never_moves_a_group(grown, by):
    cat, v1, v2 = grown
    opts = SplitOptions(by=by, ratios="train=0.6,val=0.2,test=0.2", stratify=None)
    old = make_split(cat, v1, f"grow-{by}", opts)
    new = make_split(cat, v2, f"grow-{by}", opts)
    d = diff_split_sets(open_split(cat, v1, f"grow-{by}"), open_split(cat, v2, f"grow-{by}"))
    assert d["groups"]["moved"] == {} and d["groups"]["removed"] == {}
    assert d["samples"]["moved"] == 0 and d["samples"]["removed"] == 0
    assert (
        d["samples"]["added"]
        == new.manifest.to_json()["totals"]["samples"] - old.manifest.to_json()["totals"]["samples"]
    )
    if by == "session_id":
        assert sorted(d["groups"]["added"]) == sorted(f"{p}-12-{i:04d}" for i, p in enumerate(["ks", "dd", "sr", "ks"]))


def test_from_split_carries_old_assignments_and_reports_new_groups(grown, tmp_path):
    cat, v1, v2 = grown
    frozen = min(row["session_id"] for row in index_rows(cat, v1))
    make_split(
        cat,
        v1,
        "carry",
        SplitOptions(by="session_id", ratios="train=0.5,val=0.4,test=0.1", salt="one", pins=[("test", [frozen])]),
    )
    old = open_split(cat, v1, "carry").group_assignment()
    # even with a different salt and ratios, carried groups keep their split; the pinned test set is inherited
    r = make_split(cat, v2, "carry", SplitOptions(from_split="carry", salt="two", ratios="train=0.8,val=0.1,test=0.1"))
    new = open_split(cat, v2, "carry").group_assignment()
    assert {g: new[g] for g in old} == old
    assert {g for g, s in new.items() if s == "test"} == {frozen}
    c = r.manifest.to_json()["carried"]
    assert c["carried_groups"] == len(old) - 1 and c["removed_groups"] == []  # the pinned one is pinned, not carried
    assert set(c["new_groups"]) == set(new) - set(old)
    assert r.manifest.to_json()["parameters"]["from_split"]["version_id"] == v1
    assert r.manifest.to_json()["parameters"]["by"] == "session_id"  # inherited from the old set
    assert check_split(cat, v2, "carry").ok
    again = make_split(
        cat, v2, "carry2", SplitOptions(from_split=f"{v1[:12]}/carry", salt="two", ratios="train=0.8,val=0.1,test=0.1")
    )
    assert again.manifest.to_json()["assignment_id"] == r.manifest.to_json()["assignment_id"]
    with pytest.raises(UsageError, match="groups by session_id, not player"):
        make_split(cat, v2, "carry3", SplitOptions(from_split=f"{v1[:12]}/carry", by="player"))
    # carrying from the very set being replaced wrote a set whose --check could never pass
    with pytest.raises(UsageError, match="is the split set being made"):
        make_split(
            cat,
            v2,
            "carry",
            SplitOptions(from_split=f"{v2[:12]}/carry", ratios="train=0.5,val=0.3,test=0.2"),
            force=True,
        )
    assert check_split(cat, v2, "carry").ok


def test_check_fails_when_the_rule_cannot_be_recomputed_or_differs(grown):
    cat, v1, v2 = grown
    make_split(cat, v1, "gone", SplitOptions(by="session_id", ratios="train=0.5,val=0.5"))
    make_split(cat, v2, "gone", SplitOptions(from_split=f"{v1}/gone"))
    assert check_split(cat, v2, "gone").ok
    assert not check_split(cat, v2, "gone", SplitOptions(ratios="train=0.1,val=0.9")).ok
    old = cat / "splits" / v1 / "gone.json"
    old.rename(cat / "splits" / v1 / "gone.json.moved")
    try:
        result = check_split(cat, v2, "gone")
        assert not result.ok and any(p.startswith("cannot recompute") for p in result.problems)
    finally:
        (cat / "splits" / v1 / "gone.json.moved").rename(old)


def test_nfc_and_nfd_spellings_of_a_player_are_one_group(tmp_path):
    nfc, nfd = unicodedata.normalize("NFC", "José"), unicodedata.normalize("NFD", "José")
    assert nfc != nfd
    video = VideoSpec(160, 120, 30, 30)
    specs = [SessionSpec(f"s-{i}", "Kart Storm", p, video) for i, p in enumerate([nfc, nfd, "ana", "bob", "cy"])]
    generate(tmp_path / "caps", sessions=5, seconds=1.0, seed=3, specs=specs)
    vid = convert(
        tmp_path / "caps", tmp_path / "cat", ConvertConfig(clip_seconds=1.0), executor=ExecutorSpec(workers=1)
    ).version_id
    for salt in ("a", "b", "c", "d"):
        make_split(tmp_path / "cat", vid, f"u{salt}", SplitOptions(by="player", ratios="train=0.5,test=0.5", salt=salt))
        where = {}
        for split in ("train", "test"):
            for row in load_split(tmp_path / "cat", vid, f"u{salt}/{split}").to_pylist():
                where.setdefault(row["session_id"], split)
                assert row["group_value"] == unicodedata.normalize("NFC", row["group_value"])
        assert where["s-0"] == where["s-1"]
        assert check_split(tmp_path / "cat", vid, f"u{salt}").ok


def test_readers_never_see_a_split_set_half_replaced(catalog):
    """While `--force` replaces a split set over and over, concurrent readers always get a complete,
    self-consistent set (old or new), never a file that does not match its manifest or no set at all."""
    import threading

    cat, vid = catalog
    make_split(cat, vid, "swap", SplitOptions(by="session_id", salt="0"))
    stop, errors, reads = threading.Event(), [], [0]

    def read() -> None:
        while not stop.is_set():
            try:
                s = open_split(cat, vid, "swap")
                total = sum(s.table(split, ["key"]).num_rows for split in s.splits)
                assert total == s.manifest.to_json()["totals"]["assigned_samples"]
                reads[0] += 1
            except Exception as e:
                errors.append(repr(e))

    threads = [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(1, 25):
        make_split(cat, vid, "swap", SplitOptions(by="session_id", salt=str(i)), force=True)
    stop.set()
    for t in threads:
        t.join()
    assert errors == [] and reads[0] > 20


def test_a_new_versions_split_set_that_moves_groups_hints_from_split(grown):
    """A new version's split set followed its own rule alone, silently: with other ratios, groups the old
    version held moved between splits (train data into test) and nothing said --from-split."""
    cat, v1, v2 = grown
    run("split", f"{cat}@{v1}", "--name", "hinted", "--by", "session_id", "--ratios", "train=0.5,test=0.5")
    p = run("split", f"{cat}@{v2}", "--name", "hinted", "--by", "session_id", "--ratios", "train=0.1,test=0.9")
    old = open_split(cat, v1, "hinted").group_assignment()
    new = open_split(cat, v2, "hinted").group_assignment()
    moved = [g for g in old if new[g] != old[g]]
    assert moved, "the ratios chosen must move a group for this test to say anything"
    hint = [line for line in p.stderr.splitlines() if line.startswith("hint")]
    assert len(hint) == 1 and f"{len(moved)} of the {len(old)} groups" in hint[0], p.stderr
    assert f"--from-split {v1[:12]}/hinted --force" in hint[0]
    assert (
        run_json("split", f"{cat}@{v2}", "--name", "hinted", "--from-split", f"{v1[:12]}/hinted", "--force")["hints"]
        == []
    )
    assert {g: open_split(cat, v2, "hinted").group_assignment()[g] for g in old} == old
    same = run("split", f"{cat}@{v2}", "--name", "unmoved", "--by", "session_id")  # no earlier set: nothing to say
    assert "hint" not in same.stderr
