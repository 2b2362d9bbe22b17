"""Runs many ``dsbuild`` commands in one process, through the entry point the executable calls
(``dsbuild.cli.app.run``: parsing, the library, and the one map from errors to exit codes), so a sweep of
every command over every forged catalog costs one interpreter start instead of one per command.

    python -m tests.security.driver < commands.json   (a JSON list of argument lists)

prints a JSON list of {"args", "exit", "stderr", "seconds"}: each command's exit code, what it wrote on
stderr and how long it took."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path


def drive(commands: list[list[str]]) -> list[dict]:
    """Run ``commands`` (argument lists) through the driver in one subprocess (the environment is this
    process's, as the ``dsbuild`` executable's would be); returns main's list, one result per command."""
    from tests.cli.clitools import env

    p = subprocess.run(
        [sys.executable, "-m", "tests.security.driver"],
        input=json.dumps(commands),
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env=env(),
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def main() -> None:
    from dsbuild.cli.app import build_command, run

    command, out = build_command(), []
    for args in json.load(sys.stdin):
        err, started = io.StringIO(), time.monotonic()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = run(args, command)
        out.append({"args": args, "exit": code, "stderr": err.getvalue(), "seconds": time.monotonic() - started})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
