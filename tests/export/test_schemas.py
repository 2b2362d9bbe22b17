"""The published JSON Schemas are what the typed records generate, and real outputs validate against them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsbuild.export.schemas import write_schemas
from dsbuild.formats import get_format
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.index import entries_by_shard

PUBLISHED = Path(__file__).resolve().parents[2] / "docs" / "schemas"
REGENERATE = "python -m dsbuild.export.schemas docs/schemas"


def test_published_schemas_match_the_records(tmp_path):
    fresh = {p.name: p.read_bytes() for p in write_schemas(tmp_path)}
    published = {p.name: p.read_bytes() for p in PUBLISHED.glob("*.schema.json")}
    assert sorted(published) == sorted(fresh), f"docs/schemas is out of date; run `{REGENERATE}`"
    stale = [name for name in fresh if fresh[name] != published[name]]
    assert not stale, f"{', '.join(stale)} differ from the records; run `{REGENERATE}`"


def test_real_outputs_validate_against_the_published_schemas(export_catalog, exported):
    jsonschema = pytest.importorskip("jsonschema")
    cat, vid = export_catalog

    def check(schema: str, doc: dict) -> None:
        jsonschema.Draft202012Validator(json.loads((PUBLISHED / f"{schema}.schema.json").read_text())).validate(doc)

    check("manifest", json.loads((cat / "versions" / vid / "manifest.json").read_text()))
    check("sessions", json.loads((cat / "versions" / vid / "sessions.json").read_text()))
    check("commit", json.loads((cat / "versions" / vid / "commit.json").read_text()))
    check("tags", json.loads((cat / "tags.json").read_text()))
    pointer = json.loads((cat / "splits" / vid / "main.json").read_text())
    check("split-pointer", pointer)
    check("split-manifest", json.loads((cat / "splits" / vid / "main" / pointer["hash"] / "manifest.json").read_text()))
    manifest = json.loads((cat / "versions" / vid / "manifest.json").read_text())
    check("convert-config", manifest["config"])
    catalog = Catalog.open(cat)
    m = catalog.manifest(vid)
    rec = m.shards[0]
    with get_format(m.shard_format).reader(catalog.shard_file(rec)) as reader:
        for e in entries_by_shard(catalog.index(vid))[rec.path]:
            check("sample", json.loads(dict(reader.members(e))["json"]))
    check("export-marker", json.loads((exported("wids") / ".dsbuild-export.json").read_text()))
    from dsbuild.loader import Loader

    loader = Loader(str(cat), decode="bytes", batch_size=2, seed=3)
    next(iter(loader))
    check("loader-checkpoint", json.loads(json.dumps(loader.state_dict())))
    bad = json.loads((cat / "versions" / vid / "commit.json").read_text()) | {"sequence": -1}
    with pytest.raises(jsonschema.ValidationError):
        check("commit", bad)
