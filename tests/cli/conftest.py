"""Fixtures of the CLI tests: captures and a catalog made through the real executable (session-scoped)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.cli.clitools import run


@pytest.fixture(scope="session")
def caps(tmp_path_factory) -> Path:
    """Three clean synthetic sessions of 4 s, written by `dsbuild samples`."""
    root = tmp_path_factory.mktemp("cli-caps") / "caps"
    run("samples", root, "--sessions", 3, "--seconds", 4, "--seed", 3, "--quiet")
    return root


@pytest.fixture(scope="session")
def catalog(caps, tmp_path_factory) -> tuple[Path, str]:
    """(catalog, version id) converted by `dsbuild convert`, tagged gold, with split set main."""
    cat = tmp_path_factory.mktemp("cli-cat") / "catalog"
    vid = run("convert", caps, cat, "--clip-seconds", 2, "--workers", 1, "--quiet").stdout.strip()
    run("tag", cat, "gold", "--quiet")
    run("split", cat, "--name", "main", "--by", "session_id", "--quiet")
    return cat, vid


@pytest.fixture
def private_catalog(catalog, tmp_path) -> tuple[Path, str]:
    """A writable copy of the catalog, for tests that damage or change it."""
    cat, vid = catalog
    dst = tmp_path / "catalog"
    shutil.copytree(cat, dst)
    return dst, vid
