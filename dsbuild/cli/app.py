"""The `dsbuild` entry point. Errors are mapped to exit codes here and only here:
0 success, 1 checks failed or --strict found quarantined input, 2 usage or input error."""

from __future__ import annotations

import importlib
import sys

import typer

from dsbuild.core.errors import DsbuildError

app = typer.Typer(
    name="dsbuild",
    help="Turn raw game captures into versioned, validated, deterministic training datasets.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# One module per command; each exposes `register(app)`. Heavy imports happen inside the commands.
COMMANDS = ("samples", "convert", "log", "tag", "diff", "lineage", "verify", "query", "gc", "split", "validate", "bench", "export")
for _name in COMMANDS:
    importlib.import_module(f"dsbuild.cli.{_name}").register(app)


def main() -> None:
    debug = "--debug" in sys.argv
    if debug:
        sys.argv.remove("--debug")
    try:
        rc = app(standalone_mode=False)  # click returns the code of typer.Exit in this mode
    except DsbuildError as e:
        if debug:
            raise
        typer.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        typer.echo("interrupted; nothing was committed", err=True)
        sys.exit(130)
    except Exception as e:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(2)
        if isinstance(e, click.exceptions.Abort):
            sys.exit(130)
        raise
    sys.exit(rc if isinstance(rc, int) else 0)
