"""The exit-code table holds for every kind of failure, parser errors included: one line (plus a hint),
no traceback, the right code; under --json one JSON object on stderr."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from importlib.util import find_spec

import pytest

from tests.cli.clitools import argv, env, run


def one_line_error(p, code: int, *needles: str) -> str:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert "Traceback" not in p.stderr and len(errors) == 1, p.stderr
    after = lines[errors[0] + 1 :]  # only progress lines may come before the error
    assert after == [] or (len(after) == 1 and after[0].startswith("hint: ")), p.stderr
    for n in needles:
        assert n in p.stderr, (n, p.stderr)
    return p.stderr


@pytest.mark.parametrize(
    "args, needles",
    [
        (["convert", "caps", "cat", "--jsn"], ["--jsn", "did you mean --json"]),
        (["conver"], ["'conver'", "Did you mean 'convert'"]),
        (["validate"], ["missing argument", "REF"]),
        (["validate", "cat", "--levl", "full"], ["--levl", "--level"]),
        (["log", "cat", "--no-trunk"], ["--no-trunc"]),
        (["convert", "caps", "cat", "--workers", "-1"], ["--workers"]),
        (["convert", "caps", "cat", "--workers", "two"], ["--workers"]),
        (["convert", "caps", "cat", "--shard-size", "1e9"], ["--shard-size", "1e9"]),
        (["convert", "caps", "cat", "--executor", "rey"], ["--executor", "did you mean 'ray'"]),
        (["validate", "cat", "--level", "ful"], ["--level", "did you mean 'full'"]),
        (["verify", "cat", "--threads", "0"], ["--threads"]),
        (["verify", "cat", "--sample", "0"], ["--sample", "x>=1"]),  # was "0 shards checked: OK"
        (["samples", "out", "--damage", "9=bad_json"], ["--damage", "out of range", "0..2"]),
        (["samples", "out", "--damage", "truncated_vidoe"], ["did you mean 'truncated_video'"]),
        (["samples", "out", "--damage", "0=duplicate_id"], ["needs a session before it"]),  # was after writing one
        (["samples", "out", "--source", "atrai"], ["--source", "did you mean 'atari'"]),
        (["samples", "pins.txt"], ["pins.txt: is a file"]),  # was exit 3, 'Not a directory'
        (["split", "cat", "--name", "x", "--pin", "tset=pins.txt"], ["--pin", "did you mean 'test'"]),
        (["split", "cat", "--name", "x", "--pin", "holdout=pins.txt", "--ratios", "train=0.9,val=0.1"], ["holdout"]),
        (["shards", "cat", "--split", "main"], ["NAME/SPLIT"]),
        (["split", "cat", "--name", "x", "--ratios", "1=0.5,_v=0.5"], ["'1' is not allowed", "a letter, then"]),
        (["validate", "cat", "--split-set", ""], ["split set name is empty"]),  # an unset $SPLIT: no silent pass
        (["query", "cat", " ; "], ["the query is empty"]),
        (["query", "cat", "select * from sampels"], ["sampels does not exist", "did you mean 'samples'"]),
        (["validate", "cat", "--save", "nodir/v.json"], ["--save", "folder nodir does not exist"]),  # before any work
        (["validate", "cat", "--html", "."], ["--html", "is a folder"]),
        # a FIFO or a device was replaced by a regular file (as root: /dev/full itself); two reports in one file
        (["validate", "cat", "--save", "fifo"], ["--save fifo", "not a regular file"]),
        (["validate", "cat", "--junit", "fifo-link"], ["--junit fifo-link", "not a regular file"]),  # (never a real
        # device here: a regression would replace it, and these tests may run as root)
        (["validate", "cat", "--junit", "r.xml", "--html", "./r.xml"], ["--html ./r.xml", "also the file of --junit"]),
        (["bench", "cat", "--save", "nodir/b.json"], ["--save", "folder nodir does not exist"]),  # was after the run
        # (an unknown URL scheme is named by fsspec, the s3 extra; without it: exit 3 naming the extra)
        *([(["log", "foo://bar/cat"], ["no file system is known for 'foo'://"])] if find_spec("fsspec") else []),
        # each of these was exit 70, "internal error"
        (["convert", "caps", "cat", "--shard-size", "100000i"], ["--shard-size", "not a size"]),
        (["convert", "caps", "cat", "--shard-size", "9" * 400 + "MB"], ["--shard-size"]),
        (["samples", "out", "--seed", "-1"], ["--seed", "0<=x<=9007199254740991"]),
        (["verify", "cat", "--seed", "-1"], ["--seed", "0<=x"]),  # (was accepted)
        (["bench", "cat", "--seed", "9" * 23], ["--seed"]),  # (was saved in a baseline that --baseline refused)
        (["bench", "cat", "--fail-below", "2"], ["--fail-below needs --baseline"]),  # these were ignored silently
        (["bench", "cat", "--allow-different"], ["--allow-different needs --baseline"]),
        (["bench", "cat", "--compare", ","], ["--compare ','"]),
        (["query", "cat", "/* only a comment */"], ["the query has no statement"]),
    ],
)
def test_usage_errors_are_one_line_exit_2(args, needles, tmp_path, catalog):
    cat, _ = catalog
    args = [str(cat) if a == "cat" else a for a in args]
    (tmp_path / "pins.txt").write_text("p-0000\n")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "fifo-link").symlink_to(tmp_path / "fifo")
    one_line_error(run(*args, cwd=tmp_path, check=None), 2, *needles)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing written


def test_a_version_where_a_whole_catalog_is_expected_is_refused(catalog, caps):
    """`convert caps catalog@gold` made a new catalog in a folder named so; log and gc said "not a
    catalog"."""
    cat, _ = catalog
    for args in (["log", f"{cat}@gold"], ["gc", f"{cat}@gold"], ["convert", caps, f"{cat}@gold", "--clip-seconds", 2]):
        one_line_error(
            run(*args, check=None),
            2,
            "names a version ('gold') of a catalog where a catalog is expected",
            f"give the catalog: {cat}",
        )
    assert not os.path.exists(f"{cat}@gold")


def test_a_reference_with_two_versions_says_so(catalog):
    """`info catalog@gold@x` said "takes a catalog, not a version of one" of a command that takes a version."""
    cat, _ = catalog
    for args in (["info"], ["validate"], ["split", "--name", "s"]):
        one_line_error(run(*args, f"{cat}@gold@x", check=None), 2, "a second '@' in CATALOG@VERSION", f"{cat}@VERSION")


def test_library_suggestions_reach_the_user(catalog):
    cat, _ = catalog
    one_line_error(run("info", f"{cat}@glod", check=None), 2, "did you mean 'gold'", "hint: ")
    one_line_error(run("shards", cat, "--split", "mian/train", check=None), 2, "did you mean 'main'")
    one_line_error(run("tag", cat, "nope", "--delete", check=None), 2, "no tag 'nope'")


def test_missing_catalog_and_captures_are_input_errors(tmp_path):
    one_line_error(run("log", tmp_path / "nowhere", check=None), 2, "not a dsbuild catalog")
    one_line_error(run("convert", tmp_path / "nowhere", tmp_path / "cat", check=None), 2, "does not exist")


def test_json_errors_are_one_object_on_stderr(catalog):
    cat, _ = catalog
    for args, code in ((["info", f"{cat}@nope"], 2), (["log", cat, "--bogus"], 2), (["conver"], 2)):
        p = run(*args, "--json", check=None)
        assert p.returncode == code and p.stdout == ""
        doc = json.loads(p.stderr)
        assert set(doc) == {"error", "exit_code", "hint"} and doc["exit_code"] == code, doc


def test_damage_found_is_exit_1_with_the_healing_command(private_catalog):
    cat, _vid = private_catalog
    shard = next((cat / "shards").rglob("*.tar"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    p = run("verify", cat, check=None)
    one_line_error(p, 1, "problem", "hint: heal with: dsbuild convert", "--rehash")
    assert "altered" in p.stdout and shard.name in p.stdout
    p = run("verify", cat, "--json", check=None)
    assert p.returncode == 1 and json.loads(p.stdout)["ok"] is False and json.loads(p.stderr)["exit_code"] == 1


def test_a_damaged_catalog_is_a_storage_error_exit_3(private_catalog):
    cat, vid = private_catalog
    manifest = cat / "versions" / vid / "manifest.json"
    manifest.write_bytes(manifest.read_bytes().replace(b'"webdataset"', b'"webdatasez"'))
    one_line_error(run("info", cat, check=None), 3, "manifest", "hint: ")


@pytest.mark.parametrize("name", ["tags.json", "commit.json"])
def test_a_catalog_file_over_its_limit_is_damage_exit_3_named_with_a_hint(private_catalog, name):
    """(It was exit 2, a usage error, without a hint; the same file malformed was exit 3.)"""
    cat, vid = private_catalog
    path = cat / name if name == "tags.json" else cat / "versions" / vid / name
    path.write_bytes(b" " * (17 << 20))
    one_line_error(
        run("log", cat, check=None), 3, f"{path}: damaged catalog file", "larger than the limit", "hint: restore it"
    )


def test_a_version_of_an_earlier_manifest_format_names_it_and_what_to_do(private_catalog):
    import hashlib

    cat, vid = private_catalog
    doc = json.loads((cat / "versions" / vid / "manifest.json").read_bytes())
    doc["format"] = "dsbuild.manifest/2"
    data = json.dumps(doc).encode()
    old = hashlib.sha256(data).hexdigest()
    (cat / "versions" / old).mkdir()
    (cat / "versions" / old / "manifest.json").write_bytes(data)
    p = run("info", f"{cat}@{old}", check=None)
    one_line_error(
        p,
        3,
        "format is 'dsbuild.manifest/2', expected 'dsbuild.manifest/3'",
        "hint: a version written by another dsbuild",
    )


def test_a_version_from_before_blake3_was_recorded_loads_verifies_and_is_not_built_onto(private_catalog, caps):
    """As a user meets one: it still verifies and loads; `convert --onto` it is a usage error naming the
    index columns; a plain convert builds afresh and gives the fresh build's version id."""
    from tests.helpers import as_older_version

    cat, vid = private_catalog
    old = as_older_version(cat, vid, remove=True)
    assert run("verify", f"{cat}@{old}", "--quiet", check=0).returncode == 0
    p = run("convert", caps, cat, "--clip-seconds", 2, "--workers", 1, "--onto", old, check=None)
    one_line_error(p, 2, "built with other settings (index columns or shard hashes)", "hint: convert without --onto")
    assert run("convert", caps, cat, "--clip-seconds", 2, "--workers", 1, "--quiet").stdout.strip() == vid


def test_an_os_error_is_exit_3_with_the_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    one_line_error(run("samples", blocker / "caps", "--sessions", 1, "--seconds", 1, check=None), 3, str(blocker))


def test_samples_refuses_a_folder_that_holds_captures_and_leaves_them_as_they_were(tmp_path):
    """samples once wrote into it, replacing the session folders of the same name, and exited 0."""
    caps = tmp_path / "caps"
    run("samples", caps, "--sessions", 1, "--seconds", 1, "--seed", 1, "--quiet")
    before = {p: p.read_bytes() for p in caps.rglob("*") if p.is_file()}
    p = run("samples", caps, "--sessions", 2, "--seconds", 1, "--seed", 2, check=None)
    one_line_error(p, 2, f"{caps}: the folder is not empty", "hint: choose a new folder or remove it")
    assert {p: p.read_bytes() for p in caps.rglob("*") if p.is_file()} == before


def test_an_unexpected_exception_is_internal_error_70_never_1():
    script = (
        "import dsbuild.cli.app as a\n@a.app.command('boom')\ndef boom(): raise ValueError('bad [bold]x')\na.main()\n"
    )
    p = subprocess.run([sys.executable, "-c", script, "boom"], capture_output=True, text=True, env=env())
    assert p.returncode == 70 and "Traceback" not in p.stderr
    assert p.stderr.strip() == "error: internal error: ValueError: bad [bold]x (run with --debug for the traceback)"
    p = subprocess.run([sys.executable, "-c", script, "boom", "--debug"], capture_output=True, text=True, env=env())
    assert p.returncode == 70 and "Traceback" in p.stderr and p.stderr.count("ValueError: bad [bold]x") == 2


def test_an_interrupt_after_the_commit_says_the_version_was_committed(caps, tmp_path):
    """Ctrl-C landing just after convert's publishing rename said "nothing was committed" while `log`
    listed the new version."""
    script = (
        "import os, signal\n"
        "import dsbuild.lineage.catalog as c\n"
        "real = c.fsync_dir\n"
        "def fsync_dir(p):\n"
        "    real(p)\n"
        "    if str(p).endswith('/versions'):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "c.fsync_dir = fsync_dir\n"
        "import dsbuild.cli.app as a\n"
        "a.main()\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", script, "convert", str(caps), str(tmp_path / "c")],
        capture_output=True,
        text=True,
        env=env(),
        # Ctrl-C at its default, as a terminal gives it: a suite started in the background (`cmd &`) passes
        # SIGINT ignored, and dsbuild keeps an ignored signal ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    [vid] = run("log", tmp_path / "c", "--quiet").stdout.split()
    assert p.returncode == 130 and f"interrupted after version {vid[:12]} was committed" in p.stderr, p.stderr


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_output_to_a_full_disk_is_one_error_exit_3(catalog, as_json):
    """`> /dev/full` ended in a Python traceback from the final flush and exit 120."""
    cat, _ = catalog
    with open("/dev/full", "w") as full:
        p = subprocess.run(
            argv("log", cat, *(["--json"] if as_json else [])),
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
        )
    assert p.returncode == 3 and "Traceback" not in p.stderr and "No space left on device" in p.stderr
    assert len(p.stderr.strip().splitlines()) <= 2, p.stderr


def test_a_closed_stdout_drops_the_output_and_a_closed_stderr_never_stops_the_work(catalog, caps, tmp_path):
    """`>&-` was exit 70 ('NoneType' object has no attribute 'isatty'); a progress line written to a reader
    that had gone away (`2> >(head -c 1)`) aborted a convert with 141 and committed nothing."""
    cat, _ = catalog
    p = subprocess.run(
        argv("log", cat),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        pass_fds=(),
        preexec_fn=lambda: os.close(1),
    )
    assert p.returncode == 0 and p.stderr == ""
    reader = subprocess.Popen(["head", "-c", "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    p = subprocess.run(
        argv("convert", caps, tmp_path / "c"), stdout=subprocess.PIPE, stderr=reader.stdin, env=env(), text=True
    )
    reader.stdin.close()
    reader.wait()
    assert p.returncode == 0
    assert run("log", tmp_path / "c", "--quiet").stdout.strip() in p.stdout.split()  # committed


def test_a_report_path_that_links_to_a_file_is_written_through(catalog, tmp_path):
    cat, _ = catalog
    (tmp_path / "reports").mkdir()
    (tmp_path / "latest.json").symlink_to(tmp_path / "reports" / "v.json")
    run("validate", cat, "--save", tmp_path / "latest.json", "--quiet", check=None)
    assert (tmp_path / "latest.json").is_symlink() and json.loads((tmp_path / "reports" / "v.json").read_text())


def test_a_json_row_never_drops_one_of_two_columns_of_one_name(catalog):
    cat, _ = catalog
    sql = "select s.key, s.bytes, sh.bytes from samples s join shards sh on s.shard = sh.path"
    p = run("query", cat, sql, "--json", check=None)
    error = json.loads(p.stderr)
    assert p.returncode == 2 and "(bytes)" in error["error"] and "AS" in error["hint"]
    assert run("query", cat, sql + " limit 1").stdout.splitlines()[0].split("\t") == ["key", "bytes", "bytes"]


@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "PYTHONUNBUFFERED"])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_closed_pipe_exits_quietly(catalog, unbuffered, as_json):
    """Unbuffered stdout wrote part of a large --json document, said nothing and exited 0."""
    cat, _ = catalog
    p = subprocess.Popen(
        argv("query", cat, "select * from range(40000)", *(["--json"] if as_json else [])),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env(PYTHONUNBUFFERED=unbuffered),
    )
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read()
    assert first.strip() == (b"[" if as_json else b"range") and p.wait() == 141 and err == b"", err


def test_a_report_never_replaces_the_spec_or_a_file_of_the_catalog_it_judges(catalog, tmp_path):
    """`--save` naming the `--acceptance` file replaced the spec (the next CI run: exit 2, not TOML), and
    `--junit` inside the catalog replaced the version's manifest (the next run: exit 3, damaged)."""
    cat, vid = catalog
    spec = tmp_path / "gate.toml"
    spec.write_text("[thresholds]\nmax_bad_shards = 0\n")
    manifest_file = cat / "versions" / vid / "manifest.json"
    before = manifest_file.read_bytes()
    one_line_error(
        run("validate", cat, "--acceptance", spec, "--save", spec, check=None),
        2,
        f"--save {spec}: is the file of --acceptance",
    )
    one_line_error(run("validate", cat, "--junit", manifest_file, check=None), 2, "is inside the catalog")
    one_line_error(run("bench", cat, "--save", cat / "bench.json", check=None), 2, "is inside the catalog")
    assert spec.read_text() == "[thresholds]\nmax_bad_shards = 0\n" and manifest_file.read_bytes() == before
    assert not (cat / "bench.json").exists()
