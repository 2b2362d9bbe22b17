"""JSON Schemas of the records dsbuild writes, generated from their typed definitions (``Record.json_schema``).

    python -m dsbuild.export.schemas docs/schemas      # regenerate the published files

A test regenerates them and fails on any drift from ``docs/schemas/``, and validates real outputs
against them. Records that are not typed yet (the split manifest) have no schema here.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dsbuild.convert.config import ConvertConfig
from dsbuild.convert.derive import DeriveConfig
from dsbuild.core.jsonio import pretty_json
from dsbuild.core.records import Record
from dsbuild.export.folder import ExportMarker
from dsbuild.export.report import ExportReport
from dsbuild.formats.sample import SampleMeta
from dsbuild.lineage.catalog import CommitRecord, TagsFile
from dsbuild.lineage.manifest import Manifest, SessionTable
from dsbuild.lineage.splitsets import SplitManifest, SplitPointer
from dsbuild.loader.state import LoaderState

DIALECT = "https://json-schema.org/draft/2020-12/schema"
# file stem -> (record, where it is found)
RECORDS: dict[str, tuple[type[Record], str]] = {
    "manifest": (Manifest, "versions/<id>/manifest.json (its sha256 is the version id)"),
    "sessions": (SessionTable, "versions/<id>/sessions.json (pinned by sha256 in the manifest)"),
    "commit": (CommitRecord, "versions/<id>/commit.json"),
    "tags": (TagsFile, "tags.json"),
    "split-pointer": (SplitPointer, "splits/<id>/<name>.json"),
    "split-manifest": (SplitManifest, "splits/<id>/<name>/<hash>/manifest.json"),
    "sample": (SampleMeta, "each sample's <key>.json member (the Parquet shards' meta column)"),
    "convert-config": (ConvertConfig, "a converted version's manifest config"),
    "derive-config": (DeriveConfig, "a derived version's manifest config"),
    "export-marker": (ExportMarker, ".dsbuild-export.json in an export folder"),
    "export-report": (ExportReport, "dsbuild export --json"),
    "loader-checkpoint": (LoaderState, "Loader.state_dict() (what a training job saves to resume)"),
}


def schema_documents() -> dict[str, dict]:
    """File name -> JSON Schema document, for every published record."""
    return {
        f"{stem}.schema.json": {
            "$schema": DIALECT,
            "title": cls.__name__,
            "$comment": f"Found in {where}.",
            **cls.json_schema(),
        }
        for stem, (cls, where) in RECORDS.items()
    }


def write_schemas(folder: str | Path) -> list[Path]:
    """Write every schema into ``folder`` (deterministic bytes); returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, doc in schema_documents().items():
        (folder / name).write_bytes(pretty_json(doc))
        out.append(folder / name)
    return out


if __name__ == "__main__":
    for path in write_schemas(sys.argv[1] if len(sys.argv) > 1 else "docs/schemas"):
        print(path)
