"""What every importer shares: the report (every drop and guess counted, problems named with file and
line), session ids, writing one session folder by the capture contract, and publishing the output folder
whole (a temporary folder beside it, renamed at the end: nothing half-written after Ctrl-C)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from dsbuild.core.errors import UsageError
from dsbuild.formats.capture import CAPTURE_FORMAT, SESSION_FILE, session_problems

MAX_PROBLEMS = 20  # problems named per session in the report (all are counted)
MAX_LINE_BYTES = 1 << 20  # one line of an input log: a longer one is named and dropped
_ID_BAD = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass
class SessionReport:
    """One imported session: where it came from, what it holds, and every drop and guess."""

    session_id: str
    source: str
    duration: float = 0.0
    actions: int = 0
    telemetry: int = 0
    dropped: Counter = field(default_factory=Counter)  # what -> how many (lines, cells, messages)
    guessed: Counter = field(default_factory=Counter)  # what -> how many values were not given but guessed
    problems: list[str] = field(default_factory=list)  # the first MAX_PROBLEMS, "file:line: reason"

    def drop(self, what: str, where: str, reason: str) -> None:
        self.dropped[what] += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"{where}: {reason}")

    def to_json(self) -> dict:
        return {
            "session_id": self.session_id,
            "source": self.source,
            "duration": self.duration,
            "actions": self.actions,
            "telemetry": self.telemetry,
            "dropped": dict(sorted(self.dropped.items())),
            "guessed": dict(sorted(self.guessed.items())),
            "problems": list(self.problems),
        }


@dataclass
class ImportReport:
    """The whole run: the sessions written, the inputs refused (file and reason), and the totals."""

    source: str
    output: str
    sessions: list[SessionReport] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    ignored: int = 0  # files that are not inputs of this importer (neither a video nor a sidecar)

    def totals(self, what: str) -> dict[str, int]:
        total: Counter = Counter()
        for s in self.sessions:
            total.update(getattr(s, what))
        return dict(sorted(total.items()))

    @property
    def drops(self) -> int:
        return sum(self.totals("dropped").values())

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "output": self.output,
            "sessions": [s.to_json() for s in self.sessions],
            "failed": [{"file": f, "reason": r} for f, r in self.failed],
            "ignored": self.ignored,
            "dropped": self.totals("dropped"),
            "guessed": self.totals("guessed"),
        }


def session_id(name: str, taken: set[str]) -> tuple[str, bool]:
    """A capture session id (``[A-Za-z0-9_-]{1,64}``, unique among ``taken``) from a name, and whether it
    had to change: other characters become '-', a long or repeated one ends in a hash of the name."""
    base = _ID_BAD.sub("-", name).strip("-") or "session"
    sid = base
    if len(sid) > 64 or sid in taken:
        digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:8]
        sid = f"{base[:55]}-{digest}"
        n = 1
        while sid in taken:
            n += 1
            sid = f"{base[:52]}-{digest}-{n}"
    taken.add(sid)
    return sid, sid != name


def jsonl(events: Iterable[dict]) -> bytes:
    """JSON Lines as the contract reads them; the same events give the same bytes."""
    return b"".join(json.dumps(e, ensure_ascii=False, separators=(", ", ": ")).encode() + b"\n" for e in events)


def write_session(folder: Path, doc: dict, streams: dict[str, bytes], video: Path | None = None) -> None:
    """One session folder: ``session.json`` (checked against the published schema first: an importer
    that writes a session ``convert`` would quarantine is a bug), its streams, and the video copied."""
    doc = {"format": CAPTURE_FORMAT, **doc}
    if streams:
        doc["streams"] = {kind: f"{kind}.jsonl" for kind in sorted(streams)}
    folder.mkdir(parents=True)
    problems = session_problems(doc, folder)
    if problems:
        raise AssertionError(f"importer wrote an invalid session.json: {'; '.join(problems)}")
    (folder / SESSION_FILE).write_bytes(json.dumps(doc, ensure_ascii=False, indent=2).encode() + b"\n")
    for kind, data in sorted(streams.items()):
        (folder / f"{kind}.jsonl").write_bytes(data)
    if video is not None:
        shutil.copyfile(video, folder / doc["video"])


class H264Writer:
    """H.264 streams in one MP4 at the frames' own times (``pts`` on ``time_base``: variable frame rate
    kept), keyframes exactly every second (convert cuts clips there), bit-exact: the same frames give the
    same bytes. Add every stream (``add_stream``, from its first frame) before the first frame."""

    def __init__(self, path: Path, time_base: Fraction, crf: int):
        import av

        self.container = av.open(str(path), "w", format="mp4", options={"fflags": "+bitexact"})
        self.time_base, self.crf = time_base, crf
        self.streams: list = []

    def add_stream(self, first, rate: Fraction) -> int:
        """A stream the size of ``first`` (cut to even), at nominal ``rate``; its index for ``add``."""
        import av

        stream = self.container.add_stream("libx264", rate=rate)
        stream.width, stream.height = first.width - first.width % 2, first.height - first.height % 2
        stream.pix_fmt = "yuv420p"
        stream.time_base = stream.codec_context.time_base = self.time_base
        gop = str(max(1, round(rate)))
        stream.codec_context.options = {
            "crf": str(self.crf),
            "g": gop,
            "keyint_min": gop,
            "x264-params": "scenecut=0",  # no keyframe but every second's: clips are cut at those
            "threads": "1",
        }
        stream.codec_context.flags |= int(av.codec.context.Flags.bitexact)
        self.streams.append(stream)
        return len(self.streams) - 1

    def add(self, frame, pts: int, stream: int = 0) -> None:
        s = self.streams[stream]
        frame = frame.reformat(width=s.width, height=s.height, format="yuv420p")
        frame.pts, frame.time_base = pts, self.time_base
        self.container.mux(s.encode(frame))

    def close(self) -> None:
        for s in self.streams:
            self.container.mux(s.encode())
        self.container.close()


def check_output(dest: Path) -> None:
    """Refuse an output that exists and is not an empty folder: captures are published whole, never mixed
    into an earlier import."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"{dest}: already exists and is not an empty folder", hint="name a new folder")


@contextmanager
def staged(dest: Path) -> Iterator[Path]:
    """A temporary folder beside ``dest``, renamed to ``dest`` when the block ends normally and removed
    when it does not (an error, Ctrl-C): ``dest`` appears whole or not at all."""
    check_output(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.importing-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        check_output(dest)
        if dest.is_dir():
            dest.rmdir()
        os.rename(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_lines(path: Path) -> Iterator[tuple[int, str | None]]:
    """(line number, text without its line end) of a text file, read with a length bound; None for a line
    over ``MAX_LINE_BYTES`` or not UTF-8 (the caller names it). Blank lines are skipped."""
    with open(path, "rb") as f:
        lineno = 0
        while line := f.readline(MAX_LINE_BYTES + 1):
            lineno += 1
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while (rest := f.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                    pass
                yield lineno, None
                continue
            try:
                text = line.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                yield lineno, None
                continue
            if text.strip():
                yield lineno, text
