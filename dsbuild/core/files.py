"""Files from outside, opened safely, and files we write, written durably.

Reading: anything a capture, a catalog or a bucket hands us is untrusted. A file is opened only if it
is a regular file that resolves inside its root (no FIFO that hangs, no device that never ends, no
symlink to a secret elsewhere), and read with a cap (``read(cap + 1)``: never "stat, then read it all").

Writing: every record is written beside its target, fsynced and renamed, so readers see the old bytes
or the new ones and a crash leaves no half-written file under a real name (only a dot-temp that the
writer removes when it fails).
"""

from __future__ import annotations

import os
import re
import stat
import uuid
from pathlib import Path

from dsbuild.core.errors import FormatError, StorageError

# File descriptors the parent holds that worker processes must not inherit (e.g. a build folder's lock:
# a forked child would otherwise keep the lock alive after its parent is gone); the executor closes them.
PARENT_ONLY_FDS: set[int] = set()
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class UnsafeFile(FormatError):
    """A path that is not a regular file inside its root."""


def inside(path: Path | str, root: Path | str) -> bool:
    """``path`` resolves (symlinks followed) to ``root`` or below it.

    Lexically inside with no symlink on the way (one lstat per component below ``root``: the common
    case) settles it without resolving; anything else is resolved in full."""
    here, top = os.path.abspath(path), os.path.abspath(root)
    if here.startswith(top.rstrip(os.sep) + os.sep) and ".." not in here[len(top) :].split(os.sep):
        rest, probe = here[len(top) :].strip(os.sep).split(os.sep), top
        try:
            for part in rest:
                probe = os.path.join(probe, part)
                if os.path.islink(probe):
                    break
            else:
                return True
        except OSError:
            pass
    real_root = os.path.realpath(top)
    real = os.path.realpath(here)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def open_regular(path: Path, root: Path | None = None):
    """A binary file object for ``path`` if it is a regular file (inside ``root`` when given).

    ``O_NONBLOCK`` makes opening a FIFO return at once instead of waiting for a writer; the fstat
    after opening (not a stat before it) is what decides, so nothing can be swapped in between.
    """
    if root is not None and not inside(path, root):
        raise UnsafeFile(f"{path}: resolves outside {root} (symlink?)")
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(st.st_mode)
                else "a device"
                if (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode))
                else "a folder"
                if stat.S_ISDIR(st.st_mode)
                else "not a regular file"
            )
            raise UnsafeFile(f"{path}: is {kind}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_capped(path: Path, cap: int, *, root: Path | None = None, what: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``cap`` bytes; FormatError beyond it (the file is never
    read past ``cap + 1`` bytes, so a growing or endless file costs the cap, not the file)."""
    return read_capped_stat(path, cap, root=root, what=what)[0]


def read_capped_stat(
    path: Path, cap: int, *, root: Path | None = None, what: str | None = None
) -> tuple[bytes, os.stat_result]:
    """``read_capped``, and the file's status as it was opened (for a reader that must later tell whether
    the file it read is still the one on disk)."""
    with open_regular(path, root) as f:
        st = os.fstat(f.fileno())
        data = f.read(cap + 1)
    if len(data) > cap:
        raise FormatError(f"{what or path}: larger than the limit of {cap} bytes")
    return data, st


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    """Write ``path`` (a new name nobody reads yet) and fsync it."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


INTERRUPTED_WRITE = re.compile(r"^\..+\.[0-9a-f]{32}\.tmp$")
"""The name of ``replace_atomically``'s temp file: one found later is what a kill -9 left behind."""


def replace_atomically(path: Path, data: bytes) -> None:
    """Readers see the old bytes or the new ones, never a mix (write beside, fsync, rename). A failure
    (ENOSPC, EROFS...) removes the temp file and raises StorageError naming ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")  # matches INTERRUPTED_WRITE
    try:
        write_durably(tmp, data)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StorageError(
            f"{path}: cannot write ({e.strerror or e})",
            hint="check free space and permissions, then run the command again",
        ) from None
