"""Every way out of a catalog refuses a forged shard, and they agree: ``verify`` reports it (exit 1),
every export, ``shards``, ``push`` and ``pull`` refuse it in one line naming the shard and the sample (exit 3),
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
from dsbuild.lineage.verify import check_shards, verify
from dsbuild.loader import Loader
from tests.cli.clitools import run
from tests.helpers import tree_bytes
from tests.security.conftest import SHARD_CASES
from tests.security.driver import drive

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
    with pytest.raises(CorruptDataError, match=shard):  # what `dsbuild shards` runs before it lists
        check_shards(Catalog.open(cat), vid)
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


# Every command that reads a catalog, and its exit code on a catalog with a forged shard: 0 for those that
# read no shard bytes, 1 for the two that judge them, 3 (one line naming the shard) for every way out.
SWEEP = {
    "info": ((), 0),
    "log": ((), 0),
    "query": (("SELECT count(*) FROM samples",), 0),
    "verify": ((), 1),
    "validate": ((), 1),
    "shards": ((), 3),
    **{f"export-{tool}": (("{out}", "--to", tool), 3) for tool in TOOLS},
    "pull": (("{out}",), 3),
    "push": (("{out}",), 3),
}


def check_sweep(plan: list, results: list[dict], shards: dict[str, str], out: Path) -> None:
    """Each (case, command name, args) of ``plan`` exited as SWEEP says, with one error line (naming the
    case's forged shard, ``shards[case]``, where it refused) and no tar written under ``out``."""
    for (case, name, _), got in zip(plan, results, strict=True):
        want = SWEEP[name][1]
        assert got["exit"] == want, (case, name, got)
        errors = [x for x in got["stderr"].splitlines() if x.startswith("error:")]
        assert len(errors) == (want != 0), (case, name, got["stderr"][-2000:])
        if want == 3:
            assert shards[case] in errors[0] and len(errors[0]) < 600, (case, name, errors)
            assert not (out / f"{case}-{name}").exists() or not any((out / f"{case}-{name}").rglob("*.tar"))


def test_every_command_that_reads_a_catalog_over_every_forged_case(forged, tmp_path):
    """One sweep: every command over every forged case, through the CLI's entry point (``driver``)."""
    cats = {case: forged(case) for case in CASES}
    before = {case: tree_bytes(cat) for case, (cat, _) in cats.items()}
    plan = [
        (case, name, [name.split("-")[0], str(cat), *(a.format(out=tmp_path / f"{case}-{name}") for a in args)])
        for case, (cat, _) in cats.items()
        for name, (args, _) in SWEEP.items()
    ]
    check_sweep(plan, drive([args for *_, args in plan]), {case: shard0(*cats[case]) for case in cats}, tmp_path)
    assert {case: tree_bytes(cat) for case, (cat, _) in cats.items()} == before
    assert not Path("/tmp/dsbuild-redteam-x.json").exists()


@pytest.mark.parametrize("case", ["symlink"])
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
