"""The error hierarchy. Raised early with the bad value and what to do; turned into exit codes only in
``dsbuild.cli.app`` (the one place that decides them).

Every error dsbuild raises on purpose is one of the concrete classes below (never the base): the class
says whose fault it is, which is what the exit code tells a CI job.
"""

from __future__ import annotations


class DsbuildError(Exception):
    """Base of every error dsbuild raises on purpose. ``hint`` says what to do about it."""

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class UsageError(DsbuildError):
    """The user asked for something impossible: bad option value, unknown version, missing folder."""


class CaptureError(DsbuildError):
    """A capture session breaks the capture contract; convert quarantines it instead of stopping."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class FormatError(DsbuildError):
    """Bytes that do not match their format: a shard, manifest, index, checkpoint or capture file."""


class StorageError(DsbuildError):
    """Reading or writing storage failed (disk full, permissions, read-only file system, network, a
    damaged catalog): nothing was committed. Never a reason to quarantine a capture: the command stops,
    and re-running it after fixing the cause finishes the job."""


class LineageError(StorageError):
    """The catalog, or a version in it, is inconsistent (a manifest or shard that is not what it claims)."""


class CorruptDataError(StorageError):
    """Stored data is damaged beyond what the reader can route around (e.g. every replacement of a
    corrupt sample was corrupt too)."""


class MissingDependency(DsbuildError):
    """An optional extra is not installed; the message names the extra to install."""

    def __init__(self, what: str, extra: str, package: str | None = None):
        super().__init__(f"{what} needs {package or extra}: pip install 'dsbuild[{extra}]'")
        self.extra = extra


class MissingDevice(MissingDependency):
    """The machine lacks hardware or a driver the request needs (a CUDA GPU, FFmpeg's CUDA hwaccel): an
    environment condition like a missing extra (exit 3), not a usage error; the message names what is missing."""

    def __init__(self, message: str, *, hint: str | None = None):
        DsbuildError.__init__(self, message, hint=hint)
        self.extra = ""


class CheckFailed(DsbuildError):
    """A check ran and the data did not pass: validation, verify, a split check, ``--strict`` with
    quarantined sessions, a benchmark regression. The only error that means "dataset rejected"."""


class WorkerDied(StorageError):
    """A worker process was killed (the OOM killer, a signal) before it returned its result."""
