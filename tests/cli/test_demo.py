"""`make demo` is the README's first command: it runs here, end to end, as a newcomer runs it (real Atari
gameplay when the `atari` extra is installed, whose games have different action sets; synthetic captures
otherwise), into a temporary folder."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_runs_end_to_end(tmp_path):
    demo = tmp_path / "demo"
    p = subprocess.run(["make", "-C", str(ROOT), "demo", f"DEMO={demo}"], capture_output=True, text=True)
    assert p.returncode == 0, f"make demo exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    for report in ("validate.html", "validate.xml", "bench.html"):
        assert (demo / report).stat().st_size > 0, report
    assert "ACCEPTED" in p.stdout
