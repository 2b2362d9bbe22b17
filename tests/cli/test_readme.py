"""The README cannot drift: every shell and Python block of README.md and docs/*.md runs as written, in
order, in one empty folder (with the repository's sample_data/), and exits as the document says. The
order is the reader's: README.md, then the pages in the order of docs/index.md's toctrees (the command
pages are one walk-through, each going on from the one before), then any page no toctree lists.
(docs/interop.md mixes Python and shell recipes that need the peers installed; its own runner is
tests/export/test_interop_docs.py.)

A shell block is a fence without a language or with sh, bash, shell or console (a console block's
commands are its lines starting with "$ "); a ```python block runs in this interpreter (the venv's python
when the suite runs there). Other fences (text, toml, sql, MyST directives such as ```{toctree}) are
shown, not run. A comment on the line before the fence says how to treat it:

    <!-- illustrative ... -->  shown, not run (e.g. `make demo`, which is what runs this test)
    <!-- exit N ... -->        must exit N (a shell block stops at its first failing command)
    <!-- needs: s3 ... -->     runs against a local S3 endpoint (moto); the buckets it names exist
    <!-- needs: MODULE -->     runs only where MODULE imports (an optional extra's), else is passed over
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.cli.clitools import env, make_buckets, start_s3

ROOT = Path(__file__).resolve().parents[2]
# Documents whose shell blocks depend on Python blocks run by their own runner.
OWN_RUNNER = {"docs/interop.md": "tests/export/test_interop_docs.py"}
FENCE = re.compile(
    r"(?:<!--\s*(?P<marker>[^\n]*?)\s*-->[ \t]*\n)?^```(?P<info>[^`\n]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S
)
TOCTREE = re.compile(r"^```\{toctree\}[^\n]*\n(?P<body>.*?)^```", re.M | re.S)
SHELL = ("", "sh", "bash", "console", "shell")
# Pages whose examples are the walk-through: each must keep runnable blocks.
WALKED = [
    f"docs/{page}.md"
    for page in (
        "samples",
        "convert",
        "catalog",
        "export",
        "split",
        "validate",
        "bench",
        "loader",
        "scale-out",
        "ci-gate",
    )
]


def toctree_order(index: Path) -> list[str]:
    """The page names of every toctree of ``index``, in order (option lines and blank lines skipped)."""
    names = []
    for m in TOCTREE.finditer(index.read_text()):
        names += [line.strip() for line in m.group("body").splitlines() if line.strip() and not line.startswith(":")]
    return names


def documents(root: Path = ROOT) -> list[Path]:
    """README.md, then docs/ in the order of its index's toctrees, then the pages no toctree lists."""
    docs = root / "docs"
    listed = [docs / f"{name}.md" for name in toctree_order(docs / "index.md")] if (docs / "index.md").exists() else []
    rest = sorted(set(docs.glob("*.md")) - set(listed))
    ordered = [root / "README.md", *[d for d in listed if d.exists()], *rest]
    return [d for d in dict.fromkeys(ordered) if d.relative_to(root).as_posix() not in OWN_RUNNER]


@dataclass
class Block:
    where: str  # file:line
    body: str
    mode: str  # run | illustrative
    exit: int = 0
    needs: tuple[str, ...] = ()
    lang: str = "sh"  # sh | python


def blocks(text: str, name: str) -> list[Block]:
    """The shell and Python blocks of a document, with what their markers say."""
    out = []
    for m in FENCE.finditer(text):
        lang = m.group("info").strip().split(" ")[0] if m.group("info").strip() else ""
        if lang not in SHELL and lang != "python":
            continue
        body = m.group("body")
        if lang == "console":
            body = "".join(line[2:] + "\n" for line in body.splitlines() if line.startswith("$ "))
        marker = (m.group("marker") or "").strip()
        line = text.count("\n", 0, m.start("body"))
        block = Block(
            f"{name}:{line}",
            body,
            "illustrative" if marker.startswith("illustrative") else "run",
            lang="python" if lang == "python" else "sh",
        )
        if em := re.match(r"exit\s+(\d+)", marker):
            block.exit = int(em.group(1))
        if nm := re.search(r"needs:\s*([\w, -]+)", marker):
            block.needs = tuple(x.strip() for x in nm.group(1).split(",") if x.strip())
        out.append(block)
    return out


def test_markers_are_understood():
    text = (
        "```\na\n```\n<!-- illustrative: slow -->\n```sh\nb\n```\n<!-- exit 2 -->\n```bash\nc\n```\n"
        "```python\nd\n```\n<!-- needs: s3 -->\n```console\n$ e\nout\n```\n<!-- exit 2; needs: mcap -->\n```\nf\n```\n"
        "```{include} x.md\n:heading-offset: 1\n```\n```toml\nf = 1\n```\n<!-- illustrative -->\n```python\ng\n```\n"
    )
    got = [(b.body, b.mode, b.exit, b.needs, b.lang) for b in blocks(text, "t")]
    assert got == [
        ("a\n", "run", 0, (), "sh"),
        ("b\n", "illustrative", 0, (), "sh"),
        ("c\n", "run", 2, (), "sh"),
        ("d\n", "run", 0, (), "python"),
        ("e\n", "run", 0, ("s3",), "sh"),
        ("f\n", "run", 2, ("mcap",), "sh"),
        ("g\n", "illustrative", 0, (), "python"),
    ]


def test_documents_run_in_the_order_the_site_reads(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# r\n")
    for name in ("a", "b", "c", "interop", "z"):
        (tmp_path / "docs" / f"{name}.md").write_text(f"# {name}\n")
    (tmp_path / "docs" / "index.md").write_text(
        "# i\n```{toctree}\n:caption: One\n:maxdepth: 2\n\nz\nmissing\n```\n\n```{toctree}\nb\n```\n"
    )
    got = [d.relative_to(tmp_path).as_posix() for d in documents(tmp_path)]
    assert got == ["README.md", "docs/z.md", "docs/b.md", "docs/a.md", "docs/c.md", "docs/index.md"]


def test_every_document_block_runs_as_written(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "sample_data").symlink_to(ROOT / "sample_data")
    run_env = env(DSBUILD_CACHE=tmp_path / "cache", HOME=tmp_path)
    server = None
    todo = {
        doc.relative_to(ROOT).as_posix(): blocks(doc.read_text(), doc.relative_to(ROOT).as_posix())
        for doc in documents()
    }
    runnable = [b for found in todo.values() for b in found if b.mode == "run"]
    readme = {b.lang for b in todo["README.md"] if b.mode == "run"}
    assert readme == {"sh", "python"}, "the README's tour lost its runnable shell or Python examples"
    for page in WALKED:
        assert any(b.mode == "run" for b in todo[page]), f"{page} lost its runnable examples"
    assert sum(b.lang == "sh" for b in runnable) >= 15, "the docs lost their runnable shell examples"
    try:
        for b in runnable:
            if any(m != "s3" and find_spec(m) is None for m in b.needs):
                continue  # an optional extra's block, where that extra is not installed
            if "s3" in b.needs:
                if find_spec("s3fs") is None:
                    continue  # the s3 extra is not installed
                pytest.importorskip("moto")
                if server is None:
                    server, s3_env = start_s3(tmp_path / "s3-cache")
                    run_env.update(s3_env)
                make_buckets(run_env, *sorted(set(re.findall(r"s3://([a-z0-9][a-z0-9.-]+)", b.body))))
            command = (
                [sys.executable, "-c", b.body] if b.lang == "python" else ["bash", "-e", "-o", "pipefail", "-c", b.body]
            )
            p = subprocess.run(command, cwd=work, env=run_env, capture_output=True, text=True)
            assert p.returncode == b.exit, (
                f"{b.where}: exit {p.returncode}, the document says {b.exit}\n{b.body}\n"
                f"--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-3000:]}"
            )
            assert "Traceback" not in p.stderr, f"{b.where}: traceback\n{p.stderr[-3000:]}"
    finally:
        if server is not None:
            server.stop()
    assert os.listdir(work)


def test_documents_never_point_outside_the_repository():
    """A user has the repository, nothing beside it: a link or path to ``../`` above the root is dead."""
    files = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "README.md" in files.stdout.split()
    for name in files.stdout.split():
        path = ROOT / name
        for target in re.findall(r"(?:\]\(|`)((?:\.\./)+[^)`\s]*)", path.read_text()):
            assert (path.parent / target).resolve().is_relative_to(ROOT), f"{name} points outside: {target}"
