"""atheris harness: session.json and the three JSONL streams never crash the capture reader."""

import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from dsbuild.core.errors import CaptureError
    from dsbuild.formats.capture import read_session
    from dsbuild.formats.streams import read_actions, read_telemetry, read_text

ROOT = Path(tempfile.mkdtemp(prefix="dsbuild-fuzz-"))
SESSION = ROOT / "s"
SESSION.mkdir()


def one(data: bytes) -> None:
    (SESSION / "session.json").write_bytes(data)
    (SESSION / "stream.jsonl").write_bytes(data)
    try:
        read_session(SESSION, ROOT)
    except CaptureError:
        pass
    for reader in (read_actions, read_telemetry, read_text):
        reader(SESSION / "stream.jsonl")


if __name__ == "__main__":
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
