"""Permission denied, on either side: unreadable captures are quarantined with the reason (never
skipped silently, never a host path in the manifest); an unwritable catalog is one storage error that
leaves nothing behind."""

from __future__ import annotations

import json
import shutil

from dsbuild.samples.synthetic import generate
from tests.helpers import manifest, unprivileged

CONVERT = """
import json, sys
from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.errors import DsbuildError
try:
    r = convert(sys.argv[1], sys.argv[2], ConvertConfig(clip_seconds=2.0))
    print(json.dumps(r.to_json()))
except DsbuildError as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)}))
"""


def test_unreadable_folders_and_files_quarantine_their_sessions(tmp_path):
    caps = tmp_path / "caps"
    paths = generate(caps, sessions=3, seconds=2, seed=4)
    (paths[1] / "actions.jsonl").chmod(0)
    paths[2].chmod(0)
    try:
        out = unprivileged(CONVERT, caps, tmp_path / "cat")
    finally:
        paths[2].chmod(0o755)
    result = json.loads(out.stdout)
    reasons = {q["session"]: (q["path"], q["reason"]) for q in result["quarantined"]}
    assert result["sessions"] == 1 and len(reasons) == 2, out.stderr
    assert reasons[paths[2].name] == (paths[2].name, "folder cannot be read (Permission denied)")
    path, reason = reasons[paths[1].name]
    assert path == f"{paths[1].name}/actions.jsonl" and "Permission denied" in reason
    m = manifest(tmp_path / "cat", result["version_id"])
    assert str(tmp_path) not in json.dumps(m)  # paths are relative to the capture root, never host paths


def test_a_read_only_catalog_is_one_storage_error_and_leaves_nothing_behind(tmp_path, captures):
    caps = tmp_path / "caps"
    shutil.copytree(captures, caps)
    cat = tmp_path / "cat"
    first = json.loads(unprivileged(CONVERT, caps, cat).stdout)
    before = sorted(p.relative_to(cat).as_posix() for p in cat.rglob("*"))
    shutil.copytree(captures / sorted(p.name for p in captures.iterdir())[0], caps / "extra-session")
    doc = json.loads((caps / "extra-session" / "session.json").read_text())
    (caps / "extra-session" / "session.json").write_text(json.dumps({**doc, "session_id": "extra-1"}))
    for p in [cat, *cat.rglob("*")]:
        if p.is_dir():
            p.chmod(0o555)
    try:
        out = json.loads(unprivileged(CONVERT, caps, cat).stdout)
    finally:
        for p in [cat, *cat.rglob("*")]:
            if p.is_dir():
                p.chmod(0o755)
    assert out["error"] in ("StorageError", "LineageError") and "Permission denied" in out["message"], out
    assert sorted(p.relative_to(cat).as_posix() for p in cat.rglob("*")) == before
    assert any(first["version_id"] in p for p in before)


def test_a_shard_this_user_may_not_read_is_exit_3_not_damage(tmp_path, wds_catalog):
    """verify and validate used to report a permission problem as a damaged shard (exit 1, "rejected")."""
    cat = tmp_path / "cat"
    shutil.copytree(wds_catalog[0], cat)
    shard = next((cat / "shards").rglob("*.tar"))
    shard.chmod(0)
    for command in ("verify", "validate"):
        p = unprivileged("from dsbuild.cli.app import main; main()", command, cat)
        assert p.returncode == 3, (command, p.returncode, p.stderr)
        assert shard.name in p.stderr and "Permission denied" in p.stderr and "altered" not in p.stderr
