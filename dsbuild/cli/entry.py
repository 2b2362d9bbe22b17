"""The `dsbuild` executable's entry point: a Ctrl-C while the interpreter still loads the CLI (typer,
click, rich: the first tenth of a second) ends the process with the one-line message and exit 130, not a
traceback; from ``dsbuild.cli.app.main`` on, interrupts are handled as every command's are."""

from __future__ import annotations

import os
import signal


def _loading(signum, frame) -> None:
    os.write(2, b"interrupted; nothing was changed\n")
    os._exit(128 + signum)  # 130 for Ctrl-C, 143 for SIGTERM


def main() -> None:
    signal.signal(signal.SIGINT, _loading)
    signal.signal(signal.SIGTERM, _loading)
    from dsbuild.cli.app import main as run_cli

    run_cli()
