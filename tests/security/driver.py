"""Runs many ``dsbuild`` commands in one process, through the entry point the executable calls
(``dsbuild.cli.app.run``: parsing, the library, and the one map from errors to exit codes), so a sweep of
every command over every forged catalog costs one interpreter start instead of one per command.

    python -m tests.security.driver < commands.json   (a JSON list of argument lists)

prints a JSON list of {"args", "exit", "stderr"}: each command's exit code and what it wrote on stderr."""

from __future__ import annotations

import contextlib
import io
import json
import sys


def main() -> None:
    from dsbuild.cli.app import build_command, run

    command, out = build_command(), []
    for args in json.load(sys.stdin):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = run(args, command)
        out.append({"args": args, "exit": code, "stderr": err.getvalue()})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
