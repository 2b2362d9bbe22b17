"""What a split set is made from: the options a user gives and the fully resolved, recorded parameters.

``SplitOptions`` is the request (``None`` = the default, or the value of the ``--from-split`` set when one
is given); ``SplitParams`` is what was used, written into the split manifest and enough to recompute it.
"""

from __future__ import annotations

import difflib
import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dsbuild.core.errors import FormatError, UsageError
from dsbuild.core.files import read_capped
from dsbuild.core.hashing import sha256_json
from dsbuild.lineage.splitsets import NAME_PATTERN, Pin, SplitRule, SplitSource
from dsbuild.split.assign import RULE, Ratios, canonical_ratios

SESSION_FIELDS = ("session_id", "title", "player", "platform", "build")
NAME_RE = re.compile(NAME_PATTERN)  # split set and split names become file names (the stored records' rule)
RESERVED = ("unassigned",)  # the report's name for sessions without the --by field
RATIO_TOLERANCE = 1e-6
MAX_PIN_BYTES = 64 << 20  # a pin file lists group values; 64 MiB is millions of them

# The player is the unit of leakage in game data: one person's sessions look alike across titles.
DEFAULT_BY = "player"
# The common 80/10/10; the order does not matter (splits are sorted by name).
DEFAULT_RATIOS: Ratios = canonical_ratios({"train": 0.8, "val": 0.1, "test": 0.1})
# A fixed, documented key: the same captures give the same split unless a salt is chosen on purpose.
DEFAULT_SALT = "dsbuild"


def check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in RESERVED:
        raise UsageError(
            f"{what} {name!r} is not allowed; use a letter, then up to 63 letters, digits, '_' or '-'"
            + (f" (not {', '.join(RESERVED)})" if name in RESERVED else "")
        )
    return name


def check_field(text: str, option: str = "--by") -> str:
    """A session field: session_id, title, player, platform, build or conditions.<key>."""
    text = str(text).strip()
    if text in SESSION_FIELDS or (text.startswith("conditions.") and len(text) > len("conditions.")):
        return text
    raise UsageError(
        f"{option} {text!r}: not a session field; use one of {', '.join(SESSION_FIELDS)} or conditions.<key>"
    )


def parse_ratios(text: str | Mapping[str, float]) -> Ratios:
    """'train=0.8,val=0.1,test=0.1' (or a mapping) -> canonical ratios; they must sum to 1."""
    pairs: list[tuple[str, str | float]]  # the values are checked below
    if isinstance(text, Mapping):
        pairs = [(str(k), v) for k, v in text.items()]
    else:
        pairs = []
        for item in str(text).split(","):
            name, eq, ratio_text = item.strip().partition("=")
            if not eq:
                raise UsageError(
                    f"--ratios {text!r}: {item.strip()!r} is not NAME=RATIO (e.g. train=0.8,val=0.1,test=0.1)"
                )
            pairs.append((name.strip(), ratio_text.strip()))
    seen: set[str] = set()
    out: list[tuple[str, float]] = []
    for name, value in pairs:
        check_name(name, "split name")
        if name in seen:
            raise UsageError(f"--ratios: split {name!r} is given twice")
        seen.add(name)
        try:
            ratio = float(value)
        except (TypeError, ValueError):
            raise UsageError(f"--ratios: {name}={value!r} is not a number") from None
        if not math.isfinite(ratio) or ratio <= 0 or ratio > 1:
            raise UsageError(f"--ratios: {name}={value} must be in (0, 1]")
        out.append((name, ratio))
    if not out:
        raise UsageError("--ratios: no splits given (e.g. train=0.8,val=0.1,test=0.1)")
    total = math.fsum(r for _, r in out)
    if abs(total - 1.0) > RATIO_TOLERANCE:
        raise UsageError(f"--ratios: ratios sum to {total:.9g}, not 1 (tolerance {RATIO_TOLERANCE:g})")
    return canonical_ratios(out)


def parse_pin(text: str) -> tuple[str, Path]:
    """'test=FILE' -> ('test', Path(FILE))."""
    name, eq, path = str(text).partition("=")
    if not eq or not path:
        raise UsageError(f"--pin {text!r}: use SPLIT=FILE (a text file, one group value per line)")
    return check_name(name.strip(), "pinned split"), Path(path)


def read_pin_file(path: Path | str) -> tuple[str, ...]:
    """Group values, one per line, each exactly as the line holds it (NFC; spaces are part of a value, as
    they are of group values: stripping them pinned another group); blank lines and lines starting with
    '#' are skipped, and a leading backslash is dropped (``\\#7`` pins the value ``#7``)."""
    path = Path(path)
    try:  # a regular file, read no further than the limit (a FIFO or device there never ends)
        data = read_capped(path, MAX_PIN_BYTES)
    except FileNotFoundError:
        raise UsageError(f"{path}: pin file does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: pin file is a folder") from None
    except FormatError as e:  # not a regular file, or over the limit
        raise UsageError(f"{path}: pin file {str(e).removeprefix(f'{path}: ')}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: pin file is not UTF-8 (byte {e.start})") from None
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    values = [line[1:] if line.startswith("\\") else line for line in lines]
    return tuple(sorted({unicodedata.normalize("NFC", v) for v in values}))  # as group values are


def _check_text(value: str, what: str) -> None:
    """Refuse a value that is not Unicode text (an argument that was not valid UTF-8 carries lone
    surrogates: it could be neither hashed nor recorded)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{what} {value[:64]!r} is not valid UTF-8 text") from None


@dataclass(frozen=True)
class SplitParams:
    """The complete rule of a split set, as recorded in its manifest."""

    by: str = DEFAULT_BY
    ratios: Ratios = DEFAULT_RATIOS
    salt: str = DEFAULT_SALT
    stratify: str | None = None
    pins: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (split, sorted group values), sorted by split

    def __post_init__(self) -> None:
        check_field(self.by, "--by")
        _check_text(self.salt, "--salt")
        for _, groups in self.pins:
            for g in groups:
                _check_text(g, "--pin")
        if self.stratify is not None:
            check_field(self.stratify, "--stratify")
        names = {n for n, _ in self.ratios}
        pinned = [s for s, _ in self.pins]
        if len(set(pinned)) != len(pinned):
            raise UsageError(f"--pin: a split is pinned twice ({', '.join(pinned)})")
        owner: dict[str, str] = {}
        for split, groups in self.pins:
            check_name(split, "pinned split")
            if split not in names:
                close = difflib.get_close_matches(split, sorted(names), n=1)
                raise UsageError(
                    f"--pin {split}=...: {split!r} is not one of the splits {', '.join(sorted(names))}"
                    + (f"; did you mean {close[0]!r}?" if close else ""),
                    hint="a pinned split must be one of --ratios (its ratio is ignored)",
                )
            for g in groups:
                if g in owner:
                    raise UsageError(f"--pin: group {g!r} is pinned to both {owner[g]!r} and {split!r}")
                owner[g] = split
        if not names - set(pinned):
            raise UsageError("--ratios: every split is pinned; at least one split must take the other groups")

    @property
    def exclusive(self) -> frozenset[str]:
        return frozenset(s for s, _ in self.pins)

    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(sorted({n for n, _ in self.ratios} | self.exclusive))

    def pinned(self) -> dict[str, str]:
        return {g: split for split, groups in self.pins for g in groups}

    def to_rule(self, source: SplitSource | None = None) -> SplitRule:
        """The parameters as recorded in a split manifest (``source``: where assignments were carried from)."""
        return SplitRule(
            rule=RULE,
            by=self.by,
            ratios=dict(self.ratios),
            salt=self.salt,
            stratify=self.stratify,
            pins={s: Pin(g, len(g), sha256_json(list(g))) for s, g in self.pins},
            from_split=source,
        )

    @classmethod
    def from_rule(cls, rule: SplitRule, what: str) -> SplitParams:
        if rule.rule != RULE:
            raise UsageError(f"{what}: made by rule {rule.rule!r}; this dsbuild knows {RULE!r}")
        pins = tuple(sorted((s, tuple(sorted(p.groups))) for s, p in rule.pins.items()))
        return cls(by=rule.by, ratios=canonical_ratios(rule.ratios), salt=rule.salt, stratify=rule.stratify, pins=pins)


@dataclass(frozen=True)
class SplitOptions:
    """A request; each ``None`` takes the ``--from-split`` set's value, else the default."""

    by: str | None = None
    ratios: str | Mapping[str, float] | None = None
    salt: str | None = None
    stratify: str | None = None  # "" = explicitly none (overrides an inherited stratify)
    pins: Sequence[tuple[str, Path | Sequence[str]]] | None = None  # (split, pin file or group values)
    from_split: str | None = None  # VERSION/NAME, NAME, or a split set folder of the same catalog

    def given(self) -> bool:
        return any(v is not None for v in (self.by, self.ratios, self.salt, self.stratify, self.pins))

    def resolve(self, inherited: SplitParams | None = None) -> SplitParams:
        base = inherited or SplitParams()
        pins = base.pins
        if self.pins is not None:
            loaded = []
            for split, source in self.pins:
                groups = read_pin_file(source) if isinstance(source, (str, Path)) else tuple(sorted(set(source)))
                loaded.append((check_name(split, "pinned split"), groups))
            pins = tuple(sorted(loaded))
        stratify = base.stratify if self.stratify is None else (self.stratify or None)
        return SplitParams(
            by=check_field(self.by) if self.by is not None else base.by,
            ratios=parse_ratios(self.ratios) if self.ratios is not None else base.ratios,
            salt=self.salt if self.salt is not None else base.salt,
            stratify=check_field(stratify, "--stratify") if stratify else None,
            pins=pins,
        )
