"""sha256 names everything: it is what users check with `sha256sum`. BLAKE3 is recorded beside it for
the bytes that are re-checked often (shards, samples): as strong against damage and forgery (a 256-bit
cryptographic hash), 2.5x faster on one core and parallel within one file, so proving a version's shards
runs at memory speed instead of one core's sha256 per shard."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO, Callable

from blake3 import blake3

from dsbuild.core.files import open_regular
from dsbuild.core.jsonio import canonical_json

CHUNK = 4 << 20


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_json(obj: object) -> str:
    """Hash of the canonical JSON form: config hashes, version ids."""
    return sha256_bytes(canonical_json(obj))


def sha256_file(path: Path, root: Path | None = None) -> tuple[str, int]:
    """(hex digest, size) of a regular file (inside ``root`` when given), streamed in 4 MiB chunks."""
    h = hashlib.sha256()
    size = 0
    with open_regular(path, root) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


_POOL_OWNER: int | None = None  # the process whose BLAKE3 thread pool (rayon's, process-wide) is live


def _blake3_threads() -> int:
    """Every core for the process that first asked; one thread in a process forked from it: rayon's pool
    does not survive fork (its threads are gone, its state is not), and a forked loader or validate
    worker that used it would wait forever."""
    global _POOL_OWNER
    if _POOL_OWNER is None:
        _POOL_OWNER = os.getpid()
    return blake3.AUTO if _POOL_OWNER == os.getpid() else 1


class FileProof:
    """Proves a file's bytes against its record, streamed chunk by chunk: by BLAKE3 on every core when
    the record carries one, else by sha256 (records written before BLAKE3 was recorded)."""

    def __init__(self, sha256: str, blake3_hex: str | None):
        self.hash_name = "blake3" if blake3_hex else "sha256"
        self.expected = blake3_hex or sha256
        self._h = blake3(max_threads=_blake3_threads()) if blake3_hex else hashlib.sha256()

    def update(self, chunk) -> None:
        self._h.update(chunk)  # both release the GIL on large chunks

    def feed(self, f: BinaryIO, after_each: Callable[[], None] | None = None) -> "FileProof":
        """Hash the rest of ``f`` in ``CHUNK`` reads, calling ``after_each`` after every one (a caller's
        stop check)."""
        while chunk := f.read(CHUNK):
            self._h.update(chunk)
            if after_each is not None:
                after_each()
        return self

    def ok(self) -> bool:
        return self._h.hexdigest() == self.expected

    def mismatch(self) -> str:
        return f"{self.hash_name} {self._h.hexdigest()[:16]}…, expected {self.expected[:16]}…"


class HashingWriter:
    """A write-only file wrapper that hashes (sha256 and BLAKE3) and counts what passes through it (one
    pass, no re-read)."""

    def __init__(self, f: BinaryIO):
        self._f = f
        self._h = hashlib.sha256()
        self._b = blake3()
        self.tell_bytes = 0

    def write(self, data: bytes) -> int:
        self._f.write(data)
        self._h.update(data)
        self._b.update(data)
        self.tell_bytes += len(data)
        return len(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def blake3_hexdigest(self) -> str:
        return self._b.hexdigest()
