"""The file layout Mosaic's MDS shards and LitData's chunks share, written once.

    uint32 count
    uint32 offsets[count + 1]      absolute offset of each item, the last one is the end of the file
    header                         (MDS: the shard's config as JSON; LitData: nothing)
    item 0 ... item count-1        each: uint32 size of every field, then the fields' bytes

Items are streamed to a scratch file and the offset table is put in front when the file is complete,
so memory stays flat whatever the chunk size. Offsets are uint32: a file stays under 4 GiB.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

from dsbuild.core.errors import UsageError
from dsbuild.export.source import ExportSource

LIMIT = (1 << 32) - 1
KEY = "__key__"  # the sample key's column, as webdataset names it


class OffsetTableFile:
    def __init__(self, scratch: Path, header: bytes = b""):
        self.scratch = scratch
        self.header = header
        self.sizes: list[int] = []
        # Items go to disk as they come; finish() closes it (the object outlives any one call).
        self._body = open(scratch.with_suffix(".body"), "wb")  # noqa: SIM115

    def add(self, fields: list[bytes]) -> None:
        item = struct.pack(f"<{len(fields)}I", *(len(f) for f in fields))
        self._body.write(item)
        for f in fields:
            self._body.write(f)
        self.sizes.append(len(item) + sum(len(f) for f in fields))

    def finish(self) -> Path:
        """Write the complete file at ``scratch`` (the caller moves it into place)."""
        self._body.close()
        body = self.scratch.with_suffix(".body")
        n = len(self.sizes)
        offsets = [4 + 4 * (n + 1) + len(self.header)]
        for size in self.sizes:
            offsets.append(offsets[-1] + size)
        if offsets[-1] > LIMIT:
            raise UsageError(
                f"a file of {offsets[-1]} bytes does not fit the 4 GiB limit of its format",
                hint="export with a smaller target size",
            )
        with open(self.scratch, "wb") as out, open(body, "rb") as src:
            out.write(struct.pack("<I", n) + struct.pack(f"<{n + 1}I", *offsets) + self.header)
            shutil.copyfileobj(src, out, 1 << 20)
        body.unlink()
        return self.scratch


def sample_file(source: ExportSource, group, columns: list[str], scratch: Path, header: bytes = b"") -> Path:
    """One file of ``group``'s samples (proven), each item the ``columns``: ``__key__`` or a member name."""
    out = OffsetTableFile(scratch, header)
    for e, pairs in source.members(group):
        fields = {KEY: e.key.encode(), **dict(pairs)}
        out.add([bytes(fields[c]) for c in columns])
    return out.finish()
