"""The ``dsbuild`` entry point, and the one place where failures become exit codes.

    0    success
    1    a check failed: validate rejected the version, verify found damage, split --check found a
         mismatch, --strict found quarantined sessions, bench found a regression (CheckFailed)
    2    usage or input: a bad flag or value, an unknown version, tag or split, a missing folder, a
         capture or file that breaks its format (UsageError, CaptureError, FormatError, parser errors)
    3    storage or environment: read-only or full disk, permissions, network, a damaged catalog, a
         dead worker, a missing optional extra or GPU (StorageError and subclasses, MissingDependency, OSError)
    70   internal error (a bug): one line; --debug shows the traceback
    130  interrupted (Ctrl-C); cleanup ran, the message says what was kept
    141  stdout was closed early (``dsbuild log | head -1``): no message
    143  terminated (SIGTERM): handled like Ctrl-C, cleanup ran

Errors are one line on stderr (``error: ...``), with ``hint: ...`` on a second line when there is
something to do; under ``--json`` they are one JSON object ``{"error", "exit_code", "hint"}``.
Command modules never exit on their own: they raise, and ``exit_code`` below decides.
"""

from __future__ import annotations

import errno
import importlib
import os
import signal
import sys

import typer

from dsbuild import __version__
from dsbuild.core.errors import (
    CaptureError,
    CheckFailed,
    DsbuildError,
    FormatError,
    MissingDependency,
    StorageError,
    UsageError,
)

try:  # typer >= 0.16 ships its own copy of click; older releases use the click package
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, NoSuchOption
    from typer._click.exceptions import UsageError as ParserError
except ImportError:  # pragma: no cover - depends on the installed typer
    # (the same classes, from the package typer < 0.16 uses; mypy sees typer's copy as another type)
    from click.exceptions import ClickException, NoArgsIsHelpError, NoSuchOption  # type: ignore[assignment]
    from click.exceptions import UsageError as ParserError  # type: ignore[assignment]

INTERNAL = 70
INTERRUPTED = 130
BROKEN_PIPE = 141
TERMINATED = 143

# One module per command, in the order of `dsbuild --help`; each exposes `register(app)`.
COMMANDS = (
    "samples",
    "schema",
    "convert",
    "info",
    "log",
    "shards",
    "tag",
    "diff",
    "lineage",
    "verify",
    "query",
    "split",
    "validate",
    "bench",
    "export",
    "push",
    "pull",
    "gc",
)
# What an interrupted command leaves behind (commits are atomic: a version, tag or split set appears
# whole or not at all).
KEPT = {
    "convert": "nothing was committed",
    "tag": "nothing was committed",
    "split": "nothing was committed",
    "samples": "sessions written so far remain in the output folder",
    "import": "nothing was written to CAPTURES",
    "gc": "every version is whole; some unreferenced files may already be gone",
    "validate": "each report file is the previous run's or this run's, whole (none is half-written)",
    "bench": "the rounds finished before it were reported (and saved with --save); none during start-up",
    "export": "run the same command again to finish the export",
    "push": "nothing was published; run the same command again to resume",
    "pull": "nothing was published; run the same command again to resume",
}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so the same cleanup as for Ctrl-C runs."""


app = typer.Typer(
    name="dsbuild",
    help="Turn raw game captures into versioned, validated, deterministic training datasets.",
    epilog="\b\nExamples:\n  dsbuild samples caps --sessions 3\n  dsbuild convert caps catalog\n"
    "  dsbuild log catalog\n\nEvery command has -h/--help with an example, --json and --quiet.\n"
    "Exit codes: 0 ok, 1 check failed, 2 usage or input, 3 storage or environment, 70 internal "
    "error, 130 interrupted, 143 terminated.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: option texts like PATH[@VERSION] are never read as markup
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit (works after any command)."),
    debug: bool = typer.Option(False, "--debug", help="Show the traceback of an error (works after any command)."),
    lock_timeout: float = typer.Option(
        None,
        "--lock-timeout",
        min=0,
        metavar="SECONDS",
        help="Give up (exit 3) when another command holds the catalog's lock this long (works after any "
        "command; default: wait, saying for whom).",
    ),
) -> None:
    """Turn raw game captures into versioned, validated, deterministic training datasets."""
    if lock_timeout is not None:
        from dsbuild.lineage.catalog import set_lock_timeout

        set_lock_timeout(lock_timeout)


def _root_options_first(args: list[str]) -> list[str]:
    """``--lock-timeout SECONDS`` given after the command (before any ``--``) moved in front of it, where the
    root option is parsed: like --debug, it works after any command."""
    end = args.index("--") if "--" in args else len(args)
    front, rest, i = [], [], 0
    while i < len(args):
        if i < end and args[i] == "--lock-timeout" and i + 1 < end:
            front += args[i : i + 2]
            i += 2
        elif i < end and args[i].startswith("--lock-timeout="):
            front.append(args[i])
            i += 1
        else:
            rest.append(args[i])
            i += 1
    return front + rest


for _name in COMMANDS:
    importlib.import_module(f"dsbuild.cli.{_name}").register(app)
importlib.import_module("dsbuild.cli.importer").register(app)  # the `import` group (a keyword: no cli/import.py)


def _no_type_noise(command) -> None:
    """Help shows metavars (NAME, SIZE, REF), never Python types like <str> or <bool>."""
    for sub in getattr(command, "commands", {}).values():
        if getattr(sub, "commands", None):
            _no_type_noise(sub)  # a group's own commands (`import video`)
    for cmd in [command, *getattr(command, "commands", {}).values()]:
        for p in cmd.params:
            if getattr(p, "is_flag", False) or getattr(p, "count", False) or p.param_type_name == "argument":
                p.display_type_rich = lambda ctx: None
            else:
                meta = p.metavar or (p.name or "value").upper()
                p.display_type_rich = lambda ctx, meta=meta: meta
            if p.param_type_name == "argument":
                name = p.metavar or (p.name or "arg").upper()
                p.get_usage_pieces = lambda ctx, name=name, req=p.required: [name if req else f"[{name}]"]


def build_command():
    command = typer.main.get_command(app)
    _no_type_noise(command)
    return command


def exit_code(e: BaseException) -> int:
    """The exit code of a failure (see the module docstring)."""
    if isinstance(e, Terminated):
        return TERMINATED
    if isinstance(e, KeyboardInterrupt):
        return INTERRUPTED
    if isinstance(e, CheckFailed):
        return 1
    if isinstance(e, (UsageError, CaptureError, FormatError, ParserError)):
        return 2
    if isinstance(e, ClickException):  # other parser-level problems (e.g. a file option) are usage too
        return 2
    if isinstance(e, (StorageError, MissingDependency, OSError, MemoryError)):
        return 3
    return INTERNAL


_OS_HINTS = {
    errno.EROFS: "the file system is read-only; write somewhere else",
    errno.ENOSPC: "free some space, then run the same command again",
    errno.EACCES: "check the permissions of that path",
    errno.EPERM: "check the permissions of that path",
    errno.ENOENT: "check the path",
}


def describe(e: BaseException, command: str | None) -> tuple[str, str | None]:
    """(one-line message, hint or None) for a failure."""
    if isinstance(e, KeyboardInterrupt):
        what = "terminated" if isinstance(e, Terminated) else "interrupted"
        # nothing is imported here: the interrupt may have landed in an extension module's import
        # (pyarrow's, under the catalog's), and importing it again from its half-made state can crash
        catalog = sys.modules.get("dsbuild.lineage.catalog")
        published = getattr(catalog, "PUBLISHED", ())
        if published:  # the interrupt came after the commit: the version is there, whole
            return f"{what} after version {', '.join(v[:12] for v in published)} was committed (whole)", None
        return f"{what}; {KEPT.get(command or '', 'nothing was changed')}", None
    if isinstance(e, NoSuchOption):
        msg = f"no such option {e.option_name}"
        close = sorted(p for p in e.possibilities or () if p not in ("--help", "-h"))
        if close:
            msg += f"; did you mean {', '.join(close)}?"
        return _parser_message(e, msg)
    if isinstance(e, NoArgsIsHelpError):
        return "a command is required", "`dsbuild --help` lists the commands"
    if isinstance(e, ClickException):
        return _parser_message(e, e.format_message())
    if isinstance(e, DsbuildError) and exit_code(e) != INTERNAL:
        return str(e), e.hint
    if isinstance(e, OSError):
        where = f"{e.filename}: " if e.filename else ""
        return f"{where}{e.strerror or e}", _OS_HINTS.get(e.errno or 0)
    if isinstance(e, MemoryError):
        return "out of memory", "run with fewer --workers or on a machine with more memory"
    return f"internal error: {type(e).__name__}: {e} (run with --debug for the traceback)", None


def _parser_message(e: ClickException, msg: str) -> tuple[str, str | None]:
    ctx = getattr(e, "ctx", None)
    path = ctx.command_path if ctx is not None else "dsbuild"
    msg = msg[:1].lower() + msg[1:]
    return f"{path}: {msg}", f"`{path} --help` shows the usage and an example"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def report(e: BaseException, *, command: str | None, as_json: bool, debug: bool) -> int:
    """Print a failure the one way (one line, or one JSON object) and return its exit code."""
    code = exit_code(e)
    if debug and not isinstance(e, (KeyboardInterrupt, ClickException)):
        import traceback

        traceback.print_exception(e)
    msg, hint = describe(e, command)
    if debug:
        msg = msg.replace(" (run with --debug for the traceback)", "")
    if as_json:
        from dsbuild.cli.render import json_text

        sys.stderr.write(json_text({"error": _one_line(msg), "exit_code": code, "hint": hint}, indent=None) + "\n")
    else:
        from dsbuild.cli.render import clean

        sys.stderr.write(
            f"error: {clean(_one_line(msg))}\n"
            if code not in (INTERRUPTED, TERMINATED)
            else f"{clean(_one_line(msg))}\n"
        )
        if hint:
            sys.stderr.write(f"hint: {clean(_one_line(hint))}\n")
    sys.stderr.flush()
    return code


def _on_sigint(signum, frame) -> None:
    if _in_import(frame):
        _end_now(KeyboardInterrupt())
    raise KeyboardInterrupt()


def _on_sigterm(signum, frame) -> None:
    if os.getpid() != _MAIN_PID:  # a forked worker: die as SIGTERM says (its parent reports)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    if _in_import(frame):
        _end_now(Terminated())
    raise Terminated()


def _in_import(frame) -> bool:
    """Whether ``frame`` runs inside an import (a command's lazy import of numpy, pyarrow, PyAV)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _end_now(e: KeyboardInterrupt) -> None:
    """End the process at once with the interrupt's one line and exit code. For an interrupt inside an
    import: raised there, it leaves an extension module half-made, and Python then crashed (SIGSEGV) or
    reported another error (numpy's "multiarray failed to import", its own traceback printed) when the
    module was touched again or at exit. An import writes nothing to undo; a build folder left by the
    exit is a dead build's, which the next build or ``gc`` removes."""
    if os.getpid() != _MAIN_PID:  # a forked worker: its parent reports
        os._exit(exit_code(e))
    msg, _ = describe(e, _RUNNING[0] if _RUNNING else None)
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    os.write(2, (_one_line(msg) + "\n").encode())
    os._exit(exit_code(e))


_MAIN_PID = os.getpid()
_RUNNING: list[str | None] = []  # the command the executable runs (for the message of an interrupt)


def _quiet_broken_pipe() -> int:
    """stdout's reader went away: drop what is left (no second error at exit) and exit quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
    return BROKEN_PIPE


def _unwritable_stdout(e: OSError) -> int:
    """stdout could not take the output (ENOSPC, EIO): one line on stderr, exit 3, and what is left unwritten
    dropped (the interpreter would try again at exit, with a traceback)."""
    _quiet_broken_pipe()
    from dsbuild.cli.render import to_stderr

    to_stderr(f"error: cannot write the output: {e.strerror or e}")
    return 3  # storage or environment (see `exit_code`)


def _streams_present() -> None:
    """A stream closed by the caller (``dsbuild log cat >&-``) is None in Python: give it /dev/null, so the
    command runs and what would go there is dropped, as the caller asked."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 (open for the life of the process)


def run(args: list[str], command=None, *, signals: bool = False) -> int:
    """Run ``dsbuild ARGS`` (with ``command``, the built click command, if the caller has it); return the
    exit code (never raises, never exits). ``signals`` (the executable): Ctrl-C and SIGTERM raise from here
    on, inside the one handler of every failure (``entry`` ended the process quietly while it loaded)."""
    head = args[: args.index("--")] if "--" in args else args
    debug, as_json = "--debug" in head, "--json" in head
    if debug:
        args = [a for i, a in enumerate(args) if not (a == "--debug" and i < len(head))]
    if "--version" in head:
        sys.stdout.write(f"dsbuild {__version__}\n")
        return 0
    command_name = next((a for a in head if a in COMMANDS or a == "import"), None)
    command = command or build_command()
    catalog = sys.modules.get("dsbuild.lineage.catalog")
    if catalog is not None:  # (a command run in a process that ran others: only its own commits count)
        catalog.PUBLISHED.clear()
        catalog.set_lock_timeout(None)
    args = _root_options_first(list(args))
    try:
        if signals:  # (a signal the parent set to be ignored stays ignored: a script's background job)
            _RUNNING[:] = [command_name]
            for sig, handler in ((signal.SIGINT, _on_sigint), (signal.SIGTERM, _on_sigterm)):
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    signal.signal(sig, handler)
        with command.make_context("dsbuild", list(args)) as ctx:
            command.invoke(ctx)
        sys.stdout.flush()
        return 0
    except typer.Exit as e:
        return e.exit_code
    except SystemExit as e:  # a library must not exit; pass its code through
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except NoArgsIsHelpError as e:  # bare `dsbuild`: the help, on stderr, and exit 2 (a command is required)
        sys.stderr.write(e.ctx.get_help() + "\n")
        return 2
    except BaseException as e:
        if isinstance(e, OSError) and e.errno == errno.EPIPE:
            return _quiet_broken_pipe()
        e = _interrupt_behind(e) or e
        try:
            return report(e, command=command_name, as_json=as_json, debug=debug)
        except BrokenPipeError:
            return _quiet_broken_pipe()


def _interrupt_behind(e: BaseException | None) -> KeyboardInterrupt | None:
    """The Ctrl-C (or SIGTERM) that caused ``e``, if one did: Python wraps an interrupt that lands in a
    class body's ``__set_name__`` (a lazy import while the options are parsed) in a RuntimeError, which
    was reported as an internal error."""
    seen = 0
    while e is not None and seen < 16:
        if isinstance(e, KeyboardInterrupt):
            return e
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def _whole_writes_to_stdout() -> None:
    """Under ``PYTHONUNBUFFERED=1`` (``-u``) stdout's text layer writes straight to the raw file, which
    may write only part of a large string and say nothing: a reader that went away (``| head``) got exit
    0 and a truncated ``--json`` document. A buffered writer finishes every write or raises; line
    buffering keeps the output as prompt as the user asked."""
    import io

    out = sys.stdout
    if isinstance(getattr(out, "buffer", None), io.RawIOBase):
        sys.stdout = io.TextIOWrapper(
            io.BufferedWriter(out.buffer), encoding=out.encoding, errors=out.errors, line_buffering=True
        )


def main() -> None:
    global _MAIN_PID
    _MAIN_PID = os.getpid()
    _streams_present()
    _whole_writes_to_stdout()
    command = build_command()
    command._main_shell_completion({}, "dsbuild", None)  # answers completion requests from the shell
    code = run(sys.argv[1:], command, signals=True)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = _quiet_broken_pipe()
    except OSError as e:  # a full disk behind `> file`: the output is not all there, said once
        if code == 0:
            code = _unwritable_stdout(e)
        else:  # the command already failed and said why: drop what is left
            _quiet_broken_pipe()
    try:
        sys.stderr.flush()
    except OSError:
        pass
    # The work is done and every stream is flushed: leave without interpreter teardown. pyarrow's
    # AWS SDK shutdown (pyarrow.fs is loaded with pyarrow.parquet) aborts the process in ~5% of exits
    # ("terminate called without an active exception", exit 134), which would turn a success into a
    # crash in CI.
    os._exit(code)


if __name__ == "__main__":
    main()
