"""Shared output helpers: JSON to stdout, tables and progress with rich (plain lines when not a TTY)."""

from __future__ import annotations

import json
import sys
import time

from rich.console import Console

console = Console(stderr=True)


def print_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


class SessionProgress:
    """A rich bar on a terminal (sessions, clips, MB/s, ETA); a plain line per session otherwise."""

    def __init__(self, label: str, enabled: bool = True):
        self.label = label
        self.enabled = enabled
        self._bar = None
        self._task = None

    def __enter__(self) -> "SessionProgress":
        if self.enabled and console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[clips]} clips  {task.fields[rate]}"),
                                 TimeRemainingColumn(), console=console, auto_refresh=False)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=None, clips=0, rate="")
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def __call__(self, p) -> None:
        elapsed = max(time.monotonic() - p.started, 1e-9)
        rate = f"{p.bytes / elapsed / 1e6:.1f} MB/s"
        if self._bar is not None:
            self._bar.update(self._task, total=p.total, completed=p.done, clips=p.samples, rate=rate)
            self._bar.refresh()  # no refresh thread: convert forks workers, which must not inherit one
        elif self.enabled:
            console.print(f"{self.label}: {p.done}/{p.total} sessions, {p.samples} clips, {rate}"
                          + (f", {p.quarantined} quarantined" if p.quarantined else ""), highlight=False)
