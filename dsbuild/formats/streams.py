"""The JSON Lines streams of a capture (actions, telemetry, text), read defensively and in bounded memory.

Real captures are messy. Damage that can be repaired is repaired and counted in a ``StreamReport``
(malformed lines dropped, events sorted, NaN and non-numeric telemetry fields dropped, duplicate keys
and list/flat name collisions resolved); nothing is dropped without a count.

Memory does not grow with the session. A stream is read twice, both times as a stream of lines:
``scan`` learns the vocabulary, each telemetry channel's first value and how far events ever arrive
out of order (the *lag*); ``EventStream`` then hands events to the clips in time order through a
reorder buffer that holds only events younger than the lag. A sorted stream (the normal case) holds
no more than the current clip's events; a stream shuffled end to end holds what it must.
Lines are read with a length bound, so one gigabyte-long line costs memory of the bound.
"""

from __future__ import annotations

import functools
import heapq
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from dsbuild.core.files import open_regular
from dsbuild.core.jsonio import MAX_DEPTH, clip_text, depth_ok, finite_float, repeated_key

MAX_LINE_BYTES = 1 << 20  # one event; a longer line is malformed, not a reason to run out of memory
MAX_CONTROLS = 1024  # distinct controls, or telemetry channels, per session
MAX_LIST_LEN = 4096
MAX_NAME_CHARS = 128
MAX_EXAMPLES = 5  # malformed-line reasons kept per stream for the report
# Streams up to this size keep pass 1's events for pass 2 (one parse instead of two); bigger ones are
# read again, so memory stays bounded (about ten times this, as Python objects) whatever the session.
RETAIN_BYTES = 8 << 20
KINDS = ("actions", "telemetry", "text")


@dataclass
class StreamReport:
    """What was wrong with one stream file and what we did about it."""

    lines: int = 0
    events: int = 0
    malformed: int = 0  # lines dropped whole: invalid JSON, not an object, no finite t, a field of the wrong
    # type or out of range (convert warns, and validate's max_dropped_fraction judges, malformed / lines)
    out_of_order: int = 0  # events that arrived after a later one (each is counted)
    dropped_fields: int = 0
    duplicate_keys: int = 0  # lines with a key given twice (the last value is kept, as JSON parsers do)
    collisions: int = 0  # a list field `pos` beside a flat `pos.0` in one line (the list wins)
    outside_video: int = 0  # events in no clip: after the video's last one (text: or before its first);
    # counted, not a repair: input loggers routinely run a little past the video
    missing: bool = False  # session.json names the stream and its file is not there (a stream it does
    # not name is absent, not missing: every stream is optional)
    unreadable: str | None = None
    examples: list[str] = field(default_factory=list)

    def bad(self, lineno: int, reason: str) -> None:
        self.malformed += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"line {lineno}: {clip_text(reason, 160)}")

    def to_json(self) -> dict:
        return {
            "lines": self.lines,
            "events": self.events,
            "malformed": self.malformed,
            "out_of_order": self.out_of_order,
            "dropped_fields": self.dropped_fields,
            "duplicate_keys": self.duplicate_keys,
            "collisions": self.collisions,
            "outside_video": self.outside_video,
            "missing": self.missing,
            "unreadable": self.unreadable,
            "examples": list(self.examples),
        }

    @staticmethod
    def recorded_drops(repairs: object) -> dict[str, tuple[int, int, tuple[str, ...]]]:
        """(lines, lines dropped, the first reasons) of each stream in a session's recorded repairs
        (``to_json`` under each kind, as in ``sessions.json``); a stream without a record is left out."""
        out = {}
        for kind in KINDS:
            rep = repairs.get(kind) if isinstance(repairs, dict) else None
            if isinstance(rep, dict):
                lines, dropped, examples = rep.get("lines"), rep.get("malformed"), rep.get("examples")
                out[kind] = (
                    lines if type(lines) is int else 0,
                    dropped if type(dropped) is int else 0,
                    tuple(map(str, examples)) if isinstance(examples, list) else (),
                )
        return out

    @property
    def repaired(self) -> bool:
        return bool(
            self.malformed
            or self.out_of_order
            or self.dropped_fields
            or self.duplicate_keys
            or self.collisions
            or self.missing
            or self.unreadable
        )


# -- lines -> validated events --------------------------------------------------------------------------
def _key_count(v: object) -> int:
    if isinstance(v, dict):
        return len(v) + sum(_key_count(x) for x in v.values() if isinstance(x, (dict, list)))
    if isinstance(v, list):
        return sum(_key_count(x) for x in v if isinstance(x, (dict, list)))
    return 0


def _nan(_name: str) -> float:
    return math.nan


_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")  # a surrogate escape in a line: json accepts a lone one
F32_MAX = float(np.finfo(np.float32).max)  # telemetry is stored as float32: beyond this it would be inf
_INT_EXACT = 1 << 53  # ints a float holds exactly; beyond, finite_float decides (and refuses huge ones)


def _finite(v: object) -> float | None:
    """finite_float with a fast path for the plain floats and ints events are made of."""
    if type(v) is float:
        return v if v - v == 0.0 else None  # inf - inf and nan - nan are nan
    if type(v) is int and -_INT_EXACT <= v <= _INT_EXACT:
        return float(v)
    return finite_float(v)


def _parse(line: bytes, lineno: int, report: StreamReport | None) -> dict | None:
    """One line -> a JSON object with a finite ``t``, or None (counted in ``report`` when given).

    Depth and duplicate keys are decided by counting bytes where that settles it (no more brackets
    than the depth limit; no more ``":`` than keys), and by walking the object only when it does not."""

    def bad(reason: str) -> None:
        if report is not None:
            report.bad(lineno, reason)

    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        try:  # the slow path, only for lines orjson refuses: non-standard NaN/Infinity are repairable
            obj = json.loads(line, parse_constant=_nan)
            if _SURROGATE.search(line):  # paired escapes became one character; a lone one is no text
                json.dumps(obj, ensure_ascii=False).encode()
        except UnicodeDecodeError as u:
            bad(f"invalid UTF-8 at byte {u.start}")
            return None
        except UnicodeEncodeError:
            bad("a string holds a lone surrogate escape (not Unicode text)")
            return None
        except (ValueError, RecursionError):
            bad("nested deeper than 1024" if "depth" in str(e) else f"invalid JSON ({e})")
            return None
    if type(obj) is not dict:
        bad("not a JSON object")
        return None
    braces = line.count(b"{")
    if braces + line.count(b"[") > MAX_DEPTH and not depth_ok(obj, MAX_DEPTH):
        bad(f"nested deeper than {MAX_DEPTH}")
        return None
    keys = len(obj) if braces == 1 else _key_count(obj)
    if line.count(b'":') > keys and repeated_key(line) is not None and report is not None:
        report.duplicate_keys += 1
    t = _finite(obj.get("t"))
    if t is None:
        bad("missing or non-finite 't'")
        return None
    obj["t"] = t
    return obj


def _action(obj: dict, continuous: frozenset[str]) -> tuple | str:
    """(t, control, value): a button or axis in [-1, 1], or a control the session declares continuous
    (any finite float32: a robot's joint target in radians)."""
    control, value = obj.get("control"), _finite(obj.get("value"))
    if not isinstance(control, str) or not control or len(control) > MAX_NAME_CHARS:
        return "'control' must be a non-empty string"
    if control in continuous:
        if value is None or not -F32_MAX <= value <= F32_MAX:
            return "'value' must be a finite number within float32 (a continuous control)"
    elif value is None or not -1.0 <= value <= 1.0:
        return "'value' must be a finite number in [-1, 1]"
    return (obj["t"], control, value)


def _text(obj: dict, continuous: frozenset[str]) -> tuple | str:
    text, speaker = obj.get("text"), obj.get("speaker")
    if not isinstance(text, str):
        return "'text' must be a string"
    if speaker is not None and not isinstance(speaker, str):
        return "'speaker' must be a string"
    return (obj["t"], speaker, text)


_NUMBER_TYPES = frozenset((int, float))  # bools are not numbers: type(True) is bool
_LIST_NAMES: dict[tuple[str, int], tuple[str, ...]] = {}
_LIST_NAMES_MAX = 4096  # distinct (list name, length) pairs kept; hostile streams only cost a refill


def _numeric_list(value: list) -> np.ndarray | None:
    """A list of plain numbers as float64, or None (anything else in it, too long, or an integer beyond
    the float range)."""
    if len(value) > MAX_LIST_LEN or not set(map(type, value)) <= _NUMBER_TYPES:
        return None
    try:
        return np.array(value, dtype=np.float64)
    except OverflowError:
        return None


def _list_names(name: str, n: int) -> tuple[str, ...]:
    """``name.0`` ... ``name.{n-1}``, built once per list shape (telemetry repeats its shapes every line)."""
    names = _LIST_NAMES.get((name, n))
    if names is None:
        if len(_LIST_NAMES) >= _LIST_NAMES_MAX:
            _LIST_NAMES.clear()
        names = _LIST_NAMES[(name, n)] = tuple(f"{name}.{i}" for i in range(n))
    return names


def _telemetry(obj: dict, report: StreamReport | None) -> tuple:
    """(t, channel names, float64 values): lists become ``name.i``; NaN, infinite, beyond float32's range
    (``F32_MAX``: stored, it would be inf), non-numeric and colliding fields dropped. A line stays arrays,
    not a dict per channel: a list's names are one shared tuple per shape, and later stages key their
    column layouts by a line's names (128-byte RAM dumps at 60 Hz are the field's telemetry)."""
    dropped = 0
    names: tuple[str, ...] = ()
    parts: list[np.ndarray] = []
    flat_names: list[str] = []
    flat_values: list[float] = []
    for name, value in obj.items():
        if name == "t":
            continue
        if not name or len(name) > MAX_NAME_CHARS:
            dropped += 1
        elif isinstance(value, list):
            nums = _numeric_list(value)
            if nums is None:
                dropped += 1
                continue
            listed = _list_names(name, len(nums))
            finite = np.abs(nums) <= F32_MAX  # (NaN compares false)
            if not finite.all():
                dropped += int(len(nums) - finite.sum())
                listed = tuple(n for n, ok in zip(listed, finite.tolist()) if ok)
                nums = nums[finite]
            names = listed if not names else names + listed
            parts.append(nums)
        else:
            x = _finite(value)
            if x is None or not -F32_MAX <= x <= F32_MAX:
                dropped += 1
            else:
                flat_names.append(name)
                flat_values.append(x)
    collided = 0
    if flat_names:  # after the lists, so `pos: [..]` beside `pos.0` is a counted collision (the list wins)
        if names and any("." in n for n in flat_names):
            taken = set(names)
            kept = [k for k, n in enumerate(flat_names) if n not in taken]
            collided = len(flat_names) - len(kept)
            flat_names, flat_values = [flat_names[k] for k in kept], [flat_values[k] for k in kept]
        names += tuple(flat_names)
        parts.append(np.array(flat_values, dtype=np.float64))
    if report is not None:
        report.dropped_fields += dropped
        report.collisions += collided
    values = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.empty(0)
    return (obj["t"], names, values)


# -- telemetry a run of lines at a time ------------------------------------------------------------------
# Telemetry repeats one layout every line (a RAM dump and a few counters at 60 Hz). Consecutive lines of one
# layout are converted together: one numpy conversion of the run instead of a dozen calls per line. A run
# takes this road only where ``_telemetry`` would keep every field as it is; any line of it that would lose
# or change a field sends the whole run line by line, so the events are the same either way (tested).
RUN_LINES = 256  # lines converted at once: bounds the run's Python objects
_BOOLS = (b"true", b"false")  # a bool parses as a number in numpy; a line whose bytes hold neither has none


def _layout_key(obj: dict) -> tuple:
    """A line's layout: its keys in order and each list's length (-1: not a list)."""
    return tuple(obj), tuple([len(v) if type(v) is list else -1 for v in obj.values()])


@functools.lru_cache(maxsize=_LIST_NAMES_MAX)  # (hostile streams with a new layout every line only refill it)
def _run_layout(key: tuple) -> tuple | None:
    """(channel names, list keys, flat keys) of a layout, or None when ``_telemetry`` would drop or
    rename something whatever the values: a name empty or too long, a flat ``pos.0`` beside a list
    ``pos`` (a collision)."""
    keys, lens = key
    lists = [(k, n) for k, n in zip(keys, lens) if n >= 0 and k != "t"]
    flat = [k for k, n in zip(keys, lens) if n < 0 and k != "t"]
    names = tuple(name for k, n in lists for name in _list_names(k, n)) + tuple(flat)
    ok = all(k and len(k) <= MAX_NAME_CHARS for k in keys if k != "t") and len(set(names)) == len(names)
    return (names, tuple(k for k, _ in lists), tuple(flat)) if ok else None


def _telemetry_run(run: list[tuple[bytes, dict]], layout: tuple | None, report: StreamReport | None) -> list[tuple]:
    """The events of consecutive lines of one layout: converted at once when every value is a finite
    number within float32's range (what ``_telemetry`` keeps unchanged), else line by line."""
    if layout is not None and len(run) > 1 and not _holds_bool(run):
        names, lists, flat = layout
        rows = []
        for _, obj in run:
            row: list = []
            for k in lists:
                row += obj[k]
            row += [obj[k] for k in flat]
            rows.append(row)
        try:  # numbers only: a string, null, object or nested list makes no numeric 2-D array
            values = np.array(rows)
        except (ValueError, OverflowError):
            values = None
        if values is not None and values.ndim == 2 and values.dtype.kind in "if":
            values = values.astype(np.float64, copy=False)
            if bool((np.abs(values) <= F32_MAX).all()):  # (NaN compares false)
                return [(obj["t"], names, row) for (_, obj), row in zip(run, values)]
    return [_telemetry(obj, report) for _, obj in run]


def _holds_bool(run: list[tuple[bytes, dict]]) -> bool:
    """Whether a run's lines may hold a bool (their bytes spell one: a key or string may, harmlessly)."""
    text = b"\n".join(line for line, _ in run)
    return any(b in text for b in _BOOLS)


def _telemetry_events(lines: Iterator[tuple[int, bytes]], report: StreamReport | None) -> Iterator[tuple]:
    """``_telemetry`` of every valid line, in file order, a run of one layout at a time."""
    run: list[tuple[bytes, dict]] = []
    key = None
    for lineno, line in lines:
        obj = _parse(line, lineno, report)
        if obj is None:
            continue
        k = _layout_key(obj)
        if run and (k != key or len(run) >= RUN_LINES):
            yield from _telemetry_run(run, _run_layout(key), report)
            run = []
        key = k
        run.append((line, obj))
    if run:
        yield from _telemetry_run(run, _run_layout(key), report)


def _lines(path: Path, root: Path | None, report: StreamReport | None) -> Iterator[tuple[int, bytes]]:
    with open_regular(path, root) as f:
        lineno = 0
        while line := f.readline(MAX_LINE_BYTES + 1):
            lineno += 1
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while (rest := f.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                    pass
                if report is not None:
                    report.lines += 1
                    report.bad(lineno, f"longer than {MAX_LINE_BYTES} bytes")
                continue
            line = line.strip()
            if line:
                if report is not None:
                    report.lines += 1
                yield lineno, line


def events(
    path: Path,
    kind: str,
    root: Path | None = None,
    report: StreamReport | None = None,
    continuous: frozenset[str] = frozenset(),
) -> Iterator[tuple]:
    """Validated events of a stream in file order: (t, control, value), (t, channel names, float64
    values) or (t, speaker, text). Problems are counted in ``report`` when one is given; ``continuous``:
    the controls the session declares continuous (their values are not held to [-1, 1])."""
    if kind == "telemetry":
        yield from _telemetry_events(_lines(path, root, report), report)
        return
    for lineno, line in _lines(path, root, report):
        obj = _parse(line, lineno, report)
        if obj is None:
            continue
        ev = (_action if kind == "actions" else _text)(obj, continuous)
        if isinstance(ev, str):
            if report is not None:
                report.bad(lineno, ev)
            continue
        yield ev


# -- pass 1: what the stream holds ------------------------------------------------------------------------
@dataclass
class StreamScan:
    """What pass 1 learnt: vocabulary (controls or channels, sorted), the first value of each telemetry
    channel, and the largest lag (seconds an event arrived after a later one)."""

    kind: str
    path: Path | None
    names: tuple[str, ...] = ()
    first: dict[str, float] = field(default_factory=dict)
    lag: float = 0.0
    report: StreamReport = field(default_factory=StreamReport)
    retained: list[tuple] | None = None  # pass 1's events in file order, for small streams
    continuous: frozenset[str] = frozenset()  # actions: the controls the session declares continuous


def scan(
    path: Path | None, kind: str, root: Path | None = None, continuous: frozenset[str] = frozenset()
) -> StreamScan:
    """Pass 1 over a stream: ``path`` None when the session names none (absent, nothing to report); a
    named file that is not there is counted as missing. OSErrors (permission denied) propagate.
    ``continuous``: the controls the session declares continuous (actions)."""
    out = StreamScan(kind, path, continuous=continuous)
    rep = out.report
    if path is None or not path.exists():
        rep.missing = path is not None
        return out
    names: set[str] = set()
    latest = -math.inf
    refused: set[str] = set()
    first_t: dict[str, float] = {}
    keep: list[tuple] | None = [] if path.stat().st_size <= RETAIN_BYTES else None
    known: set[tuple[str, ...]] = set()  # telemetry line layouts whose every channel has a first reading
    for ev in events(path, kind, root, rep, continuous):
        if keep is not None:
            keep.append(ev)
        t = ev[0]
        in_order = t >= latest
        if not in_order:
            rep.out_of_order += 1
            out.lag = max(out.lag, latest - t)
        latest = max(latest, t)
        rep.events += 1
        if kind == "actions":
            if ev[1] not in names:
                if len(names) >= MAX_CONTROLS:
                    refused.add(ev[1])
                    continue
                names.add(ev[1])
        elif kind == "telemetry":
            if in_order and ev[1] in known:
                continue  # the common line: no new channel, and no earlier reading of a known one
            for ch, x in zip(ev[1], ev[2].tolist()):
                if ch not in out.first and len(out.first) >= MAX_CONTROLS:
                    rep.dropped_fields += 1
                elif ch not in out.first or t < first_t[ch]:  # the earliest reading, also out of order
                    out.first[ch], first_t[ch] = x, t
            if out.first.keys() >= set(ev[1]):
                if len(known) >= _LIST_NAMES_MAX:  # a hostile stream with a new layout every line
                    known.clear()
                known.add(ev[1])
    if refused:
        rep.dropped_fields += len(refused)
        rep.examples.append(f"more than {MAX_CONTROLS} distinct controls; {len(refused)} ignored")
    out.names = tuple(sorted(names)) if kind == "actions" else tuple(sorted(out.first, key=channel_sort_key))
    out.retained = keep
    return out


def channel_sort_key(name: str) -> tuple:
    """'pos.10' sorts after 'pos.2': list elements in index order, everything else by name."""
    base, _, idx = name.rpartition(".")
    if base and idx.isdigit():
        return (base, int(idx))
    return (name, -1)


# -- pass 2: events in time order, a window at a time -------------------------------------------------------
class EventStream:
    """Events of one stream in (time, file order), handed out by ``until(t)``; holds only the reorder
    window (events younger than the scan's lag) and nothing already handed out."""

    def __init__(self, s: StreamScan, root: Path | None = None):
        self.scan = s
        self._it: Iterator[tuple]
        if s.path is None or s.report.missing:
            self._it = iter(())
        elif s.retained is not None:
            self._it, s.retained = iter(s.retained), None  # handed over once: the track owns them now
        else:
            self._it = events(s.path, s.kind, root, continuous=s.continuous)
        self._heap: list = []
        self._seq = 0
        self._latest = -math.inf
        self._done = False
        self._names = {n: i for i, n in enumerate(s.names)}

    def until(self, t_end: float) -> list[tuple]:
        """Every not yet handed out event with t < t_end, in order."""
        while not self._done and self._latest - self.scan.lag < t_end:
            ev = next(self._it, None)
            if ev is None:
                self._done = True
                break
            if self.scan.kind == "actions" and ev[1] not in self._names:
                continue  # beyond the control limit (counted by the scan)
            self._latest = max(self._latest, ev[0])
            heapq.heappush(self._heap, (ev[0], self._seq, ev))
            self._seq += 1
        out = []
        while self._heap and self._heap[0][0] < t_end:
            out.append(heapq.heappop(self._heap)[2])
        return out

    def rest(self) -> int:
        """How many events were never handed out (they lie after the last window asked for)."""
        left = len(self._heap) + sum(1 for ev in self._it if self.scan.kind != "actions" or ev[1] in self._names)
        self._heap, self._done = [], True
        return left


def hold(event_t: np.ndarray, event_v: np.ndarray, frame_t: np.ndarray, before: float) -> np.ndarray:
    """Value of a sorted event series at each frame time; ``before`` where no event has happened yet.
    A zero-order hold: a frame sees only what had happened when it was shown (no future leaks back)."""
    idx = np.searchsorted(event_t, frame_t, side="right") - 1
    out = np.full(len(frame_t), before, dtype=np.float32)
    seen = idx >= 0
    out[seen] = event_v[idx[seen]]
    return out


class ActionTrack:
    """Per-clip action arrays from an action stream: each control's last value at or before the frame
    (0 = released before any event), plus the raw events of the clip's window."""

    def __init__(self, s: StreamScan, root: Path | None = None):
        self.controls = s.names
        self._stream = EventStream(s, root)
        self._col = {c: i for i, c in enumerate(self.controls)}
        self._state = np.zeros(len(self.controls), np.float32)

    def outside(self) -> int:
        """Events after the last window (earlier ones set the state every clip starts from)."""
        return self._stream.rest()

    def clip(self, frame_t: np.ndarray, t_start: float, t_end: float) -> tuple[np.ndarray, list[tuple]]:
        evs = self._stream.until(t_end)
        for t, c, v in evs:
            if t >= t_start:
                break
            self._state[self._col[c]] = v
        inside = [e for e in evs if e[0] >= t_start]
        out = np.repeat(self._state[None, :], len(frame_t), axis=0)
        by_control: dict[int, list[tuple[float, float]]] = {}
        for t, c, v in inside:
            by_control.setdefault(self._col[c], []).append((t, v))
        for c, tv in by_control.items():
            arr = np.asarray(tv, dtype=np.float64)
            out[:, c] = hold(arr[:, 0], arr[:, 1].astype(np.float32), frame_t, float(self._state[c]))
            self._state[c] = arr[-1, 1]
        return out, inside


class TelemetryTrack:
    """Per-clip telemetry [frames, channels]: the last reading at or before each frame; before a
    channel's first reading, that first reading (arrays stay finite; the only look-ahead there is)."""

    def __init__(self, s: StreamScan, root: Path | None = None):
        self.channels = s.names
        self._stream = EventStream(s, root)
        self._col = {c: i for i, c in enumerate(self.channels)}
        self._state = np.array([s.first[c] for c in self.channels], dtype=np.float32)
        self._layouts: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray | None]] = {}

    def outside(self) -> int:
        """Readings after the last window (earlier ones set the values every clip starts from)."""
        return self._stream.rest()

    def _layout(self, keys: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray | None]:
        """Columns of a line's channels (and which of them are known), computed once per key order."""
        lay = self._layouts.get(keys)
        if lay is None:
            if len(self._layouts) >= _LIST_NAMES_MAX:
                self._layouts.clear()
            cols = np.array([self._col.get(k, -1) for k in keys], dtype=np.intp)
            known = cols >= 0
            lay = self._layouts[keys] = (cols, None) if known.all() else (cols[known], known)
        return lay

    def clip(self, frame_t: np.ndarray, t_start: float, t_end: float) -> np.ndarray:
        evs = self._stream.until(t_end)
        n = len(self.channels)
        if not evs or not n:
            return np.repeat(self._state[None, :], len(frame_t), axis=0)
        times = np.array([e[0] for e in evs], dtype=np.float64)
        rows = np.full((len(evs), n), np.nan, dtype=np.float32)
        i = 0
        while i < len(evs):  # consecutive readings of one layout (one names tuple) are placed at once
            names = evs[i][1]
            j = i + 1
            while j < len(evs) and evs[j][1] is names:
                j += 1
            cols, known = self._layout(names)
            values = np.array([e[2] for e in evs[i:j]]) if j - i > 1 else evs[i][2][None, :]
            rows[i:j, cols] = values if known is None else values[:, known]
            i = j
        # forward fill each channel from the state carried in from earlier clips
        seen = ~np.isnan(rows)
        last = np.where(seen, np.arange(len(evs))[:, None], -1)
        np.maximum.accumulate(last, axis=0, out=last)
        filled = np.where(last >= 0, rows[np.maximum(last, 0), np.arange(n)[None, :]], self._state[None, :])
        at = np.searchsorted(times, frame_t, side="right") - 1
        out = np.where((at >= 0)[:, None], filled[np.maximum(at, 0)], self._state[None, :]).astype(np.float32)
        self._state = filled[-1].astype(np.float32)
        return out


class TextTrack:
    """The text events of each clip's window."""

    def __init__(self, s: StreamScan, root: Path | None = None):
        self._stream = EventStream(s, root)
        self._before = 0  # events before the window they were handed out with: in no clip

    def clip(self, t_start: float, t_end: float) -> list[dict]:
        evs = self._stream.until(t_end)
        out = [{"t": t, "speaker": speaker, "text": text} for t, speaker, text in evs if t >= t_start]
        self._before += len(evs) - len(out)
        return out

    def outside(self) -> int:
        """Events in no clip (before the first window or between windows, and after the last)."""
        return self._before + self._stream.rest()
