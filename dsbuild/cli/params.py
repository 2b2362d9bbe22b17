"""Options shared by the commands, so each flag means one thing everywhere.

Conventions (README "Flag conventions"):
- ``--workers N`` is always worker *processes* (0 = one per core); ``--threads N`` is always threads.
- ``--split NAME/SPLIT`` names one split of a split set (``main/train``); ``--split-set NAME`` names
  a whole split set (``main``).
- ``--json`` prints one JSON document on stdout; ``--quiet``/``-q`` prints only the essential value.
- Catalogs, refs and capture roots are strings: local paths or fsspec URLs (``s3://``, ``file://``),
  never collapsed into local paths.
"""

from __future__ import annotations

import typer

JSON = typer.Option(False, "--json", help="Print one JSON document on stdout; an error is one JSON object on stderr.")
QUIET = typer.Option(False, "--quiet", "-q", help="No progress and no report: only the essential value, or nothing.")
WORKERS = typer.Option(0, "--workers", min=0, metavar="N", help="Worker processes (0 = one per core).")
EXECUTORS = ("local", "ray")
SEED_MAX = (1 << 53) - 1  # seeds are recorded in reports and checkpoints: exact in every JSON reader


def seed_option(help: str):
    return typer.Option(0, "--seed", min=0, max=SEED_MAX, metavar="N", help=help)


def choice(flag: str, values):
    """A callback refusing values outside ``values`` (a tuple, or a function returning one, for lists that
    live in a heavy module), naming the flag and the closest valid value."""

    def check(value: str | None) -> str | None:
        allowed = values() if callable(values) else values
        if value is not None and value not in allowed:
            import difflib

            close = difflib.get_close_matches(value, allowed, n=1)
            raise typer.BadParameter(
                f"{value!r} is not one of {', '.join(allowed)}" + (f"; did you mean {close[0]!r}?" if close else ""),
                param_hint=flag,
            )
        return value

    return check


EXECUTOR = typer.Option(
    "local",
    "--executor",
    metavar="local|ray",
    callback=choice("--executor", EXECUTORS),
    help="local worker processes, or a Ray cluster (pip install 'dsbuild[ray]').",
)
RAY_ADDRESS = typer.Option(
    None,
    "--ray-address",
    metavar="ADDRESS",
    help="Join this Ray cluster ('auto' or ray://HOST:10001); default: start a local Ray.",
)
REF = typer.Argument(
    ...,
    metavar="REF",
    help="PATH[@VERSION]: a catalog folder or fsspec URL (s3://...), and a "
    "version id, unique id prefix or tag (default: the newest).",
)
CATALOG = typer.Argument(..., metavar="CATALOG", help="Catalog folder or fsspec URL (s3://bucket/catalog).")


def report_files(
    paths: dict[str, str | None], *, inputs: dict[str, str | None] | None = None, catalog: str | None = None
) -> dict[str, str | None]:
    """Each report option's file, checked before any work: a folder that does not exist (a typo), a path
    that is a folder, a device, a FIFO or a link to one, one file given to two options, a file the command
    reads (``inputs``: option -> path) and a file inside the ``catalog`` it judges are exit 2 now, not
    after a long run whose verdict they would lose (or whose spec or version they would overwrite). A link
    to a file is written through (the file it names is replaced, not the link). Returns the paths to
    write, links resolved."""
    import os
    import shlex
    from pathlib import Path

    from dsbuild.core.errors import StorageError, UsageError
    from dsbuild.core.store import is_url, local_path

    read = {os.path.realpath(p): o for o, p in (inputs or {}).items() if p}
    root = Path(os.path.realpath(local_path(catalog))) if catalog and not is_url(catalog) else None
    out: dict[str, str | None] = {}
    for option, path in paths.items():
        if path is None:
            out[option] = None
            continue
        target = Path(os.path.realpath(path))
        if target.is_dir():
            raise UsageError(f"{option} {path}: is a folder; give a file name")
        if target.exists() and not target.is_file():
            raise UsageError(
                f"{option} {path}: is not a regular file (a device, a FIFO or a link to one); give a file name"
            )
        if not target.parent.is_dir():
            folder = Path(path).parent
            raise UsageError(
                f"{option} {path}: folder {folder} does not exist", hint=f"mkdir -p {shlex.quote(str(folder))}"
            )
        if not os.access(target.parent, os.W_OK | os.X_OK):
            raise StorageError(f"{option} {path}: cannot write in {target.parent} (permission denied)")
        twice = [o for o, p in out.items() if p == str(target)]
        if twice:
            raise UsageError(f"{option} {path}: is also the file of {twice[0]}; give each report its own file")
        if str(target) in read:
            raise UsageError(
                f"{option} {path}: is the file of {read[str(target)]}, which this command reads; "
                "a report never replaces its input",
                hint="give the report another file name",
            )
        if root is not None and (target == root or root in target.parents):
            raise UsageError(
                f"{option} {path}: is inside the catalog {catalog}; a report there would change the catalog it judges",
                hint="write reports outside the catalog",
            )
        out[option] = str(target)
    return out
