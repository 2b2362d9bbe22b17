"""Views of one version for the field's tools: each writes a folder the tool reads with its own entry point.

    from dsbuild.export import export
    export("catalog@v3", "exports/v3-energon", to="energon", split="main")

| tool      | reads with                                              | bytes                                 |
|-----------|---------------------------------------------------------|---------------------------------------|
| energon   | ``get_train_dataset(DEST, split_part="train", ...)``    | as wids, plus what ``energon prepare`` writes |
| wids      | ``wids.ShardListDataset("DEST/train.json")``            | catalog tars linked where a shard is one split's |
| hf        | ``datasets.load_dataset(DEST, split="train")``          | Parquet + a card declaring every feature |
| mds       | ``StreamingDataset(local=DEST, split="train")``         | MDS shards written                    |
| litdata   | ``litdata.StreamingDataset("DEST/train")``              | LitData chunks written                |
| dali      | ``fn.readers.webdataset(...)``, arguments in DEST/train.json | as wids, plus DALI's index files |

Exports are deterministic (the same version, split and tool give the same bytes), atomic (built beside the
folder and renamed into place complete: an interrupted one leaves nothing a tool loads as a smaller dataset)
and resumable: an interrupted export finishes when run again. Writers need none of the tools installed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dsbuild.core.errors import UsageError
from dsbuild.core.store import is_url, local_path
from dsbuild.export import dali, energon, hf, litdata, mds, wids
from dsbuild.export.folder import ExportFolder, ExportMarker
from dsbuild.export.report import ExportReport, Ticker
from dsbuild.export.source import open_source

WRITERS = {
    "dali": dali.write,
    "energon": energon.write,
    "hf": hf.write,
    "mds": mds.write,
    "litdata": litdata.write,
    "wids": wids.write,
}
# what a tool cannot load, refused before the folder is claimed (after what no tool may be handed: damaged
# shards, and arrays that are not what the index records, which every tool hands on)
CHECKS = {"hf": hf.check}
EDITABLE = {"energon": energon.USER_FILES}  # files the user may edit once written: kept on a re-export
TOOLS = tuple(sorted(WRITERS))
# The size of each file an export writes (tars, MDS shards, LitData chunks, Parquet files): big sequential
# reads, small enough for Mosaic's and LitData's 4 GiB offset limit with room to spare.
TARGET_BYTES = 256_000_000

__all__ = ["TARGET_BYTES", "TOOLS", "ExportReport", "export"]


def export(
    ref: str,
    dest: str | Path,
    to: str,
    split: str | None = None,
    *,
    target_bytes: int = TARGET_BYTES,
    progress: Callable[[int, int], None] | None = None,
) -> ExportReport:
    """Write version ``ref`` (PATH[@VERSION]) into the folder ``dest`` for the tool ``to``.

    ``split``: a split set NAME (each of its splits becomes one of the tool's splits) or NAME/SPLIT (that
    split alone); None exports every sample as the split ``train``. ``progress(done, total)`` counts
    samples. Refuses a non-empty ``dest`` that is not an earlier export of the same thing (the same
    ``target_bytes`` too: files of two sizes would mix two layouts in one folder)."""
    if to not in WRITERS:
        raise UsageError(f"--to must be one of {', '.join(TOOLS)}, not {str(to)[:40]!r}")
    if target_bytes < 1 << 16:
        raise UsageError(f"target size must be at least 64KiB, not {target_bytes}")
    if is_url(dest):  # (it was written to a local folder named like the URL, and reported as a success)
        raise UsageError(
            f"{str(dest)[:200]}: an export is a local folder (it links catalog shards and lands by rename)",
            hint="export to a local folder, then copy it to the object store",
        )
    dest = local_path(dest)  # (file:///x is /x, not a folder "file:" here)
    source = open_source(ref, split)
    source.check_shards()
    if to in CHECKS:
        CHECKS[to](source)
    splits = {s.name: s.samples for s in source.splits}
    folder = ExportFolder(
        dest,
        ExportMarker(
            to,
            source.version_id,
            split,
            source.split_hash,
            dict(sorted(splits.items())),
            False,
            target_bytes=target_bytes,
        ),
        EDITABLE.get(to),
    )
    try:
        existed = folder.claim()
        if not existed:
            WRITERS[to](source, folder, Ticker(source.samples, progress), target_bytes)
            folder.finish()
    finally:
        folder.release()
    return ExportReport(
        tool=to,
        version_id=source.version_id,
        dest=str(dest),
        split=split,
        splits=splits,
        samples=source.samples,
        files_written=folder.written,
        bytes_written=folder.bytes,
        files_kept=folder.kept,
        linked_shards=folder.linked,
        existed=existed,
        repaired=folder.repaired,
        warnings=tuple(
            f"split {name!r} is empty: {to} cannot open it"  # the tools refuse to
            for name, n in splits.items()
            if not n
        )
        + tuple(
            f"{dest / rel}: edited since the export; kept as it is (remove it for dsbuild's)" for rel in folder.edited()
        ),
    )  # open an empty split
