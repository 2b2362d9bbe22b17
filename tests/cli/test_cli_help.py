"""-h, --help and --version everywhere; help pages with an example and no type noise; completion; a
fast start (no heavy imports for --help)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from dsbuild import __version__
from dsbuild.cli.app import COMMANDS
from tests.cli.clitools import argv, env, run


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example_and_no_type_noise(command):
    short, long = run(command, "-h"), run(command, "--help")
    assert short.stdout == long.stdout
    text = long.stdout
    assert (
        f"Usage: dsbuild {command}" in text
        and "Examples:" in text
        and f"dsbuild {command}" in text.split("Examples:")[1]
    )
    assert not re.search(r"<(str|int|float|bool|path|list\[.*?\])>", text), text
    assert "{" not in text.split("\n")[0], text  # usage line: NAME, not {name}
    assert "--json" in text and "--quiet" in text


def test_the_import_group_and_each_of_its_commands_have_help_with_an_example():
    group = run("import", "--help").stdout
    assert group == run("import", "-h").stdout and "Usage: dsbuild import" in group
    listed = group.split("Commands:")[1].split("Examples:")[0]
    commands = re.findall(r"^\s{2}(\w+)\s", listed, re.M)
    assert {"video", "mcap"} <= set(commands), group
    for command in commands:
        assert f"dsbuild import {command}" in group.split("Examples:")[1], command
        text = run("import", command, "--help").stdout
        assert text == run("import", command, "-h").stdout
        assert f"Usage: dsbuild import {command}" in text and f"dsbuild import {command}" in text.split("Examples:")[1]
        assert not re.search(r"<(str|int|float|bool|path|list\[.*?\])>", text), text
        assert "--json" in text and "--quiet" in text and "--strict" in text
    assert re.search(r"^\s+import\s", run("-h").stdout, re.M)


@pytest.mark.parametrize("args", [["--version"], ["log", "--version"], ["convert", "a", "b", "--version"]])
def test_version_works_everywhere(args):
    assert run(*args).stdout.strip() == f"dsbuild {__version__}"


def test_bare_dsbuild_prints_the_help_and_exits_2_without_a_traceback():
    p = run(check=2)
    assert "Usage: dsbuild" in p.stderr and "Commands:" in p.stderr and "Traceback" not in p.stderr


def test_root_help_lists_commands_and_the_exit_codes():
    text = run("-h").stdout
    for command in COMMANDS:
        assert re.search(rf"^\s+{command}\s", text, re.M), command
    assert "130 interrupted" in text and "--install-completion" in text


def test_shell_completion_answers_for_commands_and_options():
    p = subprocess.run(
        argv(),
        capture_output=True,
        text=True,
        env=env(_DSBUILD_COMPLETE="complete_bash", COMP_WORDS="dsbuild conv", COMP_CWORD="1"),
    )
    assert p.returncode == 0 and "convert" in p.stdout, p
    p = subprocess.run(
        argv(),
        capture_output=True,
        text=True,
        env=env(_DSBUILD_COMPLETE="complete_bash", COMP_WORDS="dsbuild convert --dry", COMP_CWORD="2"),
    )
    assert "--dry-run" in p.stdout, p
    # --show-completion is a flag: the shell is detected from the parent processes, so run it from bash
    # (a test runner started without a shell above it would otherwise get "Shell not supported")
    script = " ".join(argv("--show-completion")) + "; exit $?"  # not exec-ed: bash stays the parent
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env())
    assert p.returncode == 0 and "_DSBUILD_COMPLETE" in p.stdout, (p.stdout, p.stderr)


def test_starting_the_cli_imports_no_heavy_library():
    code = (
        "import sys, dsbuild.cli.app\n"
        "heavy = {'av', 'duckdb', 'pyarrow', 'torch', 'numpy', 'ray', 'fsspec', 'zstandard'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), check=True).stdout
    assert out.strip() == "[]"
