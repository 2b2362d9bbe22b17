"""What an export did (a typed record, printed by ``dsbuild export --json``) and its progress counter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dsbuild.core.records import SHA256, Record, spec


@dataclass(frozen=True, slots=True)
class ExportReport(Record):
    tool: str
    version_id: str = field(metadata=spec(pattern=SHA256))
    dest: str
    split: str | None  # NAME or NAME/SPLIT as asked
    splits: dict[str, int]  # tool split -> samples
    samples: int
    files_written: int  # by this run
    bytes_written: int  # by this run (links count nothing)
    files_kept: int  # already in place from an earlier, interrupted run
    linked_shards: int  # catalog shards shared by a symlink (no byte copied)
    existed: bool  # the folder already held this export, complete: nothing was done
    repaired: int = 0  # files of a complete export found missing or changed, written again
    warnings: tuple[str, ...] = ()  # e.g. an empty split, which the tool cannot open


class Ticker:
    """Counts exported samples and reports ``progress(done, total)``."""

    def __init__(self, total: int, progress: Callable[[int, int], None] | None):
        self.total, self.done, self._progress = total, 0, progress

    def __call__(self, n: int = 1) -> None:
        self.done += n
        if self._progress is not None:
            self._progress(self.done, self.total)
