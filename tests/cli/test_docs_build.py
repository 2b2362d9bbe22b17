"""The docs site builds strictly: ``sphinx-build -W --keep-going -b html docs OUT`` (every warning is an
error: a broken link between pages, a page no toctree lists, a docstring autodoc cannot render, an
include that is gone). Needs Sphinx, MyST-Parser and Furo (the ``docs`` extra); skips without them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    for module in ("sphinx", "myst_parser", "furo"):
        pytest.importorskip(module, reason=f"{module} is not installed: pip install sphinx myst-parser furo")
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            "-d",
            out / "doctrees",
            ROOT / "docs",
            out / "html",
        ],
        capture_output=True,
        text=True,
    )
    return build, out / "html"


def test_the_site_builds_without_a_warning(site):
    build, _ = site
    assert build.returncode == 0, f"sphinx-build -W failed:\n{build.stderr[-6000:]}"
    assert "WARNING" not in build.stderr and "ERROR" not in build.stderr, build.stderr[-6000:]


def test_every_page_is_in_the_site_and_the_api_is_generated(site):
    build, html = site
    assert build.returncode == 0, build.stderr[-3000:]
    pages = {p.stem for p in (ROOT / "docs").glob("*.md")}
    assert pages <= {p.stem for p in html.glob("*.html")}
    api = (html / "api.html").read_text()
    for name in (
        "dsbuild.loader.Loader",
        "dsbuild.loader.LoaderOptions",
        "dsbuild.export.export",
        "dsbuild.ray.read_version",
    ):
        assert f'id="{name}"' in api, f"autodoc did not document {name}"
    # docs/performance.md includes benchmarks/RESULTS.md: its title is on the page
    title = next(
        line[2:] for line in (ROOT / "benchmarks/RESULTS.md").read_text().splitlines() if line.startswith("# ")
    )
    performance = re.sub(r"<[^>]+>", " ", (html / "performance.html").read_text())
    assert all(word in performance for word in re.findall(r"[A-Za-z0-9]+", title)), title
