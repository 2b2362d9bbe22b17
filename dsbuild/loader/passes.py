"""Where each pass of a torch ``DataLoader`` over a loader starts, agreed by the pass's worker processes.

A DataLoader starts its worker processes afresh for every pass, forked or spawned from the main process,
whose loader does not move (its batches are built in the workers): on their own, every pass would start
where the first did, and every epoch would repeat the first. The workers keep one small record in a
locked file instead: which pass wrote it, the loader position that pass was started from (``base``),
where it started, where it ended and how many of its workers finished. ``pass_start`` is the rule:

- a worker of the pass that wrote the record starts where its siblings did;
- a new pass from the same loader position starts where the previous one ended once every worker of it
  finished, and where it started if it was broken off (its batches are delivered again, from the first);
- a loader moved since (``load_state_dict`` in the main process) starts where it is.

A pass is named by the base seed torch draws for it (shared by its workers) and the number of passes the
worker's copy of the dataset has begun (persistent workers keep their copy and their seed).
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile

from dsbuild.loader.walk import Position

MAX_RECORD = 1 << 20  # bytes: a record holds two positions (two numbers a source)


def encode(p: Position) -> list:
    return [p.step, [list(c) for c in p.cursors], p.inner]


def decode(v: list) -> Position:
    return Position(v[0], tuple((e, a) for e, a in v[1]), v[2])


def pass_start(record: dict | None, pass_id: list, workers: int, own: list) -> tuple[list, dict]:
    """(where this worker's pass starts, the record to keep) for a worker of pass ``pass_id`` (of
    ``workers`` workers) whose loader is at ``own``; positions are ``encode``'s lists."""
    if record is not None and record["pass"] == pass_id and record["done"] < record["workers"]:
        return record["start"], record
    start = own
    if record is not None and record["base"] == own:
        finished = record["end"] is not None and record["done"] >= record["workers"]
        start = record["end"] if finished else record["start"]
    return start, {"pass": pass_id, "workers": workers, "base": own, "start": start, "end": None, "done": 0}


def pass_done(record: dict | None, pass_id: list, end: list) -> dict | None:
    """The record once a worker of pass ``pass_id`` has delivered its share, the pass ending at ``end``."""
    if record is None or record["pass"] != pass_id:
        return record
    return {**record, "end": end, "done": record["done"] + 1}


def _position(v) -> bool:
    return (isinstance(v, list) and len(v) == 3 and _count(v[0]) and _count(v[2]) and isinstance(v[1], list)
            and all(isinstance(c, list) and len(c) == 2 and all(map(_count, c)) for c in v[1]))


def _count(v) -> bool:
    return type(v) is int and v >= 0


def _parse(raw: bytes) -> dict | None:
    """The record in ``raw``, or None (an empty file, or anything that is not a whole record)."""
    try:
        r = json.loads(raw)
    except ValueError:
        return None
    ok = (isinstance(r, dict) and set(r) == {"pass", "workers", "base", "start", "end", "done"}
          and isinstance(r["pass"], list) and len(r["pass"]) == 2 and all(type(x) is int for x in r["pass"])
          and _count(r["workers"]) and _count(r["done"]) and _position(r["base"]) and _position(r["start"])
          and (r["end"] is None or _position(r["end"])))
    return r if ok else None


class PassFile:
    """The record's file: made by the main process, its path handed to the workers (pickled or forked)."""

    def __init__(self):
        fd, self.path = tempfile.mkstemp(prefix="dsbuild-torch-passes-", suffix=".json")
        os.close(fd)
        self.owner = os.getpid()

    def remove(self) -> None:
        """Remove the file, from the process that made it only (forked workers inherit this object)."""
        if os.getpid() == self.owner:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def _change(self, change):
        with open(self.path, "r+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
            record = _parse(f.read(MAX_RECORD))
            result, new = change(record)
            if new is not record:
                f.seek(0)
                f.truncate()
                f.write(json.dumps(new).encode())
            return result

    def start(self, pass_id: list, workers: int, own: Position) -> Position:
        """Where this worker's pass starts (``pass_start``), the record kept."""
        return decode(self._change(lambda r: pass_start(r, pass_id, workers, encode(own))))

    def done(self, pass_id: list, end: Position) -> None:
        """This worker delivered its share of pass ``pass_id``, which ends at ``end``."""
        self._change(lambda r: (None, pass_done(r, pass_id, encode(end))))
