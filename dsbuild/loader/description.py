"""A loader described in JSON for another process: what its worker processes and torch's are given.

Nothing of a loader crosses to another process by pickle. A worker is started with one JSON document
(``WorkerSpec``, a typed record): the sources by reference, split and weight; every ``LoaderOptions``
field as JSON (``options_to_json``), with the map function named by its import path,
``"package.module:function"``, which the worker resolves with importlib (``resolve``); and, for the
loader's own worker processes, the worker's place (its number, its ring's name prefix and size). A
function that has no such path (a lambda, a nested function, one defined in ``__main__``: a script or a
notebook, which a worker does not import) is refused in one line (``import_path``).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dsbuild.core.errors import FormatError, UsageError
from dsbuild.core.jsonio import canonical_json, loads_bounded
from dsbuild.core.records import JsonValue, Record, spec
from dsbuild.loader.options import LoaderOptions, with_overrides
from dsbuild.loader.parallel import Parallel

SPEC_FORMAT = "dsbuild.loader.worker/1"
MAX_SPEC_BYTES = 1 << 20  # a description is a few kilobytes (sys.path the most of it)
MAP_HINT = "put the function at the top level of a module (not a lambda, a nested function or __main__), or use worker_mode='thread'"


# -- the map function by name ------------------------------------------------------------------------
def import_path(fn: Any, what: str = "map") -> str:
    """``"package.module:function"`` naming ``fn`` (a ``what``); a UsageError when no worker process could
    import it."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    shown = name if isinstance(name, str) else type(fn).__name__
    why: str | None
    if not isinstance(module, str) or not isinstance(name, str):
        why = f"a {type(fn).__name__} has no module and name"
    elif "<" in name:  # <lambda>, <locals>
        why = "a lambda or a nested function has no import path"
    elif module == "__main__":
        why = "it is defined in __main__ (a script or notebook), which worker processes do not import"
    else:
        try:
            same = resolve(f"{module}:{name}", what) is fn
        except UsageError:
            same = False
        why = None if same else f"{module}:{name} does not name it"
    if why is not None:
        raise UsageError(
            f"{what} {shown!r} cannot be named for worker processes ('package.module:function'): {why}", hint=MAP_HINT
        )
    return f"{module}:{name}"


def resolve(path: str, what: str = "map") -> Callable:
    """The function (or class, a ``what``) ``"package.module:function"`` names (imported here: in a
    worker, its first use)."""
    module, _, name = path.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as e:
        raise UsageError(f"{what} {path!r} cannot be imported: {e}", hint=MAP_HINT) from None
    if not callable(obj):
        raise UsageError(f"{what} {path!r} names a {type(obj).__name__}, not a function", hint=MAP_HINT)
    return obj


# -- options -------------------------------------------------------------------------------------------
def options_to_json(o: LoaderOptions) -> dict[str, Any]:
    """Every field of ``o`` as JSON: tuples as lists, ``parallel`` as its fields, ``map`` as its import path."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(o):
        v = getattr(o, f.name)
        if f.name == "map" and v is not None:
            v = import_path(v)
        elif isinstance(v, Parallel):
            v = dataclasses.asdict(v)
        elif isinstance(v, tuple):
            v = list(v)
        out[f.name] = v
    return out


def options_from_json(doc: dict[str, Any]) -> LoaderOptions:
    """The inverse of ``options_to_json``; ``LoaderOptions`` checks every value."""
    v = dict(doc)
    try:
        if v.get("resize") is not None:
            v["resize"] = tuple(v["resize"])
        if v.get("parallel") is not None:
            v["parallel"] = Parallel(**v["parallel"])
    except TypeError as e:
        raise FormatError(f"loader description: {e}") from None
    if v.get("map") is not None:
        v["map"] = resolve(v["map"])
    return with_overrides(None, v)


# -- the record ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SourceSpec(Record):
    """A source as the loader was given it: a catalog reference, a split, a (normalised) weight."""

    ref: str
    split: str | None
    weight: float


@dataclass(frozen=True, slots=True)
class WorkerSpec(Record):
    """A loader for another process, and (for the loader's own worker processes) the worker's place."""

    FORMAT = SPEC_FORMAT
    factory: str  # the loader's class by import path ("dsbuild.loader.pipeline:Loader"): its from_description
    sources: tuple[SourceSpec, ...]
    options: dict[str, JsonValue]  # ``options_to_json``
    sys_path: tuple[str, ...]  # the parent's: a map function's module is found where the parent found it
    worker: int = field(default=0, metadata=spec(minimum=0))
    prefix: str = field(default="", metadata=spec(pattern=r"[0-9a-z]*"))  # its ring's segment names
    slots: int = field(default=1, metadata=spec(minimum=1))
    budget: int | None = field(default=None, metadata=spec(minimum=0))  # bytes of shared memory for its ring

    def text(self) -> str:
        return canonical_json(self.to_json()).decode()

    @classmethod
    def read(cls, text: str) -> WorkerSpec:
        return cls.from_json(
            loads_bounded(text, max_bytes=MAX_SPEC_BYTES, what="loader description"), "loader description"
        )


def _utf8(path: str) -> bool:
    try:
        path.encode()
    except UnicodeEncodeError:
        return False
    return True


def describe(loader: Any, **place: Any) -> WorkerSpec:
    """``loader`` (a ``Loader`` or ``Mixture``) as a ``WorkerSpec``; ``place``: the worker's fields. Its
    class goes by import path, as a map function does: this module never imports the pipeline (which
    imports the workers that use it)."""
    return WorkerSpec(
        factory=import_path(type(loader), what="loader class"),
        sources=tuple(SourceSpec(ref, split, float(w)) for (ref, split), w in zip(loader._specs, loader.weights)),
        options=options_to_json(loader.options),
        sys_path=tuple(os.path.abspath(p) for p in sys.path if _utf8(p)),  # ("": this folder, not the worker's)
        **place,
    )


def rebuild(spec: WorkerSpec) -> Any:
    """The loader ``spec`` describes (not opened); the parent's ``sys.path`` first, so its map imports."""
    sys.path[:] = [*spec.sys_path, *(p for p in sys.path if p not in spec.sys_path)]
    options = options_from_json(spec.options)
    build = getattr(resolve(spec.factory, what="loader class"), "from_description", None)
    if build is None:
        raise FormatError(f"loader description: {spec.factory} is not a dsbuild loader class")
    return build([(s.ref, s.split, s.weight) for s in spec.sources], options)
