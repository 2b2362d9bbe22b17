"""Sphinx configuration: the docs site, written in Markdown (MyST-Parser) with the Furo theme.

Build it with ``sphinx-build -W --keep-going -b html docs docs/_build/html`` (warnings are errors; the test
``tests/cli/test_docs_build.py`` runs the same build). The API pages are generated from docstrings by
autodoc; optional extras that are not installed (torch, ray, jax) are mocked, so the site builds with the
core install alone.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # autodoc imports the checkout's dsbuild, installed or not

project = "dsbuild"
author = "the dsbuild authors"
copyright = "the dsbuild authors"

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "schemas"]

# MyST: ```{directive} fences (toctree, include, eval-rst), :::{note} fences too, and anchors on headings
# down to ### so that pages can link to a section (page.md#section-title).
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

# Fences without a language are shell commands (the test runs them as such). A block Pygments cannot lex
# is shown unhighlighted: that is cosmetic, not a reason to fail the build.
highlight_language = "bash"
suppress_warnings = ["misc.highlighting_failure"]

autodoc_mock_imports = ["torch", "ray", "jax", "jaxlib"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"

html_theme = "furo"
html_title = "dsbuild"


# dsbuild's docstrings are plain text with ``literals``: an example indented under a paragraph is code,
# and a table is drawn with pipes. reStructuredText would read the first as a quotation and the second
# as line blocks (with errors): both are shown as written, as literal blocks.
LIST_ITEM = re.compile(r"([-*+]|\d+[.)]|:[^:]+:)\s")


def _literal_blocks(app, what, name, obj, options, lines: list[str]) -> None:
    out: list[str] = []
    last = ""  # the last non-blank line seen
    i = 0
    while i < len(lines):
        line = lines[i]
        after_paragraph = bool(out) and not out[-1].strip() and last and not last.startswith(" ")
        plain = after_paragraph and not last.endswith("::") and not LIST_ITEM.match(last)
        if plain and (line.startswith("    ") or line.startswith("|")):
            table = line.startswith("|")
            out += [".. code-block:: text" if table else ".. code-block:: default", ""]
            while i < len(lines) and (
                lines[i].startswith("|") if table else (lines[i].startswith("    ") or not lines[i].strip())
            ):
                out.append("    " + lines[i] if table else lines[i])
                i += 1
            while out and not out[-1].strip():  # the block's trailing blank lines go after it
                out.pop()
            out.append("")
            last = "(a literal block)"
            continue
        if line.strip():
            last = line
        out.append(line)
        i += 1
    lines[:] = out


def _option_reasons(app, what, name, obj, options, lines: list[str]) -> None:
    """A dataclass whose fields are made with ``option(default, doc)`` (``LoaderOptions``) lists them, each
    with its default and its reason."""
    if what != "class" or not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        return
    fields = [f for f in dataclasses.fields(obj) if {"doc", "order"} <= f.metadata.keys()]
    if not fields:
        return
    if lines and lines[0].startswith(f"{obj.__name__}("):  # the signature dataclasses write as __doc__
        del lines[: lines.index("") if "" in lines else len(lines)]
    lines += [
        "",
        "Every option, with its default and the reason for it (*order*: the option defines the order of",
        "batches, and a checkpoint refuses to restore under another value):",
        "",
    ]
    for f in fields:
        order = " (*order*)" if f.metadata.get("order") else ""
        lines += [f"``{f.name}`` = ``{f.default!r}``{order}", f"    {f.metadata['doc']}"]
    lines.append("")


def setup(app):
    app.connect("autodoc-process-docstring", _literal_blocks)
    app.connect("autodoc-process-docstring", _option_reasons)
