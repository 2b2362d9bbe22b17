"""atheris harness: session.json and the three JSONL streams never crash the capture reader."""

import sys
import tempfile
from pathlib import Path

import atheris
import numpy as np

with atheris.instrument_imports():
    from dsbuild.core.errors import CaptureError
    from dsbuild.formats.capture import read_session
    from dsbuild.formats.streams import KINDS, ActionTrack, TelemetryTrack, TextTrack, scan

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
    for kind, track in zip(KINDS, (ActionTrack, TelemetryTrack, TextTrack)):
        s = scan(SESSION / "stream.jsonl", kind)
        t = track(s)
        if kind == "text":
            t.clip(0.0, 1e9)
        else:
            t.clip(np.linspace(0, 100, 7), 0.0, 1e9)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
