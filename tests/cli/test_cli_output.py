"""Output fits where it goes: tables on a terminal, whole ids and tab-separated lines when piped, --json
on every command, --quiet, progress that suits the place, and capture text that is never markup."""

from __future__ import annotations

import json
import re

import pytest

from tests.cli.clitools import run, run_tty

HEX64 = re.compile(r"\b[0-9a-f]{64}\b")


def test_piped_log_has_whole_ids_and_tab_separated_rows(catalog):
    cat, vid = catalog
    lines = run("log", cat).stdout.splitlines()
    assert lines[0].split("\t")[:3] == ["version", "tags", "created"]
    row = lines[1].split("\t")
    assert row[0] == vid and row[1] == "gold" and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", row[2])
    assert run("log", cat, "--quiet").stdout.split() == [vid]


def test_a_piped_table_without_rows_is_its_header_line(catalog):
    """An empty result printed nothing at all, not even the header a script checks for."""
    cat, _ = catalog
    assert run("query", cat, "select key, title from samples where false").stdout == "key\ttitle\n"


def test_terminal_log_shortens_ids_unless_no_trunc(catalog):
    cat, vid = catalog
    rc, text = run_tty("log", cat)
    assert rc == 0 and vid[:12] in text and vid not in text and "\t" not in text
    rc, text = run_tty("log", cat, "--no-trunc")
    assert rc == 0 and vid in text
    rc, text = run_tty("log", cat, "--no-trunc", columns=80)  # (ids were cropped to fit, other columns dropped)
    assert rc == 0 and vid in "".join(text.split()) and "webdataset" in text


def _imports(p) -> set[str]:
    """Top-level packages a command imported (from ``PYTHONPROFILEIMPORTTIME``'s lines on stderr)."""
    return {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in p.stderr.splitlines()
        if line.startswith("import time:")
    }


def test_rich_is_loaded_only_to_draw_on_a_terminal(catalog):
    """A pipe, --json and --quiet get plain text without importing rich (a sixth of a short command's start-up);
    the same command on a terminal draws with it."""
    cat, vid = catalog
    profiled = {"PYTHONPROFILEIMPORTTIME": "1"}
    assert "typer" in _imports(run("log", cat, extra_env=profiled))  # the profile works
    for args in (["log", cat], ["verify", cat, "--json"], ["log", cat, "--quiet"], ["info", cat, "--json"]):
        assert "rich" not in _imports(run(*args, extra_env=profiled)), args
    assert vid[:12] in run_tty("log", cat)[1]


JSON_COMMANDS = [
    ["info", "{cat}"],
    ["log", "{cat}"],
    ["shards", "{cat}"],
    ["diff", "{cat}@gold", "{cat}"],
    ["verify", "{cat}"],
    ["query", "{cat}", "select count(*) as n from samples"],
    ["gc", "{cat}", "--dry-run"],
    ["split", "{cat}", "--name", "main", "--check"],
    ["convert", "{caps}", "{cat}", "--dry-run", "--clip-seconds", "2"],
    ["lineage", "{cat}", "{key}"],
    ["tag", "{cat}@gold", "gold"],
    ["samples", "{tmp}/s", "--sessions", "1", "--seconds", "1"],
    ["validate", "{cat}"],
    ["push", "{cat}@gold", "{tmp}/pushed"],
    ["pull", "{cat}@gold", "{tmp}/pulled"],
    ["bench", "{cat}", "--duration", "1", "--rounds", "1", "--compare", "none", "--step-ms", "0"],
]


@pytest.fixture(scope="module")
def a_key(catalog) -> str:
    return run("query", catalog[0], "select min(key) from samples", "--quiet").stdout.strip()


@pytest.mark.parametrize("args", JSON_COMMANDS, ids=lambda a: a[0])
def test_every_command_prints_one_json_document_and_nothing_else(args, catalog, caps, a_key, tmp_path):
    cat, _vid = catalog
    key = a_key
    args = [a.format(cat=cat, caps=caps, key=key, tmp=tmp_path) for a in args]
    p = run(*args, "--json")
    json.loads(p.stdout)
    if args[0] == "validate":  # the gate's verdict still reaches a log whose stdout goes to a file
        assert p.stderr.startswith("ACCEPTED ") and p.stderr.count("\n") == 1, p.stderr
    else:
        assert p.stderr == "", p.stderr  # no progress, no notes


def test_convert_progress_is_plain_lines_when_piped_and_silent_with_quiet(caps, tmp_path):
    # one piped build of many shards shows both: plain lines, and each stage once at its end
    p = run("convert", caps, tmp_path / "c", "--clip-seconds", 1, "--shard-size", "64KiB", "--workers", 1)
    progress = [line for line in p.stderr.splitlines() if line.startswith("convert ")]
    assert any(re.match(r"convert sessions: 3/3, \d+ clips, [\d.]+ MB/s", line) for line in progress), p.stderr
    assert any(line.startswith("convert shards: ") for line in progress), p.stderr
    assert HEX64.search(p.stdout) and "\x1b[" not in p.stdout + p.stderr
    shards = json.loads(run("info", tmp_path / "c", "--json").stdout)["stats"]["shards"]
    assert shards >= 10 and len(progress) <= 6, progress  # (a finished stage was printed again at every shard)
    q = run("convert", caps, tmp_path / "b", "--clip-seconds", 2, "--quiet")
    assert q.stderr == "" and HEX64.fullmatch(q.stdout.strip())
    v = run("verify", tmp_path / "b")
    assert re.search(r"^verify shards: (\d+)/\1$", v.stderr, re.M) and run("verify", tmp_path / "b", "-q").stderr == ""


def test_validate_progress_has_hashing_and_reading_each_to_its_end_piped_and_on_a_terminal(catalog):
    """The two stages run at once: each keeps its own line (piped) or bar (terminal)."""
    cat, _ = catalog
    p = run("validate", cat)
    for stage in ("shards", "samples"):
        assert re.search(rf"^validate {stage}: (\d+)/\1$", p.stderr, re.M), p.stderr
    rc, text = run_tty("validate", cat)
    assert rc == 0 and "validate shards" in text and "validate samples" in text, text


def test_convert_shows_a_live_bar_on_a_terminal(caps, tmp_path):
    rc, text = run_tty("convert", caps, tmp_path / "c", "--clip-seconds", 2, "--workers", 1)
    assert rc == 0 and "convert sessions" in text and "committed" in text, text


# (U+202E, a bidi override, reorders what a terminal shows after it)
HOSTILE = {"title": "[bold red]x", "player": "[/]", "platform": "[link=file:///etc]z\u202er", "build": "\x1b[31mred"}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Captures whose text looks like rich markup (and an ANSI escape), plus a quarantined folder with a
    markup-like name; converted and split."""
    root = tmp_path_factory.mktemp("hostile")
    caps = root / "caps"
    run("samples", caps, "--sessions", 2, "--seconds", 3, "--seed", 5, "--quiet")
    for i, d in enumerate(sorted(p for p in caps.iterdir())):
        doc = json.loads((d / "session.json").read_text())
        doc.update(HOSTILE if i == 0 else {"title": "[/]", "player": "[bold]p"})
        (d / "session.json").write_text(json.dumps(doc))
    bad = caps / "[bold red]broken"
    bad.mkdir()
    (bad / "session.json").write_text("{not json [/]")
    cat = root / "cat"
    run("convert", caps, cat, "--clip-seconds", 2, "--quiet")
    run("split", cat, "--name", "t", "--by", "title", "--ratios", "train=0.5,test=0.5", "--quiet")
    return caps, cat


@pytest.mark.parametrize("tty", [False, True], ids=["piped", "terminal"])
def test_capture_text_is_printed_as_data_never_markup(hostile, tty, tmp_path):
    caps, cat = hostile
    key = run("query", cat, "select key from samples where title = '[bold red]x' limit 1", "--quiet").stdout.strip()

    def show(*args) -> str:
        if tty:
            rc, text = run_tty(*args)
        else:
            p = run(*args, check=None)
            rc, text = p.returncode, p.stdout + p.stderr
        assert rc == 0 and "Traceback" not in text and "MarkupError" not in text, text
        assert "\x1b[31mred" not in text  # a raw escape from a capture never reaches the terminal
        assert "\u202e" not in text
        return text

    out = show("convert", caps, tmp_path / "again", "--clip-seconds", 2)
    assert "[bold red]broken" in out and "quarantined" in out
    out = show("info", cat)
    assert "[bold red]x" in out and "[/]" in out and "[bold red]broken" in out
    out = show("query", cat, "select title, player, platform, build from samples order by title")
    assert all(v in out for v in ("[bold red]x", "[/]", "[link=file:///etc]z", "[bold]p", "\\x1b[31mred"))
    assert "z\\u202er" in out  # escaped like the other controls
    if tty:  # CSV on a terminal is escaped like every report; to a file it is the exact data
        assert "\\x1b[31mred" in show("query", cat, "select build from samples where build like '%red'", "--csv")
    else:
        csv = run("query", cat, "select build from samples where build like '%red' limit 1", "--csv").stdout
        assert csv == "build\n\x1b[31mred\n"
    out = show("lineage", cat, key)
    assert "[bold red]x" in out and "[/]" in out and "[link=file:///etc]z" in out
    out = show("split", cat, "--name", "t", "--by", "title", "--ratios", "train=0.5,test=0.5")
    assert "split set t" in out
    out = show("diff", f"{cat}", f"{cat}")
    assert "samples of [bold red]x" in out and "samples of [/]" in out


def test_piped_progress_ends_with_the_latest_states_only_never_a_superseded_stage(capsys, monkeypatch):
    """Piped, a stage's latest line waits for the 2-s throttle and is printed at the end: every stage's,
    ever, so a piped bench ended with 25 lines of earlier rounds, out of order."""
    import dsbuild.cli.render as render

    clock = iter([10.0, 10.5, 13.0, 13.5])
    monkeypatch.setattr(render.time, "monotonic", lambda: next(clock))
    with render.Progress("bench", render.Out(False, False)) as progress:
        for stage, done in (("round 1/2", 1), ("round 1/2", 2), ("round 2/2", 1), ("round 2/2", 2)):
            progress.update(done, 5, stage=stage)  # printed at 10 and 13 s; the others wait
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["bench round 1/2: 1/5", "bench round 2/2: 1/5", "bench round 2/2: 2/5"], lines
