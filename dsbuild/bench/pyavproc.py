"""One process of the N-process bare PyAV baseline (``baselines.PyAVProcs``):
``python -m dsbuild.bench.pyavproc SPEC``.

SPEC is one JSON object (nothing is pickled): ``{"clips": the clip file, "share": [[offset, length,
payload bytes], ...], "resize": [H, W] or null, "decoders": the processes decoding at once}``. The
process reads its share of the clip file into memory and answers ``{"ready": true}``; then, on each
``go SECONDS`` line, decodes its clips round and round (``decode_clip``: the thread baseline's loop too)
and reports ``{"n": [samples, frames, bytes]}`` done since its last report, about every ``REPORT_S``,
until a ``stop`` line, which it answers with its last counts and ``{"stopped": true}``. It exits when
its input closes, dies with its parent and ignores Ctrl-C (the parent handles it). A failure is
answered ``{"error": ...}`` before it exits.

It decodes in its only thread and looks for the parent's next line between frames (``Commands``): no
hand-over between threads can keep it from seeing a ``stop``. It also stops decoding by itself once
SECONDS have passed (the parent's slice and a margin), then waits for the ``stop``: on 2 cores, two
processes decoding with one FFmpeg thread each can keep the parent from the CPU altogether (seen under
the test suite's load: the parent runnable with no CPU time for 30 s and more), and the ``stop`` with it.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import select
import signal
import sys
import time
from collections.abc import Callable

from dsbuild.core.errors import FormatError, WorkerDied
from dsbuild.core.jsonio import loads_bounded
from dsbuild.formats.probe import STORED_OPEN, SWSCALE_THREADS, decoder_threads
from dsbuild.formats.sample import VIDEO_EXT

GO, STOP = b"go", b"stop\n"  # a go line: "go SECONDS\n"
READY, STOPPED = "ready", "stopped"
REPORT_S = 0.05  # counts reach the parent's meter this often (its samples are ~1 s apart)
POLL_S = 0.002  # the parent's input is looked at this often while decoding (a stop waits at most this)
MAX_LINE = 1 << 10  # an answer is a few numbers
MAX_GO_S = 1e6
MAX_SPEC = 16 << 20  # a share of a CLIP_BUDGET of clips, ~100 bytes a clip


def parse_spec(text: str) -> tuple[str, list[tuple[int, int, int]], tuple[int, int] | None, int]:
    """(clip file, share, resize, processes decoding at once) of a SPEC, validated."""
    doc = loads_bounded(text.encode(), max_bytes=MAX_SPEC, what="pyav process spec")
    share, resize, decoders = doc.get("share"), doc.get("resize"), doc.get("decoders")
    if (
        not isinstance(doc.get("clips"), str)
        or type(decoders) is not int
        or decoders < 1
        or not isinstance(share, list)
        or not share
        or not all(isinstance(p, list) and len(p) == 3 and all(isinstance(x, int) and x >= 0 for x in p) for p in share)
        or not (
            resize is None
            or (isinstance(resize, list) and len(resize) == 2 and all(isinstance(x, int) and x > 0 for x in resize))
        )
    ):
        raise FormatError(
            f"pyav process spec: expected clips, share [[offset, length, bytes], ...], resize, decoders: {text[:200]!r}"
        )
    return doc["clips"], [(a, n, b) for a, n, b in share], (resize[0], resize[1]) if resize else None, decoders


def go_line(seconds: float) -> bytes:
    """The ``go`` command: decode for at most ``seconds`` (then wait for the ``stop``)."""
    return b"%s %.3f\n" % (GO, seconds)


def parse_go(line: bytes) -> float | None:
    """The seconds of a ``go`` line; None for any other line."""
    word, _, rest = line.strip().partition(b" ")
    if word != GO:
        return None
    try:
        seconds = float(rest)
    except ValueError:
        raise FormatError(f"pyav process: expected 'go SECONDS', got {line[:100]!r}") from None
    if not 0 < seconds < MAX_GO_S:
        raise FormatError(f"pyav process: go for {seconds} s is not in (0, {MAX_GO_S})")
    return seconds


def parse_answer(line: bytes, until: str, what: str) -> list[float] | None:
    """A process's answer: its counts [samples, frames, bytes], or None for the ``until`` line; an error
    it reported is ``WorkerDied`` with its message."""
    doc = loads_bounded(line, max_bytes=MAX_LINE, what=what)
    if "error" in doc:
        raise WorkerDied(f"{what}: {doc['error']}")
    if doc.get(until) is True:
        return None
    counts = doc.get("n")
    if not (
        isinstance(counts, list)
        and len(counts) == 3
        and all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in counts)
    ):
        raise FormatError(f"{what}: expected {{'n': [samples, frames, bytes]}} or {until!r}, got {line[:200]!r}")
    return [float(x) for x in counts]


def read_share(path: str, share: list[tuple[int, int, int]]) -> list[tuple[bytes, int]]:
    """The share's clips in memory (each read exactly its length)."""
    clips = []
    with open(path, "rb") as f:
        for at, n, size in share:
            f.seek(at)
            clip = f.read(n)
            if len(clip) != n:
                raise FormatError(f"{path}: {n} bytes at {at} asked, {len(clip)} there")
            clips.append((clip, size))
    return clips


def decode_clip(
    clip: bytes,
    resize: tuple[int, ...] | None,
    keep: Callable[[object], None],
    decoded: Callable[[], bool],
    threads: int = 0,
) -> bool:
    """One clip through a bare PyAV loop: each frame to RGB at ``resize`` (H, W), given to ``keep``, then
    ``decoded()``, which returns True to stop. Returns whether the clip was decoded to its end.
    ``threads``: FFmpeg's decoding threads, shared out as the loader's worker processes share them
    (``decoder_threads``; 0: FFmpeg's own choice)."""
    import av
    from av.video.reformatter import VideoReformatter

    # One swscale thread per conversion, as the loader: PyAV's default made this loop 12-32% slower
    # here, and the baseline is the strongest loop
    width, height = (resize[1], resize[0]) if resize else (None, None)
    # opened as the loader opens clips: as MP4, without FFmpeg's probing decode of the first frame
    with av.open(io.BytesIO(clip), "r", format=VIDEO_EXT, options=STORED_OPEN) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        stream.codec_context.thread_count = threads
        rgb = VideoReformatter()  # one scaler per clip, as a careful PyAV user writes it
        for frame in container.decode(stream):
            keep(rgb.reformat(frame, format="rgb24", threads=SWSCALE_THREADS, width=width, height=height).to_ndarray())
            if decoded():
                return False
    return True


class Commands:
    """Lines on a file descriptor, read without a thread (the parent's commands here; each process's
    answers in the parent): ``next()`` waits for the next line, ``arrived()`` says without waiting whether
    one (or the end of the input) is there."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer, self.ended = fd, b"", False

    def _read(self, timeout: float | None) -> None:
        if select.select([self.fd], [], [], timeout)[0]:
            data = os.read(self.fd, 1 << 12)
            self.ended = not data
            self.buffer += data
            if b"\n" not in self.buffer and len(self.buffer) > MAX_LINE:
                raise FormatError(f"pyav process protocol: a line longer than {MAX_LINE} bytes: {self.buffer[:100]!r}")

    def arrived(self) -> bool:
        if b"\n" not in self.buffer and not self.ended:
            self._read(0)
        return b"\n" in self.buffer or self.ended

    def next(self) -> bytes:
        """The next line with its newline; b"" once the input has ended."""
        while b"\n" not in self.buffer and not self.ended:
            self._read(None)
        if b"\n" not in self.buffer:
            return b""
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line + b"\n"


def stop_at(commands: Commands, seconds: float) -> Callable[[], bool]:
    """Whether to stop: a line from the parent has arrived, or ``seconds`` from now have passed."""
    deadline = time.perf_counter() + seconds
    return lambda: commands.arrived() or time.perf_counter() >= deadline


def decode_until(
    clips: list[tuple[bytes, int]],
    resize: tuple[int, int] | None,
    stop: Callable[[], bool],
    report: Callable,
    threads: int = 0,
) -> None:
    """The clips round and round until ``stop()`` (asked about every ``POLL_S``); ``report(samples,
    frames, bytes)`` of the work since the last report, about every ``REPORT_S`` and once at the end."""
    counts = [0, 0, 0]
    last = polled = time.perf_counter()

    def flush() -> None:
        nonlocal last
        report(*counts)
        counts[:] = [0, 0, 0]
        last = time.perf_counter()

    def decoded() -> bool:
        nonlocal polled
        counts[1] += 1
        now = time.perf_counter()
        if now - last >= REPORT_S:
            flush()
        if now - polled < POLL_S:
            return False
        polled = now
        return stop()

    for clip, size in itertools.cycle(clips):
        if not decode_clip(clip, resize, lambda frame: None, decoded, threads):
            break
        counts[0] += 1
        counts[2] += size
        if stop():
            break
    flush()


def main(argv: list[str]) -> None:
    from dsbuild.core.executor import _die_with_parent

    _die_with_parent(os.getppid(), ())  # (and Ctrl-C ignored: the parent's to handle)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the protocol

    def answer(doc: dict) -> None:
        out.write(json.dumps(doc) + "\n")
        out.flush()

    def report(samples: float, frames: float, nbytes: float) -> None:
        answer({"n": [samples, frames, nbytes]})

    try:
        path, share, resize, decoders = parse_spec(argv[0] if argv else "")
        clips = read_share(path, share)
        import av  # noqa: F401 (imported at start-up, not in the first measurement)

        commands = Commands(sys.stdin.fileno())
        answer({READY: True})
        while line := commands.next():
            seconds = parse_go(line)
            if seconds is None:
                continue
            decode_until(clips, resize, stop_at(commands, seconds), report, decoder_threads(decoders))
            ended = commands.next()  # STOP (or the input closed)
            answer({STOPPED: True})
            if ended != STOP:
                return
    except Exception as e:
        answer({"error": f"{type(e).__name__}: {e}"})
        sys.exit(1)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    main(sys.argv[1:])
