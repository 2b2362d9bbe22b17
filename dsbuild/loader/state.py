"""The loader's checkpoint: a typed record, small and JSON-safe, O(sources), never O(samples).

A source is named by what its data *is* — the version id (the sha256 of its manifest) and, for a
split, the split set's hash — never by the path it was opened from, so a moved or remounted catalog
(``./cat`` or ``/mnt/cat``) resumes. The order-defining options (``LoaderOptions`` fields marked
``order=True``) are recorded by name; restoring under another value is refused, naming the option.
The layout that saved it (world size, dp, tp, cp, pp) is recorded to be read, never matched: the position
counts global batches of every data-parallel rank together, so any other layout or worker count resumes
it exactly once.
Every count is range-checked on reading (at most 2^53 - 1, exact in every JSON reader), so a
hostile or damaged checkpoint is a one-line FormatError naming the field, never an empty epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsbuild.core.errors import FormatError, UsageError
from dsbuild.core.records import SHA256, JsonValue, Record, spec

STATE_FORMAT = "dsbuild.loader/2"
MAX_COUNT = (1 << 53) - 1
MAX_RESTORED = 1 << 52  # a restored position, epoch or inner count: room left for 2^52 more (never unrestorable)
SHOWN = 80  # characters of a checkpoint's value an error shows (a hostile one may be megabytes)


def shown(value: object) -> str:
    """``repr(value)`` cut to ``SHOWN`` characters, for messages."""
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[: SHOWN - 3]}... ({len(text)} characters)"


def count(doc: str) -> dict:
    """A count field's metadata: ``field(metadata=count(doc))`` (the ``field`` call stays in the class, where
    type checkers see a field without a default)."""
    return spec(minimum=0, maximum=MAX_COUNT, doc=doc)


@dataclass(frozen=True, slots=True)
class SourceId(Record):
    """A source by content: version id, split name and the split set's hash, mixture weight."""

    version_id: str = field(metadata=spec(pattern=SHA256))
    split: str | None  # NAME/SPLIT
    split_hash: str | None = field(metadata=spec(pattern=SHA256))
    weight: float = field(metadata=spec(minimum=0, maximum=1))

    def describe(self) -> str:
        split = (
            f" split {self.split[:SHOWN]} ({self.split_hash[:12] if self.split_hash else 'no split hash'})"
            if self.split
            else ""
        )
        return f"version {self.version_id[:12]}{split} weight {self.weight!r}"  # (exact: :g showed 1 for 0.9999999)


@dataclass(frozen=True, slots=True)
class Cursor(Record):
    """One source's place: its epoch and the next batch (mix="batch") or sample (mix="sample") in it."""

    epoch: int = field(metadata=count("epoch of this source"))
    at: int = field(metadata=count("next batch (mix=batch) or sample (mix=sample) of the epoch"))


@dataclass(frozen=True, slots=True)
class LoaderState(Record):
    """Where the global stream stands: ``position`` global batches (all ranks together) are consumed."""

    FORMAT = STATE_FORMAT
    sources: tuple[SourceId, ...]
    order: dict[str, JsonValue]
    position: int = field(metadata=count("global batches consumed by all ranks together"))
    cursors: tuple[Cursor, ...]
    inner: int = field(
        metadata=count("mix=sample: batches of the current planning chunk consumed (cursors are at its start)")
    )
    layout: dict[str, int] | None = field(
        default=None,
        metadata=spec(
            absent_when_none=True,
            doc="the layout that saved it (world_size, dp, tp, cp, pp): informative, any layout restores",
        ),
    )

    def check_compatible(self, checkpoint: LoaderState) -> None:
        """Raise if ``checkpoint`` was made for other data or under options that define another order, or
        stands where it cannot advance (a run restored from it would write a checkpoint past ``MAX_COUNT``
        that it refuses itself: whatever the plan, bucketed, packed or mix="sample")."""
        counts = [("position", checkpoint.position), ("inner", checkpoint.inner)]
        counts += [(f"cursors[{k}].epoch", c.epoch) for k, c in enumerate(checkpoint.cursors)]
        for name, value in counts:
            if value > MAX_RESTORED:
                raise FormatError(
                    f"loader checkpoint: {name} = {value} cannot advance (a restored count is at most {MAX_RESTORED})"
                )
        if len(checkpoint.sources) != len(self.sources) or len(checkpoint.cursors) != len(checkpoint.sources):
            raise UsageError(
                f"cannot restore: checkpoint has {len(checkpoint.sources)} source(s) and "
                f"{len(checkpoint.cursors)} cursor(s), loader has {len(self.sources)} source(s)"
            )
        for i, (mine, theirs) in enumerate(zip(self.sources, checkpoint.sources)):
            if mine != theirs:
                raise UsageError(
                    f"cannot restore: checkpoint has source {i} = {theirs.describe()}, loader has {mine.describe()}"
                )
        for name in sorted(set(self.order) | set(checkpoint.order)):
            ours, saved = self.order.get(name), checkpoint.order.get(name)
            if ours != saved:
                raise UsageError(
                    f"cannot restore: checkpoint has {name}={shown(saved)}, loader has {name}={shown(ours)}",
                    hint=f"construct the loader with {name}={shown(saved)} to resume this run",
                )
