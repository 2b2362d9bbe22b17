"""How the CLI writes: results on stdout, progress and errors on stderr, shaped by where they go.

- A terminal gets rich tables and styled lines; ids are shortened to 12 characters (``--no-trunc``
  keeps them whole).
- A pipe or a file gets plain lines: tables become tab-separated rows under a header line, ids stay
  whole and nothing is wrapped, so ``cut -f1`` and CI logs work.
- ``--json`` prints one JSON document on stdout and nothing else; ``--quiet`` prints only the
  command's essential value (an id, a path) or nothing.

Text from captures and catalogs (titles, players, session ids, member names, SQL results) is data:
it is never parsed as rich markup (every string goes through ``rich.text.Text``) and control
characters are shown escaped, so a title like ``[bold red]x`` or an ANSI escape prints as written.

rich is imported only to draw on a terminal: a pipe, a file, ``--json`` and ``--quiet`` never load it
(a sixth of a short command's start-up).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from functools import cache
from typing import TYPE_CHECKING, TypeGuard

from dsbuild.core.jsonio import clean  # (text from a catalog or capture never drives the terminal)

if TYPE_CHECKING:
    from rich.console import ConsoleRenderable
    from rich.progress import Progress as Bars
    from rich.progress import TaskID

SHORT_ID = 12
NO_TRUNC_WIDTH = 1000  # columns a --no-trunc table may take (the terminal wraps what it cannot show)
PLAIN_EVERY = 2.0  # seconds between progress lines when stderr is not a terminal


@cache
def err():
    """The rich console on stderr (for a terminal; see ``to_stderr``)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)


def styled(*parts: str | tuple[object, str]):
    """A rich ``Text`` from parts; a ``(value, style)`` part is styled. Values are never markup."""
    from rich.text import Text

    out = Text()
    for part in parts:
        value, style = part if isinstance(part, tuple) else (part, "")
        out.append(clean(value), style=style)
    return out


def plain(*parts: str | tuple[object, str]) -> str:
    """The same parts as one line of plain text (styles dropped)."""
    return "".join(clean(part[0] if isinstance(part, tuple) else part) for part in parts)


def to_stderr(*parts: str | tuple[object, str]) -> None:
    """One line on stderr: styled on a terminal, plain otherwise."""
    try:
        if sys.stderr.isatty():
            err().print(styled(*parts))
        else:
            sys.stderr.write(plain(*parts) + "\n")
            sys.stderr.flush()
    except OSError:
        mute_stderr()


def mute_stderr() -> None:
    """stderr's reader went away (``2> >(head -c1)``) or it cannot be written: what goes there (progress,
    remarks) is the user's to drop, never a reason to stop the work. Later writes go nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stderr.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _renderable(c: object) -> TypeGuard[ConsoleRenderable]:
    return hasattr(c, "__rich_console__")  # (without importing rich)


def _cell(c: object) -> ConsoleRenderable | str:
    """A table cell: a rich renderable (from a caller that styles it) is kept, anything else cleaned."""
    return c if _renderable(c) else clean(c)


def _plain_cell(c: object) -> str:
    return c if isinstance(c, str) else str(getattr(c, "plain", c))


def _finite(obj: object) -> object:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def json_text(obj: object, indent: int | None = 2) -> str:
    """Strict JSON (NaN and infinities become null; dates, decimals and bytes become strings)."""
    return json.dumps(_finite(obj), indent=indent, sort_keys=True, default=str, ensure_ascii=False, allow_nan=False)


class Out:
    """One command's output settings: ``--json``, ``--quiet``, ``--no-trunc`` and whether stdout is a
    terminal."""

    def __init__(self, json: bool = False, quiet: bool = False, no_trunc: bool = False):
        self.as_json, self.quiet, self.no_trunc = json, quiet, no_trunc
        self.tty = sys.stdout.isatty()
        self.console = None
        if self.tty and self.human:
            from rich.console import Console

            self.console = Console(highlight=False, emoji=False, soft_wrap=False)

    @property
    def human(self) -> bool:
        """Whether the human-readable report is wanted (not --json, not --quiet)."""
        return not self.as_json and not self.quiet

    def id(self, value: str | None) -> str:
        """A version, content or hash id: shortened on a terminal unless --no-trunc, whole otherwise."""
        if not value:
            return "-"
        return value[:SHORT_ID] if self.tty and not self.no_trunc else value

    def when(self, stamp: str | None) -> str:
        """A UTC timestamp: to the minute on a terminal, whole otherwise."""
        if not stamp:
            return "-"
        return stamp[:16].replace("T", " ") if self.tty and not self.no_trunc else stamp

    def size(self, n: int | None) -> str:
        """A byte count: readable on a terminal (1.1 MB), the exact integer otherwise."""
        if n is None:
            return "-"
        if not self.tty:
            return str(n)
        for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
            if n >= scale:
                return f"{n / scale:.1f} {unit}"
        return f"{n} B"

    def json(self, obj: object) -> None:
        sys.stdout.write(json_text(obj) + "\n")
        sys.stdout.flush()

    def csv(self, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
        """Rows as CSV with a header: exact to a file or pipe; on a terminal, text cells have their
        control characters escaped like every other report (capture text can hold ANSI escapes)."""
        import csv

        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow([clean(v) if self.tty and isinstance(v, str) else v for v in r])

    def value(self, text: object) -> None:
        """The essential value of a command (printed even with --quiet, never with --json)."""
        if not self.as_json:
            sys.stdout.write(clean(text) + "\n")

    def row(self, values: Sequence[object]) -> None:
        """One row of values, tab-separated (each value cleaned: a tab or newline inside one is escaped,
        the separators are real tabs); printed even with --quiet, never with --json."""
        if not self.as_json:
            sys.stdout.write("\t".join(clean(v) for v in values) + "\n")

    def line(self, *parts: str | tuple[object, str]) -> None:
        """One line of the human report (styled on a terminal)."""
        if not self.human:
            return
        if self.console is not None:
            self.console.print(styled(*parts), overflow="fold")
        else:
            sys.stdout.write(plain(*parts) + "\n")

    def table(
        self,
        columns: Sequence[str],
        rows: Iterable[Sequence[object]],
        *,
        title: str | None = None,
        wide: Sequence[str] = (),
        styles: dict[str, str] | None = None,
    ) -> None:
        """A table: rich on a terminal (``wide`` columns never wrap), tab-separated lines under a header line
        otherwise (the header alone when there are no rows: a script reads "none", not "no output")."""
        cells = [[_cell(c) for c in row] for row in rows]
        if not self.human or (not cells and self.console is not None):
            return
        if self.console is None:
            if title:
                sys.stdout.write(f"# {clean(title)}\n")
            sys.stdout.write("\t".join(columns) + "\n")
            for row in cells:
                sys.stdout.write("\t".join(_plain_cell(c) for c in row) + "\n")
            return
        from rich.table import Table
        from rich.text import Text

        t = Table(
            title=clean(title) if title else None,
            box=None,
            padding=(0, 1, 0, 1),
            pad_edge=False,
            highlight=False,
            header_style="bold underline",
        )
        for name in columns:
            t.add_column(
                name,
                no_wrap=name in wide,
                overflow="fold",
                min_width=None if name in wide else 4,
                style=(styles or {}).get(name, ""),
            )
        for row in cells:
            t.add_row(*(Text(c) if isinstance(c, str) else c for c in row))
        if not self.no_trunc:
            self.console.print(t)
            return
        # --no-trunc: whole cells, wider than the terminal if need be (it wraps the lines), never cropped
        # (rich caps a print's width at the console's, so the console is widened for this table)
        width = self.console.width
        self.console.width = max(width, NO_TRUNC_WIDTH)
        try:
            self.console.print(t, crop=False)
        finally:
            self.console.width = width

    def pairs(self, items: Iterable[tuple[str, object]]) -> None:
        """Key/value lines: aligned on a terminal, ``key<TAB>value`` otherwise."""
        lines = [(k, clean(v)) for k, v in items]
        if not self.human:
            return
        if self.console is None:
            for k, v in lines:
                sys.stdout.write(f"{k}\t{v}\n")
            return
        from rich.table import Table
        from rich.text import Text

        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        for k, v in lines:
            grid.add_row(Text(k), Text(v))
        self.console.print(grid)

    def note(self, *parts: str | tuple[object, str]) -> None:
        """A remark for the person (stderr), e.g. a warning; silent with --quiet or --json."""
        if self.human:
            to_stderr(*parts)


class Progress:
    """Progress of long work on stderr: a live bar on a terminal; otherwise a plain line at most every
    ``PLAIN_EVERY`` seconds plus one at the end; nothing with --json or --quiet.

    ``update(done, total, stage=..., detail=...)`` may be called from worker threads, and stages may run
    at once (validate hashes shards while it reads samples): each stage has its own bar. The bar is
    redrawn only on updates (no refresh thread: convert forks workers, which must not inherit one).
    """

    def __init__(self, label: str, out: Out):
        self.label = label
        self.enabled = out.human
        self.live = self.enabled and sys.stderr.isatty()
        self._bar: Bars | None = None
        self._tasks: dict[str, TaskID] = {}  # stage -> its bar
        self._lock = threading.Lock()
        self._last_line = 0.0
        self._pending: dict[str, tuple[float, str]] = {}  # stage -> (when, its latest line), not printed yet

    def __enter__(self) -> Progress:
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                console=err(),
                auto_refresh=False,
                transient=True,
            )
            self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
        elif exc[0] is None:
            # each stage's latest state, if it came after the last line printed (an older one is stale: its
            # stage was superseded, as bench's rounds are, and it printed out of order at the end)
            for _, text in sorted(v for v in self._pending.values() if v[0] > self._last_line):
                to_stderr(text)

    def update(self, done: int, total: int | None, *, stage: str = "", detail: str = "") -> None:
        if not self.enabled:
            return
        description = f"{self.label} {stage}".strip()
        with self._lock:
            if self._bar is not None:
                if stage not in self._tasks:
                    self._tasks[stage] = self._bar.add_task(description, total=total, detail="")
                self._bar.update(self._tasks[stage], completed=done, total=total, detail=clean(detail))
                try:
                    self._bar.refresh()
                except OSError:
                    mute_stderr()
                return
            text = f"{description}: {done}/{total if total is not None else '?'}" + (
                f", {clean(detail)}" if detail else ""
            )
            now = time.monotonic()
            finished = total is not None and done >= total
            if finished or now - self._last_line >= PLAIN_EVERY:
                to_stderr(text)
                self._last_line = now
                self._pending.pop(stage, None)
            else:
                self._pending[stage] = (now, text)


def rate(nbytes: int, started: float) -> str:
    """Total bytes over elapsed time, as MB/s."""
    return f"{nbytes / max(time.monotonic() - started, 1e-9) / 1e6:,.1f} MB/s"
