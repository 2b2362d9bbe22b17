"""Finding the sessions of a capture root (local, or staged from an object store), quarantining the
ones whose ``session.json`` is unusable, and every holder of a duplicated session id."""

from __future__ import annotations

import errno
import functools
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dsbuild.core.errors import CaptureError, UsageError
from dsbuild.core.jsonio import printable
from dsbuild.core.store import FsspecStore, UnsafeKey, cache_root, check_capture_key, retry
from dsbuild.formats.capture import Session, discover_sessions, read_session
from dsbuild.lineage.manifest import Quarantined


def read_sessions(root: Path) -> tuple[list[Session], list[Quarantined]]:
    """Parse every session.json; quarantine unreadable folders and files and every duplicated id."""
    folders, unreadable = discover_sessions(root)
    quarantined = [Quarantined(rel, rel, why) for rel, why in unreadable]
    sessions = []
    for directory in folders:
        try:
            sessions.append(read_session(directory, root))
        except CaptureError as e:
            quarantined.append(Quarantined(printable(directory.relative_to(root).as_posix()), e.path, e.reason))
    by_id = defaultdict(list)
    for s in sessions:
        by_id[s.session_id].append(s)
    kept = []
    for s in sessions:
        twins = by_id[s.session_id]
        if len(twins) > 1:
            others = ", ".join(t.rel for t in twins if t is not s)
            quarantined.append(
                Quarantined(s.session_id, s.rel_of("session.json"), f"duplicate session_id (also in {others})")
            )
        else:
            kept.append(s)
    return kept, quarantined


@contextmanager
def staged(url: str) -> Iterator[Path]:
    """Download a capture root from object storage into a private temporary folder (removed after).

    Keys are checked (``core.store.check_key``) before they become local paths, so a hostile bucket
    cannot write outside the folder; paths stay relative to the root, so the build is byte-identical
    to one from a local copy."""
    store = FsspecStore(url)
    keys = store.list("", every=True)  # (capture folders are named by people: spaces, accents)
    if not keys:
        raise UsageError(f"{url}: capture folder does not exist or is empty")
    for key in keys:  # one that cannot be a local path is named, never skipped silently
        try:
            check_capture_key(key)
        except UnsafeKey as e:
            raise UsageError(
                f"{url}/{key[:200]}: cannot be staged as a local file: {e}",
                hint="rename or remove the object in the bucket",
            ) from None
    folders = {k[:i] for k in keys for i in range(len(k)) if k[i] == "/"}
    both = sorted(folders.intersection(keys))
    if both:  # an object store can hold `x` and `x/y`; a folder cannot
        raise UsageError(
            f"{url}/{both[0]}: is both an object and a folder ({both[0]}/... exists); a capture "
            "folder cannot hold both",
            hint="rename or remove one of them in the bucket",
        )
    base = cache_root()
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="dsbuild-captures-", dir=base))
    try:
        for key in keys:
            local = tmp / key
            try:
                local.parent.mkdir(parents=True, exist_ok=True)
                retry(f"{url}/{key}", functools.partial(store.fs.get_file, f"{store.root}/{key}", str(local)))
            except OSError as e:
                if e.errno != errno.ENAMETOOLONG:
                    raise
                raise UsageError(
                    f"{url}/{key[:200]}: cannot be staged as a local file (its path is too long for this file system)",
                    hint="rename the object in the bucket",
                ) from None
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
