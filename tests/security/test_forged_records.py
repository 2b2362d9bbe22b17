"""The smaller holes: manifest statistics are checked for sense by ``verify`` (a re-pinned manifest claiming
1e308 hours, or a config with clip_seconds -1e308); a checkpoint's hostile value is cut short in the error;
a checkpoint whose position cannot advance is refused on restore for every plan kind."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from dsbuild.core.errors import FormatError, UsageError
from dsbuild.core.hashing import sha256_json
from dsbuild.lineage.catalog import Catalog
from dsbuild.loader import Loader, Mixture
from dsbuild.loader.state import MAX_COUNT
from tests.cli.clitools import run


def forge_manifest(cat, vid: str, **edit) -> str:
    """A copy of version ``vid`` whose manifest is ``replace(m, **edit(m))``, config hash recomputed."""
    m = Catalog.open(cat).manifest(vid)
    new = replace(m, **{k: f(m) for k, f in edit.items()})
    new = replace(new, config_hash=sha256_json(new.config))
    folder = cat / "versions" / new.version_id
    shutil.copytree(cat / "versions" / vid, folder)
    (folder / "commit.json").unlink(missing_ok=True)
    (folder / "manifest.json").write_bytes(new.to_bytes())
    return new.version_id


@pytest.fixture(scope="module")
def stats_catalog(base_catalog, tmp_path_factory):
    cat = shutil.copytree(base_catalog[0], tmp_path_factory.mktemp("stats") / "catalog")
    vid = base_catalog[1]
    return cat, {
        "hours": forge_manifest(cat, vid, stats=lambda m: replace(m.stats, hours=1e308)),
        "clip_seconds": forge_manifest(cat, vid, config=lambda m: {**m.config, "clip_seconds": -1e308}),
        "frames": forge_manifest(cat, vid, stats=lambda m: replace(m.stats, frames=m.stats.frames * 1000)),
        "clean": vid,
    }


@pytest.mark.parametrize("case", ["hours", "clip_seconds", "frames"])
def test_verify_finds_manifest_stats_that_make_no_sense(stats_catalog, case):
    cat, vids = stats_catalog
    out = run("verify", f"{cat}@{vids[case]}", "--json", check=1).stdout
    found = [p for p in json.loads(out)["problems"] if p.get("manifest") == "stats"]
    assert found and case in found[0]["detail"] and len(found[0]["detail"]) < 200, found


def test_verify_passes_the_stats_of_a_real_build(stats_catalog):
    cat, vids = stats_catalog
    run("verify", f"{cat}@{vids['clean']}")


@pytest.fixture(scope="module")
def checkpoint(base_catalog):
    return Loader(str(base_catalog[0]), decode="bytes", batch_size=2).state_dict()


@pytest.mark.parametrize("field", ["seed", "shuffle", "bucket_by"])
def test_a_checkpoints_hostile_value_is_cut_short_in_the_error(base_catalog, checkpoint, field):
    state = json.loads(json.dumps(checkpoint))
    state["order"][field] = "x" * 10_000_000
    with pytest.raises(UsageError) as e:
        Loader(str(base_catalog[0]), decode="bytes", batch_size=2).load_state_dict(state)
    assert len(str(e.value)) + len(e.value.hint or "") < 600 and "10000002 characters" in str(e.value)


KINDS = {
    "plain": {},
    "bucketed": {"bucket_by": "length"},
    "packed": {"pack_frames": 64, "decode": "frames"},
    "mix_sample": {"mix": "sample"},
}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("where", ["position", "epoch"])
def test_a_position_that_cannot_advance_is_refused_for_every_plan_kind(base_catalog, kind, where):
    ref = str(base_catalog[0])

    def make():
        return Mixture([(ref, None, 0.5), (ref, None, 0.5)], **{"decode": "bytes", "batch_size": 2, **KINDS[kind]})

    state = make().state_dict()
    if where == "position":
        state["position"] = MAX_COUNT
    else:
        state["cursors"][0]["epoch"] = MAX_COUNT
    with pytest.raises(FormatError, match="cannot advance"):
        make().load_state_dict(state)
