"""Every way out of a catalog refuses a forged shard, and they agree: ``verify`` reports it (exit 1),
every export, ``shards`` and ``pull`` refuse it in one line naming the shard and the sample (exit 3),
writing nothing, and the loader delivers none of its damaged samples (each counted as corrupt).
The shards are forged as an attacker who can write the catalog would: member headers named ``../``
or ``/``, links to /etc/passwd, FIFOs, setuid bits, 8 GB sizes, a truncated tar, a member hidden in the
end padding; every hash, the index and the manifest re-pinned to match."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from dsbuild.core.errors import CorruptDataError, FormatError
from dsbuild.export import TOOLS, export
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.transfer import transfer
from dsbuild.lineage.verify import verify
from dsbuild.loader import Loader
from tests.cli.clitools import run
from tests.helpers import tree_bytes
from tests.security.conftest import SHARD_CASES

CASES = sorted(SHARD_CASES)


def shard0(cat: Path, vid: str) -> str:
    return Catalog.open(cat).manifest(vid).shards[0].path


def one_line(p) -> str:
    """The one error line of a failed command (``hint:`` may follow it)."""
    lines = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and len(lines[0]) < 600, p.stderr
    return lines[0]


@pytest.mark.parametrize("case", CASES)
def test_verify_exports_pull_and_the_loader_agree_on_a_forged_shard(case, forged, tmp_path):
    cat, vid = forged(case)
    shard = shard0(cat, vid)
    before = tree_bytes(cat)
    report = verify(Catalog.open(cat), vid)
    assert {p.get("shard") for p in report.problems} == {shard}, report.problems
    for tool in TOOLS:
        with pytest.raises(CorruptDataError, match=shard):
            export(str(cat), tmp_path / tool, to=tool)
        assert not (tmp_path / tool).exists()
    with pytest.raises(CorruptDataError, match=shard):
        transfer(Catalog.open(cat), vid, Catalog.open(tmp_path / "copy", create=True))
    assert not Catalog.open(tmp_path / "copy").versions()
    damaged = {r["key"] for r in Catalog.open(cat).index(vid).to_pylist() if r["shard"] == shard}
    loader = Loader(str(cat), decode="bytes", batch_size=2, seed=1)
    try:
        delivered = [k for b in loader for k in b["keys"]]
    except FormatError as e:  # refused at open: the truncated shard's index ranges lie outside it
        assert case == "truncated" and "outside its shard" in str(e), e
    else:
        refused = {k.split(":")[0] for k in loader.stats()["corrupt_keys"]}
        assert refused and refused <= damaged and not set(delivered) & refused, loader.stats()
    assert tree_bytes(cat) == before  # nothing lost or changed in the source
    assert not Path("/tmp/dsbuild-redteam-x.json").exists()


@pytest.mark.parametrize("case", CASES)
def test_dsbuild_shards_refuses_a_forged_shard_in_one_line(case, forged):
    cat, vid = forged(case)
    p = run("shards", cat, check=3)
    assert shard0(cat, vid) in one_line(p) and not p.stdout


@pytest.mark.parametrize("case", ["symlink", "setuid", "truncated"])
def test_the_commands_agree_through_the_dsbuild_executable(case, forged, tmp_path):
    """What the issue found: wids and energon exported these with exit 0; ``pull`` accepted them."""
    cat, vid = forged(case)
    shard = shard0(cat, vid)
    assert shard.split("/")[-1][:12] in run("verify", cat, check=1).stdout
    for args in (
        ("export", cat, tmp_path / "wids", "--to", "wids"),
        ("export", cat, tmp_path / "energon", "--to", "energon"),
        ("pull", cat, tmp_path / "copy"),
    ):
        assert shard in one_line(run(*args, check=3)), args
    assert not any((tmp_path / d).exists() for d in ("wids", "energon", "copy"))


def test_a_clean_catalog_passes_every_way_out(base_catalog, tmp_path):
    cat, vid = base_catalog
    assert verify(Catalog.open(cat), vid).ok
    run("shards", cat)
    run("export", cat, tmp_path / "wids", "--to", "wids")
    transfer(Catalog.open(cat), vid, Catalog.open(tmp_path / "copy", create=True))
    loader = Loader(str(cat), decode="bytes", batch_size=2)
    assert sum(len(b["keys"]) for b in loader) == Catalog.open(cat).manifest(vid).index.rows
    assert loader.stats()["corrupt"] == 0
    with tarfile.open(next((tmp_path / "wids").rglob("*.tar"))) as tf:
        assert all(info.isreg() and info.mode == 0o644 and "/" not in info.name for info in tf)
