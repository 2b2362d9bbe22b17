"""Every recipe in docs/interop.md runs as written, in order, in one empty folder.

```python``` blocks run with this interpreter, ```sh``` blocks with bash (the venv's ``dsbuild`` first
on PATH); a block right after ``<!-- illustrative ... -->`` is skipped, and one after
``<!-- needs: MODULE -->`` runs only where MODULE imports (an optional extra's, e.g. nvidia.dali). HF runs
offline with its cache in the folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "interop.md"
BLOCK = re.compile(r"(?:<!-- (illustrative|needs: ([\w.]+))[^>]*-->\s*)?^```(python|sh)\n(.*?)^```", re.S | re.M)
PEERS = ("megatron.energon", "wids", "datasets", "litdata", "grain", "ray", "polars", "webdataset")


def blocks() -> list[tuple[str, str, bool]]:
    """(language, code, illustrative) of every fenced python/sh block, in order; a block whose module is
    absent counts as illustrative."""
    return [
        (m.group(3), m.group(4), m.group(1) == "illustrative" or (m.group(2) is not None and not _imports(m.group(2))))
        for m in BLOCK.finditer(DOC.read_text())
    ]


def _imports(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # (its parent package is absent)
        return False


def test_the_doc_has_a_recipe_per_tool():
    text = DOC.read_text()
    for tool in (
        "webdataset",
        "wids",
        "Hugging Face datasets",
        "Megatron-Energon",
        "NVIDIA DALI",
        "Mosaic Streaming",
        "LitData",
        "grain",
        "torch DataLoader",
        "JAX",
        "Ray Data",
        "duckdb",
        "polars",
    ):
        assert f"## {tool}" in text, tool
    assert sum(not illustrative for _, _, illustrative in blocks()) >= 15


def test_every_recipe_runs(tmp_path):
    import importlib.util

    missing = [m for m in PEERS if importlib.util.find_spec(m.split(".")[0]) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: pip install -e '.[peers,ray]' (make test installs them)")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "hf-cache"),
        "RAY_AUTH_MODE": "disabled",
    }
    for i, (lang, code, illustrative) in enumerate(blocks()):
        if illustrative:
            continue
        cmd = [sys.executable, "-c", code] if lang == "python" else ["bash", "-euo", "pipefail", "-c", code]
        run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert run.returncode == 0, f"block {i} ({lang}) of {DOC.name} failed:\n{code}\n{run.stderr[-3000:]}"
