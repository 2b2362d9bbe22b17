"""The README cannot drift: every shell block of README.md and docs/*.md runs as written, in order, in
one empty folder (with the repository's sample_data/), and exits as the document says. (docs/interop.md
mixes Python and shell recipes; its own runner is tests/export/test_interop_docs.py.)

A block is a fence without a language or with sh, bash or console (a console block's commands are its
lines starting with "$ "). A comment on the line before the fence says how to treat it:

    <!-- illustrative ... -->  shown, not run (e.g. `make demo`, which is what runs this test)
    <!-- exit N ... -->        must exit N (a block stops at its first failing command)
    <!-- needs: s3 ... -->     runs against a local S3 endpoint (moto); the buckets it names exist
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.clitools import env, make_buckets, start_s3

ROOT = Path(__file__).resolve().parents[2]
# Documents whose shell blocks depend on Python blocks run by their own runner.
OWN_RUNNER = {"docs/interop.md": "tests/export/test_interop_docs.py"}
DOCUMENTS = [
    d
    for d in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    if d.relative_to(ROOT).as_posix() not in OWN_RUNNER
]
FENCE = re.compile(
    r"(?:<!--\s*(?P<marker>[^\n]*?)\s*-->[ \t]*\n)?^```(?P<lang>[A-Za-z0-9_-]*)[ \t]*\n(?P<body>.*?)^```", re.M | re.S
)
SHELL = ("", "sh", "bash", "console", "shell")


@dataclass
class Block:
    where: str  # file:line
    body: str
    mode: str  # run | illustrative
    exit: int = 0
    needs: tuple[str, ...] = ()


def blocks(text: str, name: str) -> list[Block]:
    """The shell blocks of a document, with what their markers say."""
    out = []
    for m in FENCE.finditer(text):
        if m.group("lang") not in SHELL:
            continue
        body = m.group("body")
        if m.group("lang") == "console":
            body = "".join(line[2:] + "\n" for line in body.splitlines() if line.startswith("$ "))
        marker = (m.group("marker") or "").strip()
        line = text.count("\n", 0, m.start("body"))
        block = Block(f"{name}:{line}", body, "illustrative" if marker.startswith("illustrative") else "run")
        if em := re.match(r"exit\s+(\d+)", marker):
            block.exit = int(em.group(1))
        if nm := re.match(r"needs:\s*([\w, -]+)", marker):
            block.needs = tuple(x.strip() for x in nm.group(1).split(",") if x.strip())
        out.append(block)
    return out


def test_markers_are_understood():
    text = (
        "```\na\n```\n<!-- illustrative: slow -->\n```sh\nb\n```\n<!-- exit 2 -->\n```bash\nc\n```\n"
        "```python\nd\n```\n<!-- needs: s3 -->\n```console\n$ e\nout\n```\n"
    )
    got = [(b.body, b.mode, b.exit, b.needs) for b in blocks(text, "t")]
    assert got == [
        ("a\n", "run", 0, ()),
        ("b\n", "illustrative", 0, ()),
        ("c\n", "run", 2, ()),
        ("e\n", "run", 0, ("s3",)),
    ]


def test_every_document_block_runs_as_written(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "sample_data").symlink_to(ROOT / "sample_data")
    run_env = env(DSBUILD_CACHE=tmp_path / "cache", HOME=tmp_path)
    server = None
    todo = [b for doc in DOCUMENTS for b in blocks(doc.read_text(), doc.relative_to(ROOT).as_posix())]
    assert sum(b.mode == "run" for b in todo) >= 8, "the README lost its runnable examples"
    try:
        for b in todo:
            if b.mode == "illustrative":
                continue
            if "s3" in b.needs:
                pytest.importorskip("moto")
                if server is None:
                    server, s3_env = start_s3(tmp_path / "s3-cache")
                    run_env.update(s3_env)
                make_buckets(run_env, *sorted(set(re.findall(r"s3://([a-z0-9][a-z0-9.-]+)", b.body))))
            p = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", b.body], cwd=work, env=run_env, capture_output=True, text=True
            )
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
