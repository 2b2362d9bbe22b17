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

``CHECKS`` below is the registry: every check, what it proves, its thresholds with their defaults and
the reason for each default. Unknown sections, keys, checks or severities are errors that name the key
and its line, so a typo never silently turns a check off.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from dsbuild.errors import UsageError

SPEC_FORMAT = "dsbuild.acceptance/1"
SEVERITIES = ("fail", "warn", "off")
LEVELS = ("structural", "full")
# Enough to find each broken sample in a CI log without flooding it.
DEFAULT_MAX_OFFENDERS = 20
MAX_SPEC_BYTES = 1 << 20


@dataclass(frozen=True)
class Threshold:
    key: str
    default: object
    kind: str  # count (int >= 0) | fraction (0..1) | number (>= 0) | strings (list of str)
    doc: str


@dataclass(frozen=True)
class CheckDef:
    name: str
    stage: str  # structural | content | dataset
    doc: str
    thresholds: tuple[Threshold, ...] = ()
    severity: str = "fail"
    level: str = "structural"  # the --level it needs
    needs_split: bool = False


def _t(key, default, kind, doc) -> Threshold:
    return Threshold(key, default, kind, doc)


_ZERO = "any broken sample is a broken training example: none is the only safe default"
CHECKS: tuple[CheckDef, ...] = (
    # -- structural: bytes and layout, no decoding ------------------------------------------------------
    CheckDef("manifest", "structural", "The manifest is a dsbuild.manifest/1 document whose sha256 is the version "
             "id; its index file is present, unaltered and has the index schema; shard paths are content "
             "addressed; the content id recomputes from the index."),
    CheckDef("shard_hashes", "structural", "Every shard exists with the size and sha256 the manifest records "
             "(lineage.verify); samples inside a damaged shard are named.",
             (_t("max_bad_shards", 0, "count", _ZERO),)),
    CheckDef("index", "structural", "Every index row points at its own sample (tar byte range or Parquet row "
             "group/row) and agrees with the sample's metadata (session fields, window, frames, fps, size).",
             (_t("max_index_errors", 0, "count", _ZERO),)),
    CheckDef("members", "structural", "Every sample has exactly the required members (json, one video, "
             "actions/telemetry/timestamps .npy, events.jsonl.zst) and the metadata fields readers rely on.",
             (_t("max_malformed_samples", 0, "count", _ZERO),)),
    CheckDef("keys", "structural", "Keys match [A-Za-z0-9_-]{1,80} (so no dots), are unique, sorted in the "
             "index, equal the metadata's key and are <session_id>__<clip index:06d>.",
             (_t("max_key_errors", 0, "count", _ZERO),)),
    CheckDef("unsafe_members", "structural", "No shard holds links, devices, paths, pickle-like members "
             "(.pyd .pickle .pkl .pt .pth .joblib .npz), members no sample owns, or unknown Parquet columns.",
             (_t("max_unsafe_members", 0, "count", "untrusted bytes must never reach a loader"),)),
    # -- content: decode every clip, read every array (--level full) -------------------------------------
    CheckDef("decode", "content", "Every clip opens and decodes with PyAV to its last frame.",
             (_t("max_decode_failures", 0, "count", _ZERO),), level="full"),
    CheckDef("frame_count", "content", "Decoded frames = metadata frames = timestamps length.",
             (_t("max_frame_count_mismatches", 0, "count", _ZERO),), level="full"),
    CheckDef("fps", "content", "The mean frame rate of the decoded timestamps matches the one of the clip's "
             "recorded timestamps (the metadata's rate when those are unreadable).",
             (_t("max_fps_mismatches", 0, "count", _ZERO),
              _t("fps_tolerance", 0.02, "fraction", "relative; both rates come from the same timestamps, so "
                                                    "variable-rate clips agree too")),
             level="full"),
    CheckDef("resolution", "content", "Decoded frames have the metadata's width and height.",
             (_t("max_resolution_mismatches", 0, "count", _ZERO),), level="full"),
    CheckDef("duration", "content", "The decoded span (first to last frame plus the last one's duration) matches "
             "the clip window (convert ends a window where its last carried frame ends).", (_t("max_duration_mismatches", 0, "count", _ZERO),
                              _t("duration_tolerance_frames", 1.5, "number",
                                 "frames; remuxed clips end on a keyframe, so one frame of slack plus jitter")),
             level="full"),
    CheckDef("black_clips", "content", "Clips whose every sampled frame is darker than black_luma (0-255 gray, "
             "sampled frames at 64 px wide).", (_t("max_black_fraction", 0.01, "fraction",
                                                    "a few loading screens are normal; more is a broken capture"),
                                                 _t("black_luma", 16.0, "number", "mean gray level of a black frame")),
             level="full"),
    CheckDef("frozen_clips", "content", "Clips whose largest gray difference anywhere between consecutive sampled "
             "frames (a strided subset at 64 px wide; median over pairs) stays below frozen_motion: a stuck "
             "capture. A black clip is also frozen.",
             (_t("max_frozen_fraction", 0.01, "fraction", "pauses happen; a stuck encoder is rare"),
              _t("frozen_motion", 8.0, "number", "gray levels; a still image re-encoded changes by a few levels, "
                                                 "one small moving sprite by tens")),
             level="full"),
    CheckDef("audio", "content", "A clip carries an audio track exactly when its metadata says so; the track "
             "decodes, and starts and ends where the metadata says (within one audio frame of the first video "
             "frame).",
             (_t("max_audio_mismatches", 0, "count", _ZERO),), level="full"),
    CheckDef("actions", "content", "The action array is float32 [frames, controls], finite, in [-1, 1].",
             (_t("max_action_errors", 0, "count", _ZERO),), level="full"),
    CheckDef("telemetry", "content", "The telemetry array is float32 [frames, channels] and finite.",
             (_t("max_telemetry_errors", 0, "count", _ZERO),), level="full"),
    CheckDef("timestamps", "content", "Timestamps are float64, one per frame, strictly increasing, inside "
             "the clip window.", (_t("max_timestamp_errors", 0, "count", _ZERO),), level="full"),
    CheckDef("action_events", "content", "Raw action events decompress (bounded), parse, lie inside the clip "
             "window, name known controls, stay in [-1, 1] and match the metadata's count.",
             (_t("max_action_event_errors", 0, "count", _ZERO),), level="full"),
    CheckDef("text", "content", "Text events are valid UTF-8 (no lone surrogates), inside the window; the "
             "speaker is optional.", (_t("max_text_errors", 0, "count", _ZERO),), level="full"),
    # -- dataset level ------------------------------------------------------------------------------------
    CheckDef("titles", "dataset", "Samples and hours per title; every required title is present and every "
             "title has enough data.",
             (_t("min_hours_per_title", 0.0, "number", "no minimum unless the project sets one"),
              _t("min_samples_per_title", 1, "count", "a title that is listed must have data"),
              _t("required_titles", [], "strings", "titles the model must see; none by default"))),
    CheckDef("conditions", "dataset", "Hours per condition value (key=value); required values are present and "
             "every value has enough data.",
             (_t("min_hours_per_condition", 0.0, "number", "no minimum unless the project sets one"),
              _t("required_conditions", [], "strings", "key=value pairs, e.g. weather=rain"))),
    CheckDef("resolutions", "dataset", "Samples and hours per resolution; only allowed ones (empty = any).",
             (_t("allowed_resolutions", [], "strings", "WxH, e.g. 1280x720; any by default"),)),
    CheckDef("frame_rates", "dataset", "Samples and hours per frame rate; only allowed ones (empty = any).",
             (_t("allowed_fps", [], "strings", "e.g. \"30\", \"59.94\"; any by default"),)),
    CheckDef("duplicates", "dataset", "Samples with the same sample hash, or the same window of the same source "
             "video (a capture converted twice under two session ids).",
             (_t("max_duplicate_fraction", 0.001, "fraction", "one in a thousand is noise; more skews training"),)),
    CheckDef("near_duplicates", "dataset", "Clips whose perceptual hash (dHash of 4 sampled frames, 256 bits) "
             "is within near_duplicate_bits of another clip's.",
             (_t("max_near_duplicate_fraction", 0.05, "fraction", "menus and replays look alike; report, don't block"),
              _t("near_duplicate_bits", 12, "count", "of 256; re-encodes differ by <8, different clips by ~100")),
             severity="warn", level="full"),
    CheckDef("action_balance", "dataset", "Share of frames on which each control is active (|value| >= 0.5); "
             "a control no one uses, or one dwarfing another, is reported.",
             (_t("min_action_usage", 0.001, "fraction", "a control active on under 0.1% of frames is barely learnable"),
              _t("max_action_imbalance", 1000.0, "number", "most-used / least-used control share")),
             severity="warn"),
    CheckDef("split_leakage", "dataset", "No group (and no sample) of the --split set is in two splits.",
             (_t("max_leaked_groups", 0, "count", "one leaked player inflates every metric"),), needs_split=True),
    CheckDef("split_coverage", "dataset", "Every title of the version appears in every split of the --split set.",
             (_t("max_missing_titles", 0, "count", "a split without a title cannot measure it"),), needs_split=True),
)
BY_NAME = {c.name: c for c in CHECKS}
THRESHOLDS = {t.key: (c, t) for c in CHECKS for t in c.thresholds}


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

    def limits(self, check: str) -> dict:
        """{key: value} of a check's thresholds, as reports show them."""
        return {t.key: self.thresholds[t.key] for t in BY_NAME[check].thresholds}

    def to_json(self) -> dict:
        return {"format": SPEC_FORMAT, "thresholds": dict(self.thresholds), "severity": dict(self.severity),
                "report": {"max_offenders": self.max_offenders}}

    def to_toml(self) -> str:
        lines = [f'format = "{SPEC_FORMAT}"', "", "[thresholds]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in self.thresholds.items()]
        lines += ["", "[severity]"] + [f'{k} = "{v}"' for k, v in self.severity.items()]
        lines += ["", "[report]", f"max_offenders = {self.max_offenders}"]
        return "\n".join(lines) + "\n"


def default_spec() -> AcceptanceSpec:
    return AcceptanceSpec({k: t.default for k, (_, t) in THRESHOLDS.items()},
                          {c.name: c.severity for c in CHECKS})


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
    return None


def _near(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_value(t: Threshold, v: object, where: str) -> object:
    if t.kind == "strings":
        if not isinstance(v, list) or not all(isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in v):
            raise UsageError(f"{where}: {t.key} must be a list of strings, e.g. [\"a\", \"b\"]")
        return [str(x) for x in v]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise UsageError(f"{where}: {t.key} must be a number >= 0, not {v!r}")
    if t.kind == "count":
        if v != int(v):
            raise UsageError(f"{where}: {t.key} must be a whole number, not {v!r}")
        return int(v)
    if t.kind == "fraction" and v > 1:
        raise UsageError(f"{where}: {t.key} is a fraction between 0 and 1, not {v!r}")
    return float(v)


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def parse_spec(text: str, source: str) -> AcceptanceSpec:
    """TOML text -> spec over the defaults. Raises UsageError naming the file, line and key."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
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
            raise UsageError(f"{where(None, top)}: unknown key {top!r}{near}; "
                             "use [thresholds], [severity] and [report]")
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
            raise UsageError(f"{where('severity', key)}: severity of {key!r} must be one of "
                             f"{', '.join(SEVERITIES)}, not {value!r}")
        severity[key] = value
    for key, value in doc.get("report", {}).items():
        if key != "max_offenders":
            raise UsageError(f"{where('report', key)}: unknown key {key!r} in [report]{_near(key, ['max_offenders'])}")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10_000:
            raise UsageError(f"{where('report', key)}: max_offenders must be a whole number 0..10000")
        max_offenders = value
    if thresholds["near_duplicate_bits"] > 64:
        raise UsageError(f"{where('thresholds', 'near_duplicate_bits')}: near_duplicate_bits must be <= 64 (of 256)")
    for key, ok, form in (("required_conditions", lambda x: "=" in x, "key=value"),
                          ("allowed_resolutions", lambda x: re.fullmatch(r"\d+x\d+", x.strip()), "WxH"),
                          ("allowed_fps", _is_number, "a number")):
        for item in thresholds[key]:
            if not ok(item):
                raise UsageError(f"{where('thresholds', key)}: {key} item {item!r} is not {form}")
    return AcceptanceSpec(thresholds, severity, max_offenders, source)


def load_spec(path: Path | str | None) -> AcceptanceSpec:
    """The spec in ``path``, or the defaults when None. Missing, unreadable or invalid: UsageError (exit 2)."""
    if path is None:
        return default_spec()
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{path}: acceptance spec not found") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read the acceptance spec ({e.strerror})") from None
    if len(data) > MAX_SPEC_BYTES:
        raise UsageError(f"{path}: {len(data)} bytes is too large for an acceptance spec")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None
    return parse_spec(text, str(path))
