"""The peers import through their own documented entry points in the environment `make` builds, and the
complaints `pip check` still makes there are exactly the ones docs/interop.md lists as harmless."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "interop.md"
PEERS = ("streaming", "litdata", "megatron.energon", "transformers", "torchvision")
ENTRY_POINTS = (
    "from streaming import StreamingDataset",
    "import litdata",
    "from megatron.energon import get_train_dataset",
)


def complaint(line: str) -> str:
    """A `pip check` line without the installed version it names (numpy is not pinned: a newer one is
    the same complaint)."""
    return re.sub(r"(, but you have \S+) \S+\.$", r"\1", line.strip())


def documented() -> set[str]:
    """The complaints listed between the doc's pip-check markers, one bullet each."""
    text = DOC.read_text()
    section = text[text.index("<!-- pip-check-begin -->") : text.index("<!-- pip-check-end -->")]
    return {complaint(line) for line in re.findall(r"^- `([^`]+)`:", section, re.M)}


@pytest.fixture(scope="module")
def peers():
    missing = [m for m in PEERS if _absent(m)]
    if missing:
        pytest.skip(f"the peers `make` installs are absent here: {', '.join(missing)}")


def _absent(module: str) -> bool:
    try:
        return find_spec(module) is None
    except ModuleNotFoundError:  # (its parent package is absent)
        return True


def test_each_peer_imports_through_its_own_entry_point(peers):
    """The documented lines, in a fresh interpreter: this one may hold dsbuild's own import route to
    Mosaic's class (``export.mds.streaming_dataset``), which bypasses ``streaming/__init__.py``."""
    code = "import warnings; warnings.simplefilter('ignore')\n" + "\n".join(
        ENTRY_POINTS
    )  # (torchvision's image extension)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]


def test_pip_check_complains_of_exactly_what_the_docs_call_harmless(peers):
    p = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    got = {complaint(line) for line in p.stdout.splitlines() if line.strip()}
    assert len(documented()) >= 3  # (the doc's list was found)
    assert got == documented(), f"not documented: {sorted(got - documented())}; gone: {sorted(documented() - got)}"
