"""The JSON Lines streams of a capture (actions, telemetry, text), read defensively.

Real captures are messy. Damage that can be repaired is repaired and counted in a ``StreamReport``
(malformed lines dropped, events sorted, NaN and non-numeric telemetry fields dropped); nothing is
dropped without a count. Lines are read with a length bound, so one gigabyte-long line costs memory
of the bound, not of the line.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from dsbuild.formats.safejson import MAX_DEPTH, _depth_ok, finite_float

MAX_LINE_BYTES = 1 << 20  # one event; a longer line is malformed, not a reason to run out of memory
MAX_CONTROLS = 1024
MAX_LIST_LEN = 4096
MAX_NAME_CHARS = 128
MAX_EXAMPLES = 5  # malformed-line reasons kept per stream for the report


@dataclass
class StreamReport:
    """What was wrong with one stream file and what we did about it."""

    lines: int = 0
    events: int = 0
    malformed: int = 0
    out_of_order: int = 0
    dropped_fields: int = 0
    missing: bool = False
    examples: list[str] = field(default_factory=list)

    def bad(self, lineno: int, reason: str) -> None:
        self.malformed += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"line {lineno}: {reason}")

    def to_json(self) -> dict:
        return {
            "lines": self.lines,
            "events": self.events,
            "malformed": self.malformed,
            "out_of_order": self.out_of_order,
            "dropped_fields": self.dropped_fields,
            "missing": self.missing,
            "examples": list(self.examples),
        }

    @property
    def repaired(self) -> bool:
        return bool(self.malformed or self.out_of_order or self.dropped_fields or self.missing)


def _nan_constant(_name: str) -> float:
    return math.nan


def iter_json_lines(path: Path, report: StreamReport) -> Iterator[tuple[int, dict]]:
    """Yield (line number, object) for every well-formed line; count and describe the others."""
    with open(path, "rb") as f:
        lineno = 0
        while True:
            line = f.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            lineno += 1
            report.lines += 1
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while (rest := f.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                    pass
                report.bad(lineno, f"longer than {MAX_LINE_BYTES} bytes")
                continue
            line = line.strip()
            if not line:
                report.lines -= 1
                continue
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                report.bad(lineno, f"invalid UTF-8 at byte {e.start}")
                continue
            if not _depth_ok(text, MAX_DEPTH):
                report.bad(lineno, f"nested deeper than {MAX_DEPTH}")
                continue
            try:
                obj = json.loads(text, parse_constant=_nan_constant)
            except (ValueError, RecursionError) as e:
                report.bad(lineno, f"invalid JSON ({e.msg if hasattr(e, 'msg') else e})")
                continue
            if not isinstance(obj, dict):
                report.bad(lineno, "not a JSON object")
                continue
            t = finite_float(obj.get("t"))
            if t is None:
                report.bad(lineno, "missing or non-finite 't'")
                continue
            obj["t"] = t
            yield lineno, obj


def _stable_order(times: list[float], report: StreamReport) -> np.ndarray:
    """Indices that sort events by time, ties kept in file order; counts events that were out of order."""
    t = np.asarray(times, dtype=np.float64)
    if len(t) > 1:
        report.out_of_order = int(np.count_nonzero(np.diff(t) < 0))
    return np.argsort(t, kind="stable")


@dataclass(frozen=True)
class Actions:
    """Controller events sorted by time. ``controls`` is the sorted vocabulary of this session."""

    controls: tuple[str, ...]
    t: np.ndarray  # float64 [N]
    control: np.ndarray  # int32 [N], index into controls
    value: np.ndarray  # float32 [N]

    @classmethod
    def empty(cls) -> "Actions":
        return cls((), np.zeros(0), np.zeros(0, np.int32), np.zeros(0, np.float32))


def read_actions(path: Path | None) -> tuple[Actions, StreamReport]:
    report = StreamReport()
    if path is None or not path.is_file():
        report.missing = True
        return Actions.empty(), report
    times, names, values = [], [], []
    vocab: set[str] = set()
    for lineno, obj in iter_json_lines(path, report):
        control, value = obj.get("control"), finite_float(obj.get("value"))
        if not isinstance(control, str) or not control or len(control) > MAX_NAME_CHARS:
            report.bad(lineno, "'control' must be a non-empty string")
            continue
        if value is None or not -1.0 <= value <= 1.0:
            report.bad(lineno, "'value' must be a finite number in [-1, 1]")
            continue
        if control not in vocab and len(vocab) >= MAX_CONTROLS:
            report.bad(lineno, f"more than {MAX_CONTROLS} distinct controls")
            continue
        vocab.add(control)
        times.append(obj["t"])
        names.append(control)
        values.append(value)
    order = _stable_order(times, report)
    controls = tuple(sorted(vocab))
    col = {c: i for i, c in enumerate(controls)}
    report.events = len(times)
    return (
        Actions(
            controls=controls,
            t=np.asarray(times, np.float64)[order],
            control=np.asarray([col[n] for n in names], np.int32)[order],
            value=np.asarray(values, np.float32)[order],
        ),
        report,
    )


@dataclass(frozen=True)
class Telemetry:
    """Telemetry channels, each with its own sample times (fields may be sparse). Lists become name.i."""

    channels: tuple[str, ...]
    t: tuple[np.ndarray, ...]  # per channel, float64, sorted
    v: tuple[np.ndarray, ...]  # per channel, float32, finite

    @classmethod
    def empty(cls) -> "Telemetry":
        return cls((), (), ())


def _numeric_list(value: list) -> list[float] | None:
    if len(value) > MAX_LIST_LEN:
        return None
    out = []
    for x in value:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return None
        out.append(float(x))
    return out


def read_telemetry(path: Path | None) -> tuple[Telemetry, StreamReport]:
    report = StreamReport()
    if path is None or not path.is_file():
        report.missing = True
        return Telemetry.empty(), report
    samples: dict[str, list[tuple[float, float]]] = defaultdict(list)
    times = []
    for lineno, obj in iter_json_lines(path, report):
        t = obj["t"]
        times.append(t)
        for name, value in obj.items():
            if name == "t":
                continue
            if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS or len(samples) > MAX_CONTROLS:
                report.dropped_fields += 1
                continue
            if isinstance(value, list):
                nums = _numeric_list(value)
                if nums is None:
                    report.dropped_fields += 1
                    continue
                for i, x in enumerate(nums):
                    if math.isfinite(x):
                        samples[f"{name}.{i}"].append((t, x))
                    else:
                        report.dropped_fields += 1
            else:
                x = finite_float(value)
                if x is None:
                    report.dropped_fields += 1
                    continue
                samples[name].append((t, x))
    _stable_order(times, report)
    report.events = len(times)
    channels = tuple(sorted(samples, key=_channel_sort_key))
    ts, vs = [], []
    for ch in channels:
        arr = np.asarray(samples[ch], dtype=np.float64).reshape(-1, 2)
        order = np.argsort(arr[:, 0], kind="stable")
        ts.append(arr[order, 0])
        vs.append(arr[order, 1].astype(np.float32))
    return Telemetry(channels, tuple(ts), tuple(vs)), report


def _channel_sort_key(name: str) -> tuple:
    """'pos.10' sorts after 'pos.2': list elements in index order, everything else by name."""
    base, _, idx = name.rpartition(".")
    if base and idx.isdigit():
        return (base, int(idx))
    return (name, -1)


@dataclass(frozen=True)
class TextEvent:
    t: float
    speaker: str | None
    text: str

    def to_json(self) -> dict:
        return {"t": self.t, "speaker": self.speaker, "text": self.text}


def read_text(path: Path | None) -> tuple[tuple[TextEvent, ...], StreamReport]:
    report = StreamReport()
    if path is None or not path.is_file():
        report.missing = True
        return (), report
    events = []
    for lineno, obj in iter_json_lines(path, report):
        text, speaker = obj.get("text"), obj.get("speaker")
        if not isinstance(text, str):
            report.bad(lineno, "'text' must be a string")
            continue
        if speaker is not None and not isinstance(speaker, str):
            report.bad(lineno, "'speaker' must be a string")
            continue
        events.append(TextEvent(obj["t"], speaker, text))
    order = _stable_order([e.t for e in events], report)
    report.events = len(events)
    return tuple(events[i] for i in order), report
