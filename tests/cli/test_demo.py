"""`make demo` is the README's first command: it runs here, end to end, as a newcomer runs it (real Atari
gameplay when the `atari` extra is installed, whose games have different action sets; synthetic captures
otherwise), into a temporary folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_runs_end_to_end(tmp_path):
    """``make demo`` is ``venv`` then ``demo-run``; the steps run here with the dsbuild of the environment the
    tests run in (building a second environment inside a test cost minutes and gigabytes), the bench step
    shortened (its length is not what is tested)."""
    demo = tmp_path / "demo"
    bin_dir = Path(sys.executable).parent
    p = subprocess.run(
        ["make", "-C", str(ROOT), "demo-run", f"DEMO={demo}", f"BIN={bin_dir}", "DEMO_BENCH_SECONDS=6"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, f"make demo exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    assert "warning" not in p.stdout.lower() + p.stderr.lower(), p.stdout + p.stderr
    for report in ("validate.html", "validate.xml", "bench.html"):
        assert (demo / report).stat().st_size > 0, report
    assert "ACCEPTED" in p.stdout
