"""One split's own tars, for readers that read every sample of a tar (the webdataset library, wids):
``dsbuild shards CATALOG --split NAME/SPLIT --materialize DIR``.

A catalog shard may hold samples of several splits, so listing the catalog's shards would hand such a
reader other splits' samples. DIR is the wids export of that split alone: catalog shards holding only
the split are linked, the split's other samples written into tars of their own (``tars.split_tars``),
so the listed tars hold exactly the split's samples, in key order. Like every
export it is atomic, resumable, and reused as it is when run again.
"""

from __future__ import annotations

from pathlib import Path

from dsbuild.core.errors import CorruptDataError
from dsbuild.core.jsonio import loads_bounded
from dsbuild.lineage.history import ShardLocation, split_parts

LIST_BYTES = 64 << 20  # the split's shard list: ~100 bytes a tar


def materialize_split(ref: str, split: str, dest: str | Path) -> list[ShardLocation]:
    """Write (or reuse) the tars of ``split`` (NAME/SPLIT) of version ``ref`` in ``dest``; their locations
    in key order, each holding only the split's samples."""
    from dsbuild.export import export

    _, part = split_parts(split)
    root = Path(export(ref, dest, to="wids", split=split).dest).resolve()
    listing = root / f"{part}.json"
    doc = loads_bounded(listing.read_bytes(), max_bytes=LIST_BYTES, what=str(listing))
    foreign = CorruptDataError(f"{listing}: not a shard list dsbuild wrote", hint=f"remove {root} and run again")
    entries = doc.get("shardlist") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise foreign
    out = []
    for e in entries:
        url = e.get("url") if isinstance(e, dict) else None
        n = e.get("nsamples") if isinstance(e, dict) else None
        if not isinstance(url, str) or not url.startswith(f"shards/{part}/") or ".." in url or type(n) is not int:
            raise foreign
        tar = root / url
        out.append(ShardLocation(tar.as_uri(), str(tar), Path(url).stem, tar.stat().st_size, n, n))
    return out
