"""FOR THE LEAD TO MOVE INTO THE LIBRARY. Library functions the CLI needs that do not exist yet.

The CLI only parses and renders; these are here (small, self-contained) so the commands work until
each moves to its package. Suggested homes:

- ``load_baseline``    -> ``dsbuild.bench.report``
"""

from __future__ import annotations

from pathlib import Path

from dsbuild.core.errors import UsageError


# -- dsbuild bench --baseline --------------------------------------------------------------------
def load_baseline(path: Path) -> dict:
    """A bench report saved with ``--save``, checked to be one (exit 2 otherwise)."""
    from dsbuild.bench.report import FORMAT
    from dsbuild.core.jsonio import loads_bounded

    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise UsageError(f"--baseline {path}: cannot read ({e.strerror})") from None
    doc = loads_bounded(data, max_bytes=1 << 26, what=str(path))
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("ratios"), dict):
        raise UsageError(f"--baseline {path}: not a {FORMAT} report", hint="write one with `dsbuild bench ... --save FILE`")
    return doc
