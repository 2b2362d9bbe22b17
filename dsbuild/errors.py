"""The error hierarchy. Raised early with the bad value and the fix; mapped to exit codes only in cli/."""


class DsbuildError(Exception):
    """Base of every error dsbuild raises on purpose. Exit code 2 unless a subclass says otherwise."""

    exit_code = 2


class UsageError(DsbuildError):
    """The user asked for something impossible: missing folder, bad option value, unknown version."""


class CaptureError(DsbuildError):
    """A capture session breaks the capture contract; convert quarantines it instead of stopping."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class FormatError(DsbuildError):
    """A shard, manifest or index does not match its format."""


class LineageError(DsbuildError):
    """The catalog or a version in it is inconsistent."""


class StorageError(DsbuildError):
    """Writing the output failed (disk full, permissions, read-only file system): nothing was committed.

    Never a reason to quarantine a capture: the build stops, and re-running it after fixing the cause
    finishes the job."""
