"""Where each pass of a torch ``DataLoader`` over a loader starts, agreed by the pass's worker processes.

A DataLoader starts its worker processes afresh for every pass, forked or spawned from the main process,
whose loader does not move (its batches are built in the workers): on their own, every pass would start
where the first did, and every epoch would repeat the first. The workers keep one small record in a
locked file instead: which pass wrote it, the loader position that pass was started from (``base``),
where it started, where it ended and how many of its workers finished. ``pass_start`` is the rule:

- a worker of the pass that wrote the record starts where its siblings did;
- a new pass from the same loader position starts where the previous one ended once every worker of it
  finished, and where it started if it was broken off (its batches are delivered again, from the first);
- a loader moved since (``load_state_dict`` in the main process) starts where it is: a move drops the
  record.

A worker's loader is at the main process's position as the worker was started; persistent workers keep
their copy from pass to pass, so the main process also writes where ``load_state_dict`` moved its loader
into the file (``moved``), and that is the position a worker goes by.

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
# where the record lives: memory where Linux offers it (each pass's two changes of a file on disk cost
# ~0.46 ms of a worker here, for the file system's journal; in /dev/shm 0.07 ms), else the temp folder
RECORD_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


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
    return (
        isinstance(v, list)
        and len(v) == 3
        and _count(v[0])
        and _count(v[2])
        and isinstance(v[1], list)
        and all(isinstance(c, list) and len(c) == 2 and all(map(_count, c)) for c in v[1])
    )


def _count(v) -> bool:
    return type(v) is int and v >= 0


def _parse(raw: bytes) -> tuple[list | None, dict | None]:
    """(the main process's position, the record) in ``raw``; None for what is absent or not whole."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None, None
    if not isinstance(doc, dict):
        return None, None
    main = doc.get("main")
    return main if _position(main) else None, _record(doc.get("record"))


def _record(r) -> dict | None:
    ok = (
        isinstance(r, dict)
        and set(r) == {"pass", "workers", "base", "start", "end", "done"}
        and isinstance(r["pass"], list)
        and len(r["pass"]) == 2
        and all(type(x) is int for x in r["pass"])
        and _count(r["workers"])
        and _count(r["done"])
        and _position(r["base"])
        and _position(r["start"])
        and (r["end"] is None or _position(r["end"]))
    )
    return r if ok else None


class PassFile:
    """The record's file: made by the main process, its path handed to the workers (pickled or forked)."""

    def __init__(self):
        fd, self.path = tempfile.mkstemp(prefix="dsbuild-torch-passes-", suffix=".json", dir=RECORD_DIR)
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
        """``change(main, record)`` -> (result, main, record), under the file's lock."""
        with open(self.path, "r+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
            main, record = _parse(f.read(MAX_RECORD))
            result, new_main, new = change(main, record)
            if new is not record or new_main is not main:
                f.seek(0)
                f.truncate()
                f.write(json.dumps({"main": new_main, "record": new}).encode())
            return result

    def start(self, pass_id: list, workers: int, own: Position) -> Position:
        """Where this worker's pass starts (``pass_start``), the record kept. ``own`` is the worker's copy's
        position; where the main process's loader was moved since (``moved``), that position counts."""

        def change(main, record):
            start, new = pass_start(record, pass_id, workers, main or encode(own))
            return start, main, new

        return decode(self._change(change))

    def done(self, pass_id: list, end: Position) -> None:
        """This worker delivered its share of pass ``pass_id``, which ends at ``end``."""
        self._change(lambda main, r: (None, main, pass_done(r, pass_id, encode(end))))

    def moved(self, position: Position) -> None:
        """The main process's loader was moved to ``position`` (``load_state_dict``): the next pass starts
        there, also in persistent workers, whose copies do not move with it. The record goes: a loader
        moved back to the position the last pass started from looks unmoved to ``pass_start`` (a roll-back
        to the start of training, or a retry restoring the same checkpoint twice, went on to the next
        epoch)."""
        try:
            self._change(lambda main, r: (None, encode(position), None))
        except FileNotFoundError:  # (the dataset is gone: no pass will ask)
            pass
