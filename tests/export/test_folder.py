"""Export folders: refused unless empty or the same export, deterministic, resumable, and the command."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsbuild.core.errors import MissingDependency, UsageError
from dsbuild.export import TOOLS, export
from dsbuild.export.mds import streaming_dataset

from .conftest import TARGET


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes() if not p.is_symlink() else str(p.readlink()).encode())
        for p in sorted(root.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def _same_as_clean(got: Path, clean: Path) -> None:
    """The bytes of a clean export; links (relative to each folder) reach the same catalog shards."""
    mine, theirs = _tree(got), _tree(clean)
    assert mine.keys() == theirs.keys()
    for name, data in mine.items():
        if (got / name).is_symlink():
            assert (got / name).resolve() == (clean / name).resolve(), name
        else:
            assert data == theirs[name], name


def _interrupt(cat: Path, dest: Path, tool: str) -> None:
    def stop(done: int, total: int) -> None:
        if done >= 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export(f"{cat}@v1", dest, to=tool, split="main", target_bytes=TARGET, progress=stop)


@pytest.mark.parametrize("tool", TOOLS)
def test_an_interrupted_export_leaves_its_folder_empty_and_finishes_on_rerun_with_the_bytes_of_a_clean_one(
    tool, export_catalog, exported, tmp_path
):
    """Every tool's export is built beside DEST and renamed into place whole: a reader globbing DEST after
    an interruption finds nothing, not a smaller dataset."""
    cat, _ = export_catalog
    (tmp_path / "x").mkdir()  # an empty folder made for the export is replaced by it
    _interrupt(cat, tmp_path / "x", tool)
    assert not any((tmp_path / "x").iterdir())
    marker = json.loads((tmp_path / ".x.dsbuild-partial" / ".dsbuild-export.json").read_text())
    assert marker["complete"] is False
    r = export(f"{cat}@v1", tmp_path / "x", to=tool, split="main", target_bytes=TARGET)
    # wids and energon name the tars they write by their hash: they write them again rather than keeping them
    assert not r.existed and (r.files_kept > 0 or tool in ("wids", "energon"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]
    _same_as_clean(tmp_path / "x", exported(tool))
    again = export(f"{cat}@v1", tmp_path / "x", to=tool, split="main", target_bytes=TARGET)
    assert again.existed and again.files_written == 0


def test_an_export_interrupted_inside_its_folder_by_an_earlier_dsbuild_finishes(export_catalog, exported, tmp_path):
    """Before exports were built beside the folder, an interrupted one stayed in it (marker ``complete:
    false``): the rerun takes it over instead of refusing the folder or failing on the final rename."""
    cat, _ = export_catalog
    _interrupt(cat, tmp_path / "x", "mds")
    (tmp_path / ".x.dsbuild-partial").rename(tmp_path / "x")  # the old layout
    r = export(f"{cat}@v1", tmp_path / "x", to="mds", split="main", target_bytes=TARGET)
    assert r.files_kept > 0 and sorted(p.name for p in tmp_path.iterdir()) == ["x"]
    _same_as_clean(tmp_path / "x", exported("mds"))


def test_a_link_to_an_empty_folder_gets_the_export_in_that_folder(export_catalog, tmp_path):
    cat, _ = export_catalog
    (tmp_path / "disk").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "disk")
    export(f"{cat}@v1", tmp_path / "link", to="wids", split="main/test")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "disk" / "test.json").is_file()


def test_export_refuses_a_folder_that_holds_something_else(export_catalog, exported, tmp_path):
    cat, _ = export_catalog
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty and is not an earlier export") as e:
        export(f"{cat}@v1", tmp_path / "busy", to="wids")
    assert "\n" not in str(e.value)
    with pytest.raises(
        UsageError, match=r"holds a mds export of version .* split main \(set .*\) in files of .*, not a hf export"
    ):
        export(f"{cat}@v1", exported("mds"), to="hf", split="main")
    with pytest.raises(UsageError, match="not a wids export .* split main/val"):
        export(f"{cat}@v1", exported("wids"), to="wids", split="main/val")
    _interrupt(cat, tmp_path / "half", "mds")
    with pytest.raises(UsageError, match=r"\.half\.dsbuild-partial: holds a mds export .* not a hf export"):
        export(f"{cat}@v1", tmp_path / "half", to="hf", split="main")
    with pytest.raises(UsageError, match="--to must be one of"):
        export(f"{cat}@v1", tmp_path / "new", to="tfds")
    with pytest.raises(UsageError, match="has no split 'holdout'"):
        export(f"{cat}@v1", tmp_path / "new", to="mds", split="main/holdout")
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine" and not (tmp_path / "new").exists()


def test_a_missing_peer_library_names_the_extra(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    for name in [m for m in sys.modules if m == "streaming" or m.startswith("streaming.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(MissingDependency, match=r"pip install 'dsbuild\[peers\]'"):
        streaming_dataset()


def test_the_export_command_prints_the_report(export_catalog, tmp_path):
    cat, vid = export_catalog
    dsbuild = Path(sys.executable).with_name("dsbuild")
    run = subprocess.run(
        [str(dsbuild), "export", f"{cat}@v1", str(tmp_path / "w"), "--to", "wids", "--split", "main/test", "--json"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["version_id"] == vid and report["splits"] == {"test": 2} and report["tool"] == "wids"
    assert (tmp_path / "w" / "test.json").is_file()


@pytest.mark.parametrize("tool", ["wids", "energon"])
@pytest.mark.parametrize("damage", ["removed", "cut short"])
def test_a_shard_that_would_be_linked_must_be_whole(export_catalog, tmp_path, tool, damage):
    """wids and energon link a WebDataset catalog's shards: a missing one gave exit 0, "1 shards linked"
    and a complete marker over a link to nothing (hf, mds and litdata read the bytes and failed)."""
    cat, _ = export_catalog
    copy = tmp_path / "cat"
    shutil.copytree(cat, copy)
    shard = sorted((copy / "shards").rglob("*.tar"))[0]
    if damage == "removed":
        shard.unlink()
    else:
        shard.write_bytes(shard.read_bytes()[:-1])
    dsbuild = Path(sys.executable).with_name("dsbuild")
    run = subprocess.run(
        [str(dsbuild), "export", f"{copy}@v1", str(tmp_path / "out"), "--to", tool], capture_output=True, text=True
    )
    assert run.returncode == 3 and shard.name in run.stderr and "dsbuild verify" in run.stderr, run.stderr
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_a_second_export_into_a_folder_being_written_is_refused(export_catalog, tmp_path):
    """Two exports into one DEST at once shared the partial folder: one failed on the other's files, or
    finished with a marker that listed the other's temp file."""
    import fcntl
    import os

    cat, _ = export_catalog
    dest = tmp_path / "out"
    partial = tmp_path / ".out.dsbuild-partial"
    partial.mkdir()
    dsbuild = Path(sys.executable).with_name("dsbuild")
    fd = os.open(partial / ".dsbuild-export.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a running export holds it
    try:
        run = subprocess.run(
            [str(dsbuild), "export", f"{cat}@v1", str(dest), "--to", "hf"], capture_output=True, text=True
        )
        assert run.returncode == 3 and "another export into it is running" in run.stderr, run.stderr
    finally:
        os.close(fd)
    run = subprocess.run([str(dsbuild), "export", f"{cat}@v1", str(dest), "--to", "hf"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    marker = json.loads((dest / ".dsbuild-export.json").read_text())
    assert not (dest / ".dsbuild-export.lock").exists() and ".dsbuild-export.lock" not in marker["files"]


def test_an_export_into_the_current_folder_is_refused_and_leaves_nothing(export_catalog, tmp_path):
    """The finished export replaces an empty DEST with one rename: with DEST the current folder, the
    user's shell was left in a removed folder that looked empty."""
    cat, _ = export_catalog
    here = tmp_path / "here"
    here.mkdir()
    dsbuild = Path(sys.executable).with_name("dsbuild")
    run = subprocess.run(
        [str(dsbuild), "export", f"{cat}@v1", ".", "--to", "hf"], capture_output=True, text=True, cwd=here
    )
    assert run.returncode == 2 and "is the current folder" in run.stderr, run.stderr
    assert list(here.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["here"]


def test_without_a_split_set_the_version_is_the_split_train_and_every_shard_is_linked(
    export_catalog, expected, tmp_path
):
    cat, _ = export_catalog
    r = export(f"{cat}@v1", tmp_path / "w", to="wids", target_bytes=TARGET)
    assert r.splits == {"train": sum(len(keys) for keys in expected.values())}
    tars = sorted((tmp_path / "w" / "shards" / "train").glob("*.tar"))
    assert tars and all(t.is_symlink() for t in tars) and r.linked_shards == len(tars)
    assert r.bytes_written < 4096  # only the shard list: no shard byte copied


@pytest.mark.parametrize(
    "args, says",
    [
        (["--split", "main/tarin"], "did you mean 'train'"),  # as every other split name typo
        (["--split", "main/"], "use NAME/SPLIT"),
        (["--split-set", "main/train"], "--split-set 'main/train': use NAME"),  # was taken as one split
    ],
)
def test_the_export_command_refuses_a_split_it_cannot_mean(export_catalog, tmp_path, args, says):
    cat, _ = export_catalog
    dsbuild = Path(sys.executable).with_name("dsbuild")
    run = subprocess.run(
        [str(dsbuild), "export", f"{cat}@v1", str(tmp_path / "x"), "--to", "wids", *args],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and says in run.stderr, run.stderr
    assert not (tmp_path / "x").exists()


def test_an_empty_split_is_exported_with_a_warning(export_catalog, tmp_path):
    """Every tool refuses to open an empty split (LitData: no chunks, Mosaic: no samples, datasets:
    unknown split): the export said nothing."""
    cat, _vid = export_catalog
    mine = tmp_path / "cat"
    shutil.copytree(cat, mine)
    (tmp_path / "pins.txt").write_text("p-0\np-1\np-2\n")  # every player pinned to train: val is empty
    dsbuild = Path(sys.executable).with_name("dsbuild")
    subprocess.run(
        [
            str(dsbuild),
            "split",
            str(mine),
            "--name",
            "lop",
            "--by",
            "player",
            "--ratios",
            "train=0.5,val=0.5",
            "--pin",
            f"train={tmp_path / 'pins.txt'}",
            "--quiet",
        ],
        check=True,
    )
    run = subprocess.run(
        [str(dsbuild), "export", f"{mine}@v1", str(tmp_path / "x"), "--to", "mds", "--split-set", "lop"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "warning split 'val' is empty: mds cannot open it" in run.stderr
    as_json = subprocess.run(
        [str(dsbuild), "export", f"{mine}@v1", str(tmp_path / "y"), "--to", "mds", "--split-set", "lop", "--json"],
        capture_output=True,
        text=True,
    )
    assert json.loads(as_json.stdout)["warnings"] == ["split 'val' is empty: mds cannot open it"]  # (was lost)


def _dsbuild(*args, cwd=None):
    return subprocess.run(
        [str(Path(sys.executable).with_name("dsbuild")), *map(str, args)], capture_output=True, text=True, cwd=cwd
    )


def test_a_destination_the_export_cannot_be_is_refused_before_any_work(export_catalog, tmp_path):
    """A URL was written to a local folder named like it ("./s3:/bucket/x") and reported as a success; "/"
    was exit 70; a folder under a file was exit 3."""
    cat, _ = export_catalog
    (tmp_path / "afile").write_text("x")
    for dest, says in [
        ("s3://bucket/exports/x", "an export is a local folder"),
        ("/", "a file system's root cannot be an export folder"),
        (tmp_path / "afile" / "sub", "afile: is a file, not a folder"),
    ]:
        p = _dsbuild("export", f"{cat}@v1", dest, "--to", "wids", cwd=tmp_path)
        assert p.returncode == 2 and says in p.stderr, (dest, p.returncode, p.stderr)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["afile"]  # nothing made, no partial left
    for url in (f"file://{tmp_path}/x", f"file:{tmp_path}/y", f"FILE://{tmp_path}/z"):  # (file: made a folder
        assert _dsbuild("export", f"{cat}@v1", url, "--to", "wids", cwd=tmp_path).returncode == 0  # "file:" here)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["afile", "x", "y", "z"]


def test_a_split_name_hf_cannot_load_is_refused_before_the_folder_is_claimed(export_catalog, tmp_path):
    """The check ran after the partial folder was claimed: the refused export left it behind, and every
    later export into the same folder was refused."""
    cat, _ = export_catalog
    mine = tmp_path / "cat"
    shutil.copytree(cat, mine)
    assert (
        _dsbuild(
            "split", mine, "--name", "odd", "--by", "player", "--ratios", "train=0.5,hold-out=0.5", "--quiet"
        ).returncode
        == 0
    )
    p = _dsbuild("export", f"{mine}@v1", tmp_path / "out", "--to", "hf", "--split-set", "odd")
    assert p.returncode == 2 and "'hold-out'" in p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["cat"]
    assert _dsbuild("export", f"{mine}@v1", tmp_path / "out", "--to", "hf", "--split", "odd/train").returncode == 0


def test_a_lock_left_in_a_complete_export_is_removed_and_a_replaced_split_set_is_named(export_catalog, tmp_path):
    """An interrupt between the final rename and the lock's removal left the lock for good; a split set
    made again with --force was refused as "holds X, not X" (the same words twice)."""
    cat, _ = export_catalog
    mine = tmp_path / "cat"
    shutil.copytree(cat, mine)
    dest = tmp_path / "out"
    assert _dsbuild("export", f"{mine}@v1", dest, "--to", "mds", "--split-set", "main").returncode == 0
    (dest / ".dsbuild-export.lock").write_text("")
    again = _dsbuild("export", f"{mine}@v1", dest, "--to", "mds", "--split-set", "main")
    assert again.returncode == 0 and "already complete" in again.stdout
    assert not (dest / ".dsbuild-export.lock").exists()
    assert _dsbuild("split", mine, "--name", "main", "--by", "session_id", "--force", "--quiet").returncode == 0
    p = _dsbuild("export", f"{mine}@v1", dest, "--to", "mds", "--split-set", "main")
    assert p.returncode == 2
    held, wanted = p.stderr.split("holds ", 1)[1].split(", not ", 1)
    assert "split main (set " in held and held.split(";")[0] != wanted.split(";")[0]


@pytest.mark.parametrize(
    "how, name", [(["-t", "tmpfs", "-o", "size=4m", "tmpfs"], "vol"), (["--bind"], "vol"), (["--bind"], "vol é")]
)
def test_an_empty_mount_point_is_refused_before_any_work(export_catalog, tmp_path, how, name):
    """The export was built beside DEST on the parent's file system, then the rename into the mount point
    failed (EBUSY), after all the work, on every run; a bind mount (same file system) too, and (mountinfo
    decoded as escaped text) one whose path is not ASCII."""
    cat, _ = export_catalog
    vol = tmp_path / name
    vol.mkdir()
    if how == ["--bind"]:
        (tmp_path / "elsewhere").mkdir()
        how = ["--bind", str(tmp_path / "elsewhere")]
    if subprocess.run(["mount", *how, str(vol)], capture_output=True).returncode:
        pytest.skip("cannot mount here (needs root)")
    try:
        p = _dsbuild("export", f"{cat}@v1", vol, "--to", "mds")
        assert p.returncode == 2 and "is a mount point" in p.stderr and str(vol / "export") in p.stderr
        assert sorted(x.name for x in tmp_path.iterdir() if x.name != "elsewhere") == [name]  # no partial
        assert _dsbuild("export", f"{cat}@v1", vol / "export", "--to", "mds").returncode == 0
    finally:
        subprocess.run(["umount", str(vol)], check=True)


@pytest.mark.parametrize("tool", ["mds", "energon"])
def test_a_complete_export_whose_files_were_damaged_is_repaired_on_rerun(tool, export_catalog, exported, tmp_path):
    """A finished export records each file's size; a rerun over one with a file missing or of another size
    writes those again (it used to say "already complete" and leave the damage)."""
    cat, _ = export_catalog
    dest = tmp_path / "x"
    export(f"{cat}@v1", dest, to=tool, split="main", target_bytes=TARGET)
    files = [p for p in sorted(dest.rglob("*")) if (p.is_file() or p.is_symlink()) and p.name != ".dsbuild-export.json"]
    gone = next((p for p in files if p.is_symlink()), files[0])  # energon links the catalog's shards
    cut = next(p for p in reversed(files) if not p.is_symlink() and p != gone)
    gone.unlink()
    cut.write_bytes(cut.read_bytes()[:-1])
    r = export(f"{cat}@v1", dest, to=tool, split="main", target_bytes=TARGET)
    assert not r.existed and r.repaired == 2 and r.files_kept > 0
    _same_as_clean(dest, exported(tool))
    again = export(f"{cat}@v1", dest, to=tool, split="main", target_bytes=TARGET)
    assert again.existed and again.repaired == 0


def test_the_export_command_says_what_it_repaired(export_catalog, tmp_path):
    cat, _ = export_catalog
    dsbuild = Path(sys.executable).with_name("dsbuild")
    cmd = [str(dsbuild), "export", f"{cat}@v1", str(tmp_path / "h"), "--to", "hf", "--split-set", "main"]
    assert subprocess.run(cmd, capture_output=True, text=True).returncode == 0
    next(p for p in sorted((tmp_path / "h").rglob("*.parquet"))).unlink()
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "repaired: 1 file missing or of another size, written again" in run.stdout
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0 and "already complete" in again.stdout


def test_an_export_with_another_file_size_is_refused_not_mixed_into_the_folder(export_catalog, tmp_path):
    """The size of the files written was not in the marker: resuming (or repairing) an export with another
    target wrote files of two layouts into one folder."""
    cat, _ = export_catalog
    _interrupt(cat, tmp_path / "x", "mds")
    with pytest.raises(UsageError, match=f"in files of {TARGET:,} bytes"):
        export(f"{cat}@v1", tmp_path / "x", to="mds", split="main", target_bytes=2 * TARGET)
    r = export(f"{cat}@v1", tmp_path / "x", to="mds", split="main", target_bytes=TARGET)
    assert r.files_kept > 0
