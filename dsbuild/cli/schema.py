"""`dsbuild schema`: the JSON Schemas of the files dsbuild reads (the capture contract)."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, QUIET
from dsbuild.cli.render import Out

EXAMPLES = """\b
Examples:
  dsbuild schema capture                      # every capture file's schema
  dsbuild schema capture session > session.schema.json
  dsbuild schema capture actions --json
The contract in words: docs/capture-format.md. Exit: 0, 2 an unknown name."""

WHATS = ("capture",)  # what has schemas: the files of a capture (session.json and its streams)


def _names() -> tuple[str, ...]:
    from dsbuild.formats.capture import SCHEMAS

    return SCHEMAS


def schema(
    what: str = typer.Argument(..., metavar="WHAT", help="What to print the schemas of: capture."),
    name: str = typer.Argument(
        None, metavar="NAME", help="One file's schema: session, actions, telemetry or text (default: all)."
    ),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Print the JSON Schemas of a capture's files.

    session.json and one line of each JSON Lines stream, as the converter checks them. With NAME, that
    schema alone (a JSON document); without, all of them (--json: one object keyed by name)."""
    from dsbuild.core.errors import UsageError
    from dsbuild.formats.capture import DOCS, capture_schema

    if what not in WHATS:
        raise UsageError(f"schema {what!r}: unknown; expected one of {', '.join(WHATS)}", hint=f"see {DOCS}")
    if name is not None and name not in _names():
        raise UsageError(
            f"schema capture {name!r}: unknown file; expected one of {', '.join(_names())}",
            hint="`dsbuild schema capture` prints them all",
        )
    o = Out(as_json, quiet)
    if name is not None:
        return o.json(capture_schema(name))
    schemas = {n: capture_schema(n) for n in _names()}
    if as_json:
        return o.json(schemas)
    if quiet:
        for n in schemas:
            o.value(n)
        return
    for n, s in schemas.items():
        o.value(f"# {s['title']}  (dsbuild schema capture {n})")
        o.json(s)


def register(app: typer.Typer) -> None:
    app.command("schema", epilog=EXAMPLES)(schema)
