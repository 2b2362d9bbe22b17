"""The loader's checkpoint: a small JSON-safe dict with a format version, O(sources), never O(samples).

Restoring refuses a checkpoint whose order-defining settings differ and says "checkpoint has X,
loader has Y". World size and worker count are deliberately absent: resuming with other values is
supported (elastic restart).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dsbuild.core.errors import UsageError

STATE_FORMAT = "dsbuild.loader/1"


@dataclass(frozen=True)
class LoaderState:
    sources: list[dict]  # [{"version_id", "split", "weight"}]
    seed: int
    shuffle: str
    batch_size: int
    bucket_by: str | None
    pack_frames: int | None
    policy: str
    position: int  # global batches consumed by all ranks together
    cursors: list[list[int]]  # per source: [epoch, next batch within that epoch]
    format: str = STATE_FORMAT

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, state: object) -> "LoaderState":
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise UsageError(f"not a {STATE_FORMAT} checkpoint: format is {state.get('format') if isinstance(state, dict) else type(state).__name__!r}")
        try:
            s = cls(**state)
        except TypeError as e:
            raise UsageError(f"malformed loader checkpoint ({e})") from None
        if not _valid(s):
            raise UsageError("malformed loader checkpoint: bad position, cursors or sources")
        return s

    def check_compatible(self, other: "LoaderState") -> None:
        """Raise if ``other`` (a checkpoint) was made under settings that define another order."""
        for name in ("sources", "seed", "shuffle", "batch_size", "bucket_by", "pack_frames", "policy"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                raise UsageError(f"cannot restore: checkpoint has {name}={theirs!r}, loader has {name}={mine!r}")


def _valid(s: LoaderState) -> bool:
    def count(x: object) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    return (count(s.position) and isinstance(s.sources, list) and isinstance(s.cursors, list)
            and len(s.cursors) == len(s.sources) and all(isinstance(x, dict) for x in s.sources)
            and all(isinstance(c, list) and len(c) == 2 and all(count(x) for x in c) for c in s.cursors))
