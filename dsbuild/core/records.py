"""Typed on-disk records: frozen slots dataclasses that validate what they read and describe themselves.

Every record dsbuild writes (manifest, shard and source entries, commit, tags, split manifest, loader
checkpoint) is a ``Record``. Its field annotations are the single source of truth for three things:

- ``to_json()``: a JSON-ready dict (nested records, tuples -> lists);
- ``from_json(doc, what)``: the inverse, which trusts nothing: every field is present with its type
  (bool is not an int, an int is a float), no unknown keys, and per-field constraints (pattern,
  minimum, maximum length) hold; failures are one-line ``FormatError``s naming ``what`` and the field;
- ``json_schema()``: the JSON Schema published in ``docs/schemas/``.

Supported annotations: str, int, float, bool, None, ``X | None``, ``tuple[X, ...]``, ``dict[str, X]``,
nested ``Record`` types and ``JsonValue`` (free-form JSON, depth-bounded).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar

from dsbuild.core.errors import FormatError
from dsbuild.core.jsonio import depth_ok

if typing.TYPE_CHECKING:  # free-form JSON (bounded depth), e.g. a config echo: its readers check its shape
    JsonValue: typing.TypeAlias = Any
else:  # a marker of its own, which the loaders and the JSON schema look for
    JsonValue = typing.NewType("JsonValue", object)
SHA256 = r"[0-9a-f]{64}"
_MAX_STR = 1 << 20  # no single string field of a record is a megabyte; longer is hostile


def spec(
    *,
    pattern: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    doc: str = "",
    absent_when_none: bool = False,
) -> dict:
    """Field metadata: ``field(metadata=spec(pattern=SHA256, doc="..."))``. ``absent_when_none``: a field
    added later is left out of the JSON while None, so a record reads and writes back as the format
    before it did (same bytes, same hashes)."""
    return {
        "pattern": pattern,
        "minimum": minimum,
        "maximum": maximum,
        "doc": doc,
        "absent_when_none": absent_when_none,
    }


def _hints(cls) -> dict[str, Any]:
    cache = cls.__dict__.get("_hints_cache")
    if cache is None:
        cache = typing.get_type_hints(cls)
        type.__setattr__(cls, "_hints_cache", cache)
    return cache


def _is_record(tp) -> bool:
    return isinstance(tp, type) and issubclass(tp, Record)


def _union_args(tp) -> tuple | None:
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return typing.get_args(tp)
    return None


class Record:
    """Base of every typed record (subclasses are ``@dataclass(frozen=True, slots=True)``)."""

    __slots__ = ()
    FORMAT: ClassVar[str | None] = None  # when set, the JSON carries {"format": FORMAT} and it is checked
    # a reader's view of a record: its fields are read and checked, any others left unread (never written)
    PARTIAL: ClassVar[bool] = False
    if typing.TYPE_CHECKING:  # what ``@dataclass`` gives each subclass, so ``dataclasses.fields`` takes a Record
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    # -- writing ----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        out = {
            f.name: _dump(v)
            for f in dataclasses.fields(self)
            if (v := getattr(self, f.name)) is not None or not f.metadata.get("absent_when_none")
        }
        if self.FORMAT is not None:
            out["format"] = self.FORMAT
        return out

    # -- reading ----------------------------------------------------------------------------------
    @classmethod
    def from_json(cls, doc: object, what: str):
        if not isinstance(doc, dict):
            raise FormatError(f"{what}: expected a JSON object, found {type(doc).__name__}")
        doc = dict(doc)
        if cls.FORMAT is not None:
            found = doc.pop("format", None)
            if found != cls.FORMAT:
                raise FormatError(f"{what}: format is {str(found)[:80]!r}, expected {cls.FORMAT!r}")
        plan, names = _plan(cls)  # type: ignore[arg-type]  # a class is hashable; mypy checks the instances' __hash__
        if not cls.PARTIAL and (len(doc) > len(names) or not names.issuperset(doc)):
            unknown = sorted(set(doc) - names, key=str)
            raise FormatError(f"{what}: unknown field {str(unknown[0])[:80]!r}")
        values = {}
        for name, load, required in plan:
            if name in doc:
                values[name] = load(doc[name], f"{what}: {name}")
            elif required:
                raise FormatError(f"{what}: missing field {name!r}")
        record = cls(**values)
        record.check_fields(what)
        return record

    def check_fields(self, what: str) -> None:
        """Rules across fields that a record read from JSON must also follow (raise ``FormatError``
        naming ``what``); none by default."""

    @classmethod
    def json_schema(cls) -> dict:
        hints = _hints(cls)
        props, required = {}, []
        if cls.FORMAT is not None:
            props["format"] = {"const": cls.FORMAT}
            required.append("format")
        for f in dataclasses.fields(cls):
            props[f.name] = _schema(hints[f.name], f.metadata)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                required.append(f.name)
        out = {"type": "object", "additionalProperties": cls.PARTIAL, "properties": props, "required": required}
        if cls.__doc__:
            out["description"] = " ".join(cls.__doc__.split())
        return out


@functools.cache
def _plan(cls) -> tuple[list[tuple[str, Callable, bool]], frozenset[str]]:
    """Per record class: (field name, its compiled loader, whether it is required), and the names."""
    hints = _hints(cls)
    plan = [
        (
            f.name,
            _loader(hints[f.name], tuple(sorted(f.metadata.items())) if f.metadata else ()),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    ]
    return plan, frozenset(name for name, _, _ in plan)


def _dump(v: Any) -> Any:
    if isinstance(v, Record):
        return v.to_json()
    if isinstance(v, (tuple, list)):
        return [_dump(x) for x in v]
    if isinstance(v, dict):
        return {k: _dump(x) for k, x in v.items()}
    return v


@functools.cache
def _loader(tp: Any, meta: tuple) -> Callable[[Any, str], Any]:
    """A validating loader for one annotation, built once per (type, constraints): reading a manifest
    with tens of thousands of records then costs a few function calls per value, not type analysis."""
    args = _union_args(tp)
    if args is not None:
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1 or type(None) not in args:
            raise TypeError(f"unsupported union {tp}")
        load_inner = _loader(inner[0], meta)
        return lambda v, where: None if v is None else load_inner(v, where)
    if tp is JsonValue:

        def load_json(v, where):
            if not depth_ok(v):
                raise FormatError(f"{where}: nested too deeply")
            return v

        return load_json
    if _is_record(tp):
        return tp.from_json
    origin = typing.get_origin(tp)
    if origin is tuple:
        (item,) = [a for a in typing.get_args(tp) if a is not Ellipsis]
        load_item = _loader(item, ())

        def load_tuple(v, where):
            if type(v) is not list:
                raise FormatError(f"{where}: expected a list, found {type(v).__name__}")
            return tuple(load_item(x, f"{where}[{i}]") for i, x in enumerate(v))

        return load_tuple
    if origin is dict:
        load_value = _loader(typing.get_args(tp)[1], ())

        def load_dict(v, where):
            if type(v) is not dict:
                raise FormatError(f"{where}: expected an object, found {type(v).__name__}")
            return {k: load_value(x, where) for k, x in v.items()}

        return load_dict
    check = _SCALARS.get(tp)
    if check is None:
        raise TypeError(f"unsupported record field type {tp}")
    constraints = dict(meta)
    pattern = re.compile(constraints["pattern"]) if constraints.get("pattern") else None
    lo, hi = constraints.get("minimum"), constraints.get("maximum")
    name = getattr(tp, "__name__", str(tp))

    def load_scalar(v, where):
        if not check(v):
            raise FormatError(f"{where}: expected {name}, found {type(v).__name__}")
        if type(v) is str:
            if len(v) > _MAX_STR:
                raise FormatError(f"{where}: string of {len(v)} characters exceeds {_MAX_STR}")
            if pattern is not None and not pattern.fullmatch(v):
                raise FormatError(f"{where}: {v[:80]!r} does not match {pattern.pattern}")
        elif lo is not None and v < lo:
            raise FormatError(f"{where}: {v} is below {lo}")
        elif hi is not None and v > hi:
            raise FormatError(f"{where}: {v} is above {hi}")
        return float(v) if tp is float else v

    return load_scalar


_SCALARS = {
    str: lambda v: type(v) is str,
    bool: lambda v: type(v) is bool,
    type(None): lambda v: v is None,
    int: lambda v: type(v) is int,
    float: lambda v: type(v) is float or type(v) is int,
}


def _schema(tp: Any, meta: typing.Mapping) -> dict:
    args = _union_args(tp)
    if args is not None:
        inner = [a for a in args if a is not type(None)]
        return {"anyOf": [_schema(inner[0], meta), {"type": "null"}]}
    if tp is JsonValue:
        return {}
    if _is_record(tp):
        return tp.json_schema()
    origin = typing.get_origin(tp)
    if origin is tuple:
        (item,) = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return {"type": "array", "items": _schema(item, {})}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(typing.get_args(tp)[1], {})}
    out = {"type": {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}[tp]}
    if meta:
        if meta.get("pattern"):
            out["pattern"] = f"^{meta['pattern']}$"
        if meta.get("minimum") is not None:
            out["minimum"] = meta["minimum"]
        if meta.get("maximum") is not None:
            out["maximum"] = meta["maximum"]
        if meta.get("doc"):
            out["description"] = meta["doc"]
    return out
