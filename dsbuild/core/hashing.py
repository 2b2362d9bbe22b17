"""sha256 names everything: it is what users check with `sha256sum`. BLAKE3 is recorded beside it for
the bytes that are re-checked often (shards, samples): as strong against damage and forgery (a 256-bit
cryptographic hash), 2.5x faster on one core and parallel within one file, so proving a version's shards
runs at memory speed instead of one core's sha256 per shard."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Protocol

from blake3 import blake3

from dsbuild.core.files import open_regular
from dsbuild.core.jsonio import canonical_json

CHUNK = 4 << 20


class Hasher(Protocol):
    """What ``FileProof`` asks of a hash: hashlib's and blake3's objects both are one."""

    def update(self, data: bytes, /) -> object: ...

    def hexdigest(self) -> str: ...


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def hashes_to(sha256: str, size: int | None = None) -> Callable[[bytes], bool]:
    """Whether bytes are the ones pinned by ``sha256`` (and ``size``): a store's ``proven`` check."""
    return lambda data: (size is None or len(data) == size) and sha256_bytes(data) == sha256


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
    return blake3.AUTO if os.getpid() == _POOL_OWNER else 1


class FileProof:
    """Proves a file's bytes against its record, streamed chunk by chunk: by BLAKE3 on every core when
    the record carries one, else by sha256 (records written before BLAKE3 was recorded). ``named``
    also proves the sha256 the file is named by, in the same pass: for bytes about to be stored under
    that name (``push``/``pull``), where everything later trusts "same name, same bytes" and skips
    what is present. A record's BLAKE3 alone does not tie its bytes to its name: a forged manifest can
    pair an honest name with other bytes and their BLAKE3."""

    def __init__(self, sha256: str, blake3_hex: str | None, *, named: bool = False):
        self._checks: list[tuple[str, Hasher, str]] = []  # (hash name, hasher, expected hex digest)
        if blake3_hex:
            self._checks.append(("blake3", blake3(max_threads=_blake3_threads()), blake3_hex))
        if named or not blake3_hex:
            self._checks.append(("sha256", hashlib.sha256(), sha256))

    def update(self, chunk) -> None:
        for _, h, _ in self._checks:
            h.update(chunk)  # both release the GIL on large chunks

    def feed(self, f: BinaryIO, after_each: Callable[[], None] | None = None) -> FileProof:
        """Hash the rest of ``f`` in ``CHUNK`` reads, calling ``after_each`` after every one (a caller's
        stop check)."""
        while chunk := f.read(CHUNK):
            self.update(chunk)
            if after_each is not None:
                after_each()
        return self

    def ok(self) -> bool:
        return not self.mismatch()

    def mismatch(self) -> str:
        """What does not match ("" when everything does)."""
        return "; ".join(
            f"{name} {digest[:16]}…, expected {expected[:16]}…"
            for name, h, expected in self._checks
            if (digest := h.hexdigest()) != expected
        )


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
