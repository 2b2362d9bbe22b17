"""The acceptance spec: which thresholds a version must meet and how bad each miss is.

A spec is a TOML file (every section and key is optional; what is left out keeps its default)::

    format = "dsbuild.acceptance/1"

    [thresholds]
    max_decode_failures = 0
    min_hours_per_title = 0.5
    required_titles = ["Kart Storm", "Sky Rally"]
    max_duplicate_fraction = 0.001
    max_frozen_fraction = 0.01

    [severity]              # per check: "fail" rejects the version, "warn" reports only, "off" skips
    near_duplicates = "warn"

    [report]
    max_offenders = 20      # offenders listed per check in every report

The keys, their defaults and the reason for each default come from the checks themselves
(``validators.registry``). Unknown sections, keys, checks or severities are errors that name the file,
the line and the key, so a typo never silently turns a check off.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from dsbuild.core.errors import FormatError, UsageError
from dsbuild.core.files import read_capped
from dsbuild.validators.base import Threshold
from dsbuild.validators.registry import BY_NAME, CHECKS, THRESHOLDS

SPEC_FORMAT = "dsbuild.acceptance/1"
SEVERITIES = ("fail", "warn", "off")
# Enough to find each broken sample in a CI log without flooding it.
DEFAULT_MAX_OFFENDERS = 20
MAX_SPEC_BYTES = 1 << 20


@dataclass(frozen=True)
class AcceptanceSpec:
    thresholds: dict
    severity: dict
    max_offenders: int = DEFAULT_MAX_OFFENDERS
    source: str = "defaults"

    def __getitem__(self, key: str):
        return self.thresholds[key]

    def severity_of(self, check: str) -> str:
        return self.severity[check]

    def to_json(self) -> dict:
        return {
            "format": SPEC_FORMAT,
            "thresholds": dict(self.thresholds),
            "severity": dict(self.severity),
            "report": {"max_offenders": self.max_offenders},
        }

    def to_toml(self) -> str:
        lines = [f'format = "{SPEC_FORMAT}"', "", "[thresholds]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in self.thresholds.items()]
        lines += ["", "[severity]"] + [f'{k} = "{v}"' for k, v in self.severity.items()]
        lines += ["", "[report]", f"max_offenders = {self.max_offenders}"]
        return "\n".join(lines) + "\n"


def default_spec() -> AcceptanceSpec:
    return AcceptanceSpec({k: t.default for k, (_, t) in THRESHOLDS.items()}, {c.name: c.severity for c in CHECKS})


def _toml_value(v: object) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)


def _line_of(text: str, section: str | None, key: str) -> int | None:
    """The line of ``key = ...`` inside ``[section]`` (top level when None), 1-based; None if not found."""
    current = None
    pat = re.compile(r'\s*["\']?' + re.escape(key) + r'["\']?\s*=')
    header = re.compile(r"\s*\[\s*([^\]]+?)\s*\]")
    for n, line in enumerate(text.splitlines(), 1):
        m = header.match(line)
        if m:
            current = m.group(1)
            if current == key and section is None:
                return n
            continue
        if current == section and pat.match(line):
            return n
    # a dotted key (thresholds.x = 1), an inline table or a quoted header: the first line naming the key
    word = re.compile(r"(?<![\w-])" + re.escape(key) + r"(?![\w-])")
    for n, line in enumerate(text.splitlines(), 1):
        if word.search(line.split("#", 1)[0]):
            return n
    return None


def _near(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _whole(v: object) -> int | None:
    """``v`` when it is an integer (TOML's ``3``, not ``3.0`` or ``1e30``), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _finite(v: object) -> float | None:
    """``v`` as a finite float, else None (text, a bool, NaN, infinity, an integer past float's range)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        x = float(v)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def _allowed_text(t: Threshold) -> str:
    """What a numeric threshold accepts, in words: its kind and [low, high] (``Threshold.allowed``)."""
    lo, hi = t.allowed
    what = {"count": "a whole number", "fraction": "a fraction", "number": "a finite number"}[t.kind]
    return (
        f"{what} in [{lo:g}, {hi:{'d' if isinstance(hi, int) else 'g'}}]" if math.isfinite(hi) else f"{what} >= {lo:g}"
    )


# Integrity and safety: a version whose manifest, shards, index or members fail them must never pass the
# gate by a [severity] line (a flipped shard passed --level full with shard_hashes = "off")
ALWAYS_FAIL = {
    "manifest": None,
    "shard_hashes": "max_bad_shards",
    "index": "max_index_errors",
    "unsafe_members": "max_unsafe_members",
}  # -> the threshold that tolerates some, if any


def _check_value(t: Threshold, v: object, where: str) -> object:
    """The value a threshold takes from the spec; UsageError naming it and its allowed range otherwise."""
    if t.kind == "strings":
        if not isinstance(v, list) or not all(isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in v):
            raise UsageError(f'{where}: {t.key} must be a list of strings, e.g. ["a", "b"]')
        return [str(x) for x in v]
    value = _whole(v) if t.kind == "count" else _finite(v)
    lo, hi = t.allowed
    if value is None or not lo <= value <= hi:
        raise UsageError(f"{where}: {t.key} must be {_allowed_text(t)}, not {v!r:.40}")
    return value


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def parse_spec(text: str, source: str) -> AcceptanceSpec:
    """TOML text -> spec over the defaults. Raises UsageError naming the file, line and key."""
    try:
        doc = tomllib.loads(text)
    except ValueError as e:  # a TOMLDecodeError, or an integer too long for Python to convert
        raise UsageError(f"{source}: not valid TOML: {e}") from None

    def where(section, key):
        line = _line_of(text, section, key)
        return f"{source}:{line}" if line else source

    spec = default_spec()
    thresholds, severity, max_offenders = dict(spec.thresholds), dict(spec.severity), spec.max_offenders
    for top, value in doc.items():
        if top == "format":
            if value != SPEC_FORMAT:
                raise UsageError(f"{where(None, top)}: format {value!r} is not {SPEC_FORMAT!r}")
        elif top not in ("thresholds", "severity", "report"):
            near = _near(top, ["format", "thresholds", "severity", "report"])
            raise UsageError(
                f"{where(None, top)}: unknown key {top!r}{near}; use [thresholds], [severity] and [report]"
            )
        elif not isinstance(value, dict):
            raise UsageError(f"{where(None, top)}: {top!r} must be a table ([{top}])")
    for key, value in doc.get("thresholds", {}).items():
        if key not in THRESHOLDS:
            raise UsageError(f"{where('thresholds', key)}: unknown threshold {key!r}{_near(key, THRESHOLDS)}")
        thresholds[key] = _check_value(THRESHOLDS[key][1], value, where("thresholds", key))
    for key, value in doc.get("severity", {}).items():
        if key not in BY_NAME:
            raise UsageError(f"{where('severity', key)}: unknown check {key!r}{_near(key, BY_NAME)}")
        if value not in SEVERITIES:
            raise UsageError(
                f"{where('severity', key)}: severity of {key!r} must be one of {', '.join(SEVERITIES)}, not {value!r}"
            )
        if key in ALWAYS_FAIL and value != "fail":
            raise UsageError(
                f"{where('severity', key)}: {key!r} proves the version is whole and safe to read; "
                f"its severity is always fail, not {value!r}",
                hint=f"to tolerate some, raise {ALWAYS_FAIL[key]} instead" if ALWAYS_FAIL[key] else None,
            )
        severity[key] = value
    for key, value in doc.get("report", {}).items():
        if key != "max_offenders":
            raise UsageError(f"{where('report', key)}: unknown key {key!r} in [report]{_near(key, ['max_offenders'])}")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10_000:
            raise UsageError(f"{where('report', key)}: max_offenders must be a whole number 0..10000")
        max_offenders = value
    for key, ok, form in (
        ("required_conditions", lambda x: "=" in x, "key=value"),
        ("allowed_resolutions", lambda x: re.fullmatch(r"\d+x\d+", x.strip()), "WxH"),
        ("allowed_fps", _is_number, "a number"),
    ):
        for item in thresholds[key]:
            if not ok(item):
                raise UsageError(f"{where('thresholds', key)}: {key} item {item!r} is not {form}")
    return AcceptanceSpec(thresholds, severity, max_offenders, source)


def load_spec(path: Path | str | None) -> AcceptanceSpec:
    """The spec in ``path``, or the defaults when None. Missing, unreadable or invalid: UsageError naming
    the file (and the line and key where the mistake is). Only a regular file is read, with a cap."""
    if path is None:
        return default_spec()
    path = Path(path)
    try:
        data = read_capped(path, MAX_SPEC_BYTES, what=str(path))
    except FileNotFoundError:
        raise UsageError(f"{path}: acceptance spec not found") from None
    except FormatError as e:  # not a regular file, or over the cap
        raise UsageError(f"{e}; an acceptance spec is a TOML file") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read the acceptance spec ({e.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None
    return parse_spec(text, str(path))
