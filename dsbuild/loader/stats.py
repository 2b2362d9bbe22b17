"""The loader's counters and per-stage seconds, attributed to the threads that spent them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

MAX_KEYS = 100  # offending keys kept in stats


class Stats:
    """Counters and per-stage seconds (thread-safe). ``wait`` is time the consumer waited for data;
    ``decoded_frames`` against ``frames`` shows what crops and strides saved.

    ``threads`` attributes the same seconds (and batches) to the thread that recorded them: the loader's
    workers (``dsbuild-load_0``...) for read/decode/collate, the consumer's thread for wait/h2d.
    ``notes`` say what the loader chose on the user's behalf (a device or decoder fallback).
    ``workers`` says how batches are built: ``mode`` (thread or process) and ``why``; with processes,
    how many, their start method, ``startup_seconds``, ``shm_bytes`` (shared memory in use) and
    ``pinned`` (the segments are registered with CUDA as pinned host memory: device CUDA only). The
    seconds worker processes spend are added under their names (``dsbuild-load-proc_0``...).
    ``proofs`` count, in this process, sources whose index was read and checked at open and those whose
    derived columns the machine kept from an earlier open (``indexes_read``, ``indexes_known``), shards
    hashed (``verify="shard"``) and safety-checked on their first read, and those the machine's proof
    cache already vouched for (``core.hashcache``).

    Counters count what was delivered: a batch's counts (and its substituted samples) are held while it
    is built (``holding``) and added when the loop hands it over (``deliver``), so batches built ahead and
    then dropped (an early stop, a roll-back) are not counted; seconds are the work done, dropped or not."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts = {
            "batches": 0,
            "samples": 0,
            "frames": 0,
            "padding_frames": 0,
            "truncated": 0,
            "corrupt": 0,
            "bytes": 0,
            "decoded_frames": 0,
            "decode_fallback": 0,  # clips NVDEC did not take, decoded on CPU
        }
        self.seconds = {"read": 0.0, "decode": 0.0, "collate": 0.0, "h2d": 0.0, "wait": 0.0}
        self.corrupt_keys: list[str] = []
        self.threads: dict[str, dict[str, float]] = {}
        self.notes: list[str] = []
        self.workers: dict = {}
        self.proofs = dict.fromkeys(
            ("indexes_read", "indexes_known", "shards_hashed", "hashes_known", "shards_checked", "checks_known"), 0
        )
        self._local = threading.local()

    @contextmanager
    def holding(self) -> Iterator[dict]:
        """Counts this thread records meanwhile are kept in the dict yielded (for ``deliver``), not added."""
        held: dict = {"counts": {}, "corrupt": []}
        self._local.held = held
        try:
            yield held
        finally:
            self._local.held = None

    def deliver(self, held: dict, seconds: dict[str, float]) -> None:
        """A batch handed over: the counts held while it was built, and the consumer's ``seconds`` on it
        (wait, h2d; one lock a batch)."""
        name = threading.current_thread().name
        with self._lock:
            self._count(held["counts"], held["corrupt"])
            self._spent(name, seconds)

    def _count(self, counts: dict, corrupt: list[str]) -> None:
        for k, v in counts.items():
            self.counts[k] += v
        self.counts["corrupt"] += len(corrupt)
        self.corrupt_keys.extend(corrupt[: MAX_KEYS - len(self.corrupt_keys)])

    def note(self, text: str | None) -> None:
        if text and text not in self.notes:
            with self._lock:
                self.notes.append(text)

    def proof(self, kind: str) -> None:
        """One index or shard proven (``indexes_read``, ``shards_hashed``, ``shards_checked``) or found
        proven (``indexes_known``, ``hashes_known``, ``checks_known``)."""
        with self._lock:
            self.proofs[kind] += 1

    def workers_info(self, **fields) -> None:
        """How batches are built (see the class docstring), merged into ``workers``."""
        with self._lock:
            self.workers.update(fields)

    def add_worker(self, name: str, seconds: dict[str, float]) -> None:
        """A batch built by the worker process ``name``, which spent ``seconds`` per stage on it."""
        with self._lock:
            mine = self.threads.setdefault(name, {})
            for k, v in seconds.items():
                self.seconds[k] = self.seconds.get(k, 0.0) + v
                mine[k] = mine.get(k, 0.0) + v
            mine["batches"] = mine.get("batches", 0) + 1

    def add(self, counts: dict | None = None, seconds: dict | None = None, corrupt: str | None = None) -> None:
        name = threading.current_thread().name
        held = getattr(self._local, "held", None)
        with self._lock:
            if held is None:
                self._count(counts or {}, [] if corrupt is None else [corrupt])
            else:
                for k, v in (counts or {}).items():
                    held["counts"][k] = held["counts"].get(k, 0) + v
                if corrupt is not None:
                    held["corrupt"].append(corrupt)
            if seconds:
                self._spent(name, seconds)
            if counts and "batches" in counts:  # the work each thread did, delivered or not
                mine = self.threads.setdefault(name, {})
                mine["batches"] = mine.get("batches", 0) + counts["batches"]

    def _spent(self, name: str, seconds: dict[str, float]) -> None:
        """``seconds`` per stage, in all and for thread ``name`` (under the lock)."""
        mine = self.threads.setdefault(name, {})
        for k, v in seconds.items():
            self.seconds[k] += v
            mine[k] = mine.get(k, 0.0) + v

    def to_json(self) -> dict:
        with self._lock:
            total = self.counts["frames"] + self.counts["padding_frames"]
            return {
                **self.counts,
                "seconds": dict(self.seconds),
                "corrupt_keys": list(self.corrupt_keys),
                "padding_fraction": self.counts["padding_frames"] / total if total else 0.0,
                "threads": {name: dict(v) for name, v in sorted(self.threads.items())},
                "notes": list(self.notes),
                "workers": dict(self.workers),
                "proofs": dict(self.proofs),
            }
