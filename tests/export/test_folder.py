"""Export folders: refused unless empty or the same export, deterministic, resumable, and the command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsbuild.core.errors import MissingDependency, UsageError
from dsbuild.export import export
from dsbuild.export.mds import streaming_dataset

from .conftest import TARGET


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): (p.read_bytes() if not p.is_symlink() else str(p.readlink()).encode())
            for p in sorted(root.rglob("*")) if p.is_file() or p.is_symlink()}


@pytest.mark.parametrize("tool", ["mds", "energon"])
def test_an_interrupted_export_finishes_on_rerun_with_the_bytes_of_a_clean_one(tool, export_catalog, exported, tmp_path):
    cat, _ = export_catalog

    def stop(done: int, total: int) -> None:
        if done >= 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export(f"{cat}@v1", tmp_path / "x", to=tool, split="main", target_bytes=TARGET, progress=stop)
    marker = json.loads((tmp_path / "x" / ".dsbuild-export.json").read_text())
    assert marker["complete"] is False
    r = export(f"{cat}@v1", tmp_path / "x", to=tool, split="main", target_bytes=TARGET)
    assert not r.existed and r.files_kept > 0
    assert _tree(tmp_path / "x").keys() == _tree(exported(tool)).keys()
    clean = _tree(exported(tool))
    for name, data in _tree(tmp_path / "x").items():
        if not (tool == "energon" and name.endswith(".tar")):  # links: relative to each folder
            assert data == clean[name], name
    again = export(f"{cat}@v1", tmp_path / "x", to=tool, split="main", target_bytes=TARGET)
    assert again.existed and again.files_written == 0


def test_export_refuses_a_folder_that_holds_something_else(export_catalog, exported, tmp_path):
    cat, _ = export_catalog
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty and is not an earlier export") as e:
        export(f"{cat}@v1", tmp_path / "busy", to="wids")
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="holds a mds export of version .* split main, not a hf export"):
        export(f"{cat}@v1", exported("mds"), to="hf", split="main")
    with pytest.raises(UsageError, match="not a wids export .* split main/val"):
        export(f"{cat}@v1", exported("wids"), to="wids", split="main/val")
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
    run = subprocess.run([str(dsbuild), "export", f"{cat}@v1", str(tmp_path / "w"), "--to", "wids",
                          "--split", "main/test", "--json"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["version_id"] == vid and report["splits"] == {"test": 2} and report["tool"] == "wids"
    assert (tmp_path / "w" / "test.json").is_file()


def test_without_a_split_set_the_version_is_the_split_train_and_every_shard_is_linked(export_catalog, expected,
                                                                                   tmp_path):
    cat, _ = export_catalog
    r = export(f"{cat}@v1", tmp_path / "w", to="wids", target_bytes=TARGET)
    assert r.splits == {"train": sum(len(keys) for keys in expected.values())}
    tars = sorted((tmp_path / "w" / "shards" / "train").glob("*.tar"))
    assert tars and all(t.is_symlink() for t in tars) and r.linked_shards == len(tars)
    assert r.bytes_written < 4096  # only the shard list: no shard byte copied
