"""The `dsbuild` executable's entry point: a Ctrl-C or SIGTERM while the interpreter still loads the CLI
(typer, click, rich: the first tenth of a second) ends the process with the one-line message and exit
130/143, not a traceback (also while the command is built: typer reads every parameter's type hints); from
``dsbuild.cli.app.run`` on, interrupts are handled as every command's are.
A signal the parent set to be ignored (a background job of a script) stays ignored throughout."""

from __future__ import annotations

import os
import signal

WORDS = {signal.SIGINT: b"interrupted", signal.SIGTERM: b"terminated"}


def _loading(signum, frame) -> None:
    os.write(2, WORDS.get(signum, b"interrupted") + b"; nothing was changed\n")
    os._exit(128 + signum)  # 130 for Ctrl-C, 143 for SIGTERM


def main() -> None:
    before = {sig: signal.getsignal(sig) for sig in WORDS}
    for sig, handler in before.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, _loading)
    from dsbuild.cli.app import main as run_cli

    run_cli()  # (``app.run`` takes the signals over, the ignored ones excepted, once the command is built)
