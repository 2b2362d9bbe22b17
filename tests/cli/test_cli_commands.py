"""The commands users asked for: info, shards (read back by the real webdataset library), convert
--dry-run / --rehash / --no-audio, query --unsafe, and tags with suggestions; gc, pull and verify's
hint facing a damaged or forged catalog."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli.clitools import argv, env, run, run_json
from tests.helpers import index_rows


def test_info_shows_one_version_without_sql(catalog):
    cat, vid = catalog
    d = run_json("info", f"{cat}@gold")
    assert d["version_id"] == vid and d["tags"] == ["gold"] and d["format"] == "webdataset"
    assert d["config"]["clip_seconds"] == 2.0 and d["stats"]["sessions"] == 3 and d["stats"]["hours"] > 0
    assert [s["name"] for s in d["split_sets"]] == ["main"]
    text = run("info", cat).stdout
    for title in d["stats"]["samples_per_title"]:
        assert f"{title}\t" in text
    assert f"version\t{vid}" in text and "tags\tgold" in text and "hours\t" in text
    assert run("info", cat, "--quiet").stdout.strip() == vid


def test_shards_feed_the_webdataset_library_in_order(catalog):
    wds = pytest.importorskip("webdataset")
    cat, _vid = catalog
    paths = run("shards", cat).stdout.split()
    info = run_json("info", cat)
    assert paths and all(p.startswith(str(cat)) for p in paths)
    keys = [s["__key__"] for s in wds.WebDataset(paths, shardshuffle=False)]
    assert len(keys) == info["stats"]["samples"] and keys == sorted(keys)
    urls = run("shards", cat, "--urls").stdout.split()
    assert all(u.startswith("file:///") for u in urls) and len(urls) == len(paths)
    doc = run_json("shards", cat)
    assert [s["nsamples"] for s in doc["shardlist"]] == [s["samples"] for s in doc["shards"]]


def test_shards_of_one_split_hold_all_of_its_samples(catalog):
    wds = pytest.importorskip("webdataset")
    import pyarrow.parquet as pq

    cat, vid = catalog
    (train_file,) = (cat / "splits" / vid / "main").glob("*/train.parquet")
    train = set(pq.read_table(train_file, columns=["key"])["key"].to_pylist())
    listed = run("shards", cat, "--split", "main/train").stdout.split()
    seen = {s["__key__"] for s in wds.WebDataset(listed, shardshuffle=False)}
    doc = run_json("shards", cat, "--split", "main/train")
    assert train and train <= seen and sum(s["in_split"] for s in doc["shards"]) == len(train)
    assert [s["path"] for s in doc["shards"]] == listed


def test_dry_run_says_what_a_build_would_do_and_writes_nothing(catalog, caps, tmp_path):
    cat, vid = catalog
    mine = tmp_path / "caps"
    shutil.copytree(caps, mine)
    sessions = sorted(p.name for p in mine.iterdir())
    (mine / sessions[0] / "actions.jsonl").write_text('{"t": 0.5, "control": "button_a", "value": 1.0}\n')
    shutil.rmtree(mine / sessions[1])
    run("samples", tmp_path / "more", "--sessions", 1, "--seconds", 2, "--seed", 99, "--quiet")
    new = next((tmp_path / "more").iterdir())
    shutil.copytree(new, mine / new.name)
    (mine / "broken").mkdir()
    (mine / "broken" / "session.json").write_text("{")
    before = run("log", cat, "--quiet").stdout
    plan = run_json("convert", mine, cat, "--clip-seconds", 2, "--dry-run")
    assert plan["parent"] == vid and plan["reusable"]
    states = {s["path"]: s["state"] for s in plan["sessions"]}
    assert states[sessions[0]] == "changed" and states[sessions[2]] == "reused" and states[new.name] == "new"
    assert "removed" in states.values() and any(
        s["state"] == "quarantined" and s["path"].startswith("broken") for s in plan["sessions"]
    )
    assert plan["counts"] == {"new": 1, "changed": 1, "reused": 1, "healed": 0, "quarantined": 1, "removed": 1}
    assert run("log", cat, "--quiet").stdout == before  # nothing written
    text = run("convert", mine, cat, "--clip-seconds", 2, "--dry-run").stdout
    assert "1 new, 1 changed, 1 reused, 0 healed, 1 quarantined, 1 removed" in text
    other = run_json("convert", mine, cat, "--clip-seconds", 3, "--dry-run")
    assert not other["reusable"] and other["counts"]["reused"] == 0


def test_dry_run_says_which_unchanged_sessions_a_lost_shard_makes_convert_process_again(catalog, caps, tmp_path):
    """(They were listed as reused; convert then reported them healed, and counted a changed session in
    the lost shard as healed too.)"""
    cat, mine = tmp_path / "cat", tmp_path / "caps"
    shutil.copytree(catalog[0], cat)
    shutil.copytree(caps, mine)
    lost = next((cat / "shards").rglob("*.tar"))
    in_it = sorted(
        {r["session_id"] for r in index_rows(cat, catalog[1]) if r["shard"] == lost.relative_to(cat).as_posix()}
    )
    lost.unlink()
    changed = next(p.parent for p in mine.rglob("session.json") if json.loads(p.read_text())["session_id"] == in_it[0])
    (changed / "actions.jsonl").write_text('{"t": 0.5, "control": "button_a", "value": 1.0}\n')
    plan = run_json("convert", mine, cat, "--clip-seconds", 2, "--dry-run")
    assert plan["counts"]["healed"] == len(in_it) - 1 and plan["counts"]["changed"] == 1
    done = run_json("convert", mine, cat, "--clip-seconds", 2)
    assert done["healed_sessions"] == plan["counts"]["healed"] and done["reused_sessions"] == plan["counts"]["reused"]


@pytest.mark.parametrize("damage", ["delete", "flip"])
def test_the_command_verify_names_heals_the_shard(private_catalog, caps, damage):
    cat, _vid = private_catalog
    shard = next((cat / "shards").rglob("*.tar"))
    if damage == "delete":
        shard.unlink()
    else:
        data = bytearray(shard.read_bytes())
        data[100] ^= 0xFF
        shard.write_bytes(bytes(data))
    hint = run("verify", cat, check=1).stderr.splitlines()[-1]
    assert hint.startswith("hint: heal with: dsbuild convert ") and hint.endswith(" --rehash")
    run("convert", caps, cat, "--clip-seconds", 2, "--rehash", "--quiet")
    run("verify", cat, "--quiet")


@pytest.fixture(scope="module")
def two_versions(caps, tmp_path_factory) -> tuple[Path, str, str]:
    """(catalog, tuned, newest): a version of ``caps`` with every setting off its default, then the newest,
    built with default settings (neither is the ``catalog`` fixture's version). Tests that change it copy it."""
    cat = tmp_path_factory.mktemp("two-versions") / "cat"
    tuned = run(
        "convert",
        caps,
        cat,
        "--clip-seconds",
        2,
        "--shard-size",
        "64KiB",
        "--no-audio",
        "--transcode",
        "h264:64x48:gop8",
        "--zstd-level",
        9,
        "--quiet",
    ).stdout.strip()
    newest = run("convert", caps, cat, "--quiet").stdout.strip()
    return cat, tuned, newest


def test_the_heal_hint_rebuilds_the_very_version_it_was_printed_for(two_versions, tmp_path):
    """The hint once omitted the version's settings: pasted, it built a version of 8 s clips and left the
    damaged one damaged. Here the settings differ from their defaults and the version is not the newest."""
    cat, vid = tmp_path / "cat", two_versions[1]
    shutil.copytree(two_versions[0], cat)
    shard = Path(run_json("shards", f"{cat}@{vid}")["shards"][0]["path"])
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    hint = run("verify", f"{cat}@{vid}", check=1).stderr.splitlines()[-1].removeprefix("hint: heal with: ")
    subprocess.run(["bash", "-c", hint], env=env(), check=True, capture_output=True)
    run("verify", f"{cat}@{vid}", "--quiet")


def test_the_zstd_level_and_no_audio_are_part_of_the_config_and_a_bad_level_is_refused(two_versions, caps, tmp_path):
    cat, tuned, newest = two_versions
    info = run_json("info", f"{cat}@{tuned}")
    assert info["config"]["zstd_level"] == 9 and info["config"]["audio"] is False and info["stats"]["samples"] > 0
    config = run_json("info", f"{cat}@{newest}")["config"]
    assert config["zstd_level"] == 3 and config["audio"] is True  # the defaults, recorded as such
    bad = run("convert", caps, tmp_path / "other", "--zstd-level", 0, check=2)
    assert "--zstd-level" in bad.stderr and not (tmp_path / "other").exists()


def test_query_is_sandboxed_unless_unsafe(catalog, tmp_path):
    cat, _ = catalog
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n2\n")
    sql = f"select count(*) as n from read_csv('{secret}')"
    p = run("query", cat, sql, check=2)
    assert "refused" in p.stderr and "--unsafe" in p.stderr
    assert run_json("query", cat, sql, "--unsafe") == [{"n": 2}]
    csv = run("query", cat, "select 1 as a, 'x,y' as b", "--csv").stdout
    assert csv == 'a,b\n1,"x,y"\n'
    # --quiet: rows only, tab-separated (the separators were escaped to a literal backslash-t, so
    # `cut -f2` got the whole line); a tab inside a value is escaped
    assert (
        run("query", cat, "select 1 as a, 'x' as b, null as c, 'y' || chr(9) || 'z' as d", "-q").stdout
        == "1\tx\t\ty\\tz\n"
    )
    # duckdb's spill folder (".tmp" under the working directory, a catalog's build folder when run there)
    # was allowed: reads, COPY TO and ATTACH worked in it
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "in.csv").write_text("a\n1\n")
    for sql in [
        "copy (select 1 as s) to '.tmp/out.csv'",
        "select * from read_csv('.tmp/in.csv')",
        "attach '.tmp/x.db' as x",
    ]:
        assert "refused" in run("query", cat, sql, cwd=tmp_path, check=2).stderr
    assert sorted(p.name for p in (tmp_path / ".tmp").iterdir()) == ["in.csv"]


def test_a_damaged_split_set_pointer_is_named_and_log_and_info_still_list_the_version(private_catalog):
    """One unreadable splits/<v>/<name>.json made `log` and `info` fail (exit 2, as if the user's input
    were wrong); it is the catalog that is damaged (exit 3 where the split set is needed)."""
    cat, vid = private_catalog
    (cat / "splits" / vid / "main.json").write_text('{"broken')
    entry = run_json("log", cat)["versions"][0]
    assert entry["version_id"] == vid and entry["split_sets"][0]["name"] == "main"
    assert "damaged split set pointer" in entry["split_sets"][0]["damaged"]
    assert "split set main damaged: " in run("info", cat).stdout
    p = run("validate", cat, "--split-set", "main", check=3)
    assert "damaged split set pointer" in p.stderr and "--name main --force" in p.stderr
    run("split", cat, "--name", "main", "--by", "session_id", "--force", "--quiet")  # the hint works (it failed alike)
    assert run_json("log", cat)["versions"][0]["split_sets"][0]["splits"]
    # a pointer the store refuses to read (a FIFO; alike a symlink out of the catalog) was exit 2, as if
    # the user's input were wrong, from split --check and diff; exit 3 from validate
    pointer = cat / "splits" / vid / "main.json"
    pointer.unlink()
    os.mkfifo(pointer)
    for args in (
        ("split", cat, "--name", "main", "--check"),
        ("diff", cat, cat, "--split-set", "main"),
        ("validate", cat, "--split-set", "main"),
    ):
        assert "damaged split set" in run(*args, check=3).stderr


def test_tags_are_created_moved_and_deleted(private_catalog):
    cat, vid = private_catalog
    assert run_json("tag", f"{cat}@{vid[:10]}", "release")["version_id"] == vid
    p = run("tag", cat, "release", "--delete")
    assert "deleted tag release" in p.stdout
    run("tag", f"{cat}@gold", "x.1")
    assert run("tag", f"{cat}@gold", "1bad", check=2).stderr.startswith("error: tag '1bad'")
    # hex digits only: a short id as dsbuild prints them, or a version's prefix, would be hidden by the tag
    assert "reads as a version id" in run("tag", f"{cat}@gold", "abcdef12", check=2).stderr
    if vid[0] in "abcdef":  # (a tag starts with a letter)
        assert "reads as a version id" in run("tag", f"{cat}@gold", vid[:3], check=2).stderr
    if not vid.startswith("cafe"):
        run("tag", f"{cat}@gold", "cafe")  # a short word of hex letters that names no version: a tag


def test_gc_never_follows_a_symlinked_build_folder_out_of_the_catalog(private_catalog, tmp_path):
    """A `.tmp` that is a symlink once made gc delete every folder it pointed at; a build folder whose
    lock is a FIFO made it hang holding the catalog lock."""
    cat, _ = private_catalog
    victim = tmp_path / "victim"
    (victim / "projectA").mkdir(parents=True)
    (victim / "projectA" / "keep.txt").write_text("mine")
    shutil.rmtree(cat / ".tmp", ignore_errors=True)
    (cat / ".tmp").symlink_to(victim)
    p = run("gc", cat, check=3, timeout=120)
    assert ".tmp" in p.stderr and "symlink" in p.stderr
    assert (victim / "projectA" / "keep.txt").read_text() == "mine" and not (victim / "commit.lock").exists()
    (cat / ".tmp").unlink()
    (cat / ".tmp" / "odd").mkdir(parents=True)
    os.mkfifo(cat / ".tmp" / "odd" / "lock")
    done = run_json("gc", cat, timeout=120)
    assert "odd" not in done["stale_builds"] and (cat / ".tmp" / "odd").is_dir()


@pytest.mark.parametrize("kind", ["symlink to /dev/zero", "fifo"])
def test_pull_reads_a_source_shard_only_as_a_regular_file_of_its_recorded_size(private_catalog, tmp_path, kind):
    cat, _vid = private_catalog
    shard = next((cat / "shards").rglob("*.tar"))
    shard.unlink()
    if kind == "fifo":
        os.mkfifo(shard)
    else:
        shard.symlink_to("/dev/zero")
    p = run("pull", cat, tmp_path / "dest", check=3, timeout=120)  # a damaged catalog: exit 3
    assert shard.name in p.stderr
    assert sum(f.stat().st_size for f in (tmp_path / "dest").rglob("*") if f.is_file()) < 10 << 20


def test_the_heal_hint_is_safe_to_paste_whatever_the_commit_record_says(private_catalog):
    """The captures folder in the hint comes from commit.json, which a forged catalog controls."""
    import shlex

    cat, vid = private_catalog
    record = cat / "versions" / vid / "commit.json"
    doc = json.loads(record.read_text())
    doc["captures"] = "/data/caps; touch /tmp/pwned #"
    record.write_text(json.dumps(doc))
    next((cat / "shards").rglob("*.tar")).unlink()
    hint = run("verify", cat, check=1).stderr.splitlines()[-1].removeprefix("hint: heal with: ")
    assert shlex.split(hint) == [
        "dsbuild",
        "convert",
        "/data/caps; touch /tmp/pwned #",
        str(cat),
        "--format",
        "webdataset",
        "--clip-seconds",
        "2.0",
        "--shard-size",
        "256000000",
        "--audio",
        "--zstd-level",
        "3",
        "--onto",
        vid,
        "--rehash",
    ]


def test_a_video_that_is_a_fifo_quarantines_its_session_instead_of_hanging(caps, tmp_path):
    """FFmpeg's open of a FIFO blocks until a writer comes: convert waited forever."""
    mine = tmp_path / "caps"
    shutil.copytree(caps, mine)
    session = sorted(p.parent for p in mine.rglob("session.json"))[0]
    video = json.loads((session / "session.json").read_text())["video"]
    (session / video).unlink()
    os.mkfifo(session / video)
    done = run_json("convert", mine, tmp_path / "cat", "--clip-seconds", 2, timeout=300)
    assert [(q["path"], q["reason"]) for q in done["quarantined"]] == [
        (f"{session.name}/{video}", "is a FIFO, not a regular file")
    ]  # no host path: it is in the manifest
    assert done["sessions"] == 2


def test_a_report_that_cannot_be_written_whole_leaves_the_previous_one(catalog, tmp_path):
    """--save and --junit are replaced atomically, like --html: a disk that fills mid-write (here a file
    size limit) used to leave 4 KiB of broken JSON where the last good report was."""
    import resource
    import signal

    cat, _ = catalog
    report, junit = tmp_path / "r.json", tmp_path / "r.xml"
    run("validate", cat, "--save", report, "--junit", junit, "--quiet")
    good, good_xml = report.read_bytes(), junit.read_bytes()
    assert json.loads(good)["verdict"] and len(good) > 4096

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    p = run("validate", cat, "--save", report, "--junit", junit, check=3, preexec_fn=small_files)
    assert "r.json: cannot write" in p.stderr
    assert report.read_bytes() == good and junit.read_bytes() == good_xml


def test_convert_reports_every_repair_and_drop_summed_over_sessions(caps, tmp_path):
    """The report said how many sessions were repaired, not what was dropped: the counts were only in
    each session's record."""
    mine = tmp_path / "caps"
    shutil.copytree(caps, mine)
    sessions = sorted(p.parent for p in mine.rglob("session.json"))
    for n, session in enumerate(sessions[:2], start=1):  # 1 + 2 malformed lines
        with open(session / "actions.jsonl", "a") as f:
            f.write("not json\n" * n)
    done = run_json("convert", mine, tmp_path / "cat", "--clip-seconds", 2)
    assert done["repairs"]["actions"]["malformed"] == 3
    records = json.loads(next((tmp_path / "cat" / "versions").glob("*/sessions.json")).read_text())["sessions"]

    def count(v):  # a count, or a reason: that counts its sessions
        return v if type(v) is int else int(v not in (None, False))

    for stream in ("actions", "telemetry", "text", "video"):
        for name, total in done["repairs"][stream].items():
            assert total == sum(count(s["repairs"][stream][name]) for s in records), (stream, name)
    text = run("convert", mine, tmp_path / "cat2", "--clip-seconds", 2).stdout
    assert "actions: 3 malformed" in text


@pytest.mark.parametrize("verb", ["pull", "push"])
def test_a_ref_that_does_not_resolve_leaves_no_destination_behind(catalog, tmp_path, verb):
    cat, _ = catalog
    p = run(verb, f"{cat}@no-such-tag", tmp_path / "dest", check=None)
    assert p.returncode == 2 and "no-such-tag" in p.stderr, p.stderr
    assert not (tmp_path / "dest").exists()  # an empty catalog there made the next typo look like a success


def _files(folder) -> dict[str, bytes]:
    """Every file under ``folder`` (a catalog, .tmp included) and its bytes: what a refused copy must not change."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_push_whose_tag_clashes_is_refused_before_anything_is_sent(catalog, two_versions, tmp_path):
    """The clash was found after the shards and the version were published (and the split sets were not
    copied), and the error did not say so."""
    cat, vid = catalog
    dest = tmp_path / "copy1"
    shutil.copytree(two_versions[0], dest)  # versions of the same captures, but not the one pushed
    run("tag", dest, "gold", "--quiet")  # gold names another version there
    before = _files(dest)
    p = run("push", f"{cat}@gold", dest, "--tags", "--splits", check=2)
    assert "tag 'gold' already points at" in p.stderr and "nothing was copied" in p.stderr, p.stderr
    assert _files(dest) == before and not (dest / "versions" / vid).exists()


def test_a_pull_whose_split_set_clashes_is_refused_before_any_tag_moves(catalog, tmp_path):
    cat, vid = catalog
    dest = tmp_path / "dest"
    run("pull", f"{cat}@gold", dest, "--quiet")
    run("split", f"{dest}@{vid}", "--name", "main", "--by", "session_id", "--salt", "other", "--quiet")
    before = _files(dest)
    p = run("pull", f"{cat}@gold", dest, "--tags", "--splits", check=2)
    assert "split set 'main'" in p.stderr and "nothing was copied" in p.stderr, p.stderr
    assert _files(dest) == before and not (dest / "tags.json").exists()


def test_concurrent_copies_of_one_version_all_succeed_and_a_leftover_folder_is_replaced(catalog, tmp_path):
    """Four pulls of one version into one catalog at once: three failed, exit 3, "<dest>/.tmp/<uuid>/version:
    Directory not empty" (the existence check ran before the lock). A versions/<id>/ folder without its
    manifest (invisible) made every later copy fail the same way."""
    import subprocess

    from tests.cli.clitools import argv, env

    cat, vid = catalog
    dest = tmp_path / "shared"
    procs = [
        subprocess.Popen(
            argv("pull", f"{cat}@gold", dest, "--quiet"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
        )
        for _ in range(4)
    ]
    results = [(p.wait(), p.stderr.read()) for p in procs]
    assert [code for code, _ in results] == [0] * 4, results
    assert run("verify", dest).returncode == 0
    other = tmp_path / "other"
    run("pull", f"{cat}@gold", other, "--quiet")
    (other / "versions" / vid / "manifest.json").unlink()  # invisible now: a leftover, not a version
    run("pull", f"{cat}@gold", other, "--quiet")
    assert run("verify", other).returncode == 0


def test_a_copy_into_a_destination_whose_version_lost_a_pinned_file_writes_it_back(catalog, tmp_path):
    """push said "version already there" (exit 0) while the destination's copy had no index."""
    cat, vid = catalog
    dest = tmp_path / "dest"
    run("push", f"{cat}@gold", dest, "--quiet")
    (dest / "versions" / vid / "index.parquet").unlink()
    run("push", f"{cat}@gold", dest, "--quiet")
    assert run("verify", dest).returncode == 0


def test_a_tag_the_destination_would_read_as_a_version_id_is_refused_before_anything_is_sent(catalog, tmp_path):
    """--tags copied a hex-only tag (one made before such tags were refused) after publishing the version,
    then failed with exit 2: the destination was changed by a refused copy."""
    cat, vid = catalog
    src = tmp_path / "src"
    shutil.copytree(cat, src)
    tags = json.loads((src / "tags.json").read_text())
    tags["tags"]["abcdef12"] = vid  # (written as an older dsbuild allowed)
    (src / "tags.json").write_text(json.dumps(tags))
    p = run("push", f"{src}@gold", tmp_path / "dest", "--tags", check=2)
    assert "'abcdef12' reads as a version id" in p.stderr
    assert not (tmp_path / "dest" / "versions").exists()


@pytest.mark.parametrize("verb", ["push", "pull"])
def test_a_copy_that_fails_leaves_no_catalog_it_created(private_catalog, tmp_path, verb):
    """A damaged source shard (exit 3) left catalog.json and .tmp/*.lock in a destination that did not exist."""
    cat, vid = private_catalog
    shard = cat / json.loads((cat / "versions" / vid / "manifest.json").read_text())["shards"][-1]["path"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    p = run(verb, cat, tmp_path / "new", check=3)
    assert "not what the shard's name and record say" in p.stderr, p.stderr
    assert p.stderr.startswith(f"error: {cat}/shards/")  # the source catalog named (was the bare key)
    assert not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    run(verb, cat, tmp_path / "empty", check=3)
    assert list((tmp_path / "empty").iterdir()) == []  # emptied again, the folder kept


def test_an_unreachable_http_catalog_is_a_network_error_and_a_missing_one_is_not_a_catalog(tmp_path):
    """A refused connection said "not a dsbuild catalog" (exit 2): fsspec's HTTP file system answers any
    failed request with "no such file"."""
    pytest.importorskip("aiohttp")
    import socket
    import threading
    from functools import partial
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))  # bound, never listening: every connection is refused
        url = f"http://127.0.0.1:{bound.getsockname()[1]}/cat"
        p = run("info", url, check=3)
    assert url in p.stderr and "connect" in p.stderr.lower() and "not a dsbuild catalog" not in p.stderr, p.stderr
    (tmp_path / "cat").mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        p = run("info", f"http://127.0.0.1:{server.server_port}/cat", check=2)  # a 404: reachable, no catalog
    finally:
        server.shutdown()
        server.server_close()
    assert "not a dsbuild catalog" in p.stderr, p.stderr


def test_a_parquet_catalog_is_built_onto_like_a_webdataset_one(caps, tmp_path):
    """Parquet rows did not record their member sizes: any second convert into a Parquet catalog (the
    same captures again, or one more session) was internal error 70."""
    mine = tmp_path / "caps"
    shutil.copytree(caps, mine)
    first = sorted(p.parent for p in mine.rglob("session.json"))[0]
    held = tmp_path / "held"
    shutil.move(first, held)
    args = ("--format", "parquet", "--clip-seconds", 2)
    v1 = run_json("convert", mine, tmp_path / "cat", *args)
    again = run_json("convert", mine, tmp_path / "cat", *args)
    assert again["existed"] and again["version_id"] == v1["version_id"] and again["reused_sessions"] == 2
    shutil.move(held, first)
    v2 = run_json("convert", mine, tmp_path / "cat", *args)
    fresh = run_json("convert", mine, tmp_path / "fresh", *args)
    assert v2["parent"] == v1["version_id"] and v2["reused_sessions"] == 2
    assert v2["version_id"] == fresh["version_id"] != v1["version_id"]  # incremental = from scratch
    assert run("verify", f"{tmp_path / 'cat'}@{v2['version_id']}", check=None).returncode == 0
    # a Parquet version from before rows recorded member sizes is built afresh, to the same version
    import pyarrow as pa

    from tests.helpers import with_index

    def no_sizes(table):
        i = table.schema.get_field_index("member_bytes")
        return table.set_column(i, "member_bytes", pa.nulls(table.num_rows, table.schema.field(i).type))

    older = with_index(tmp_path / "fresh", fresh["version_id"], no_sizes, remove=True)
    rebuilt = run_json("convert", mine, tmp_path / "fresh", *args, "--onto", older)
    assert rebuilt["version_id"] == fresh["version_id"] and rebuilt["reused_sessions"] == 0


def test_arguments_that_are_not_utf8_are_usage_errors_not_internal_ones(private_catalog):
    """A shell passes bytes; Python hands non-UTF-8 ones on as lone surrogates, which `split --salt` then
    failed to hash and `lineage` to compare (exit 70, "internal error")."""
    cat, _ = private_catalog
    bad = b"\xff".decode("utf-8", "surrogateescape")
    assert "not valid UTF-8" in run("split", cat, "--name", "s1", "--salt", bad, check=2).stderr
    assert "no sample with key" in run("lineage", cat, f"k{bad}", check=2).stderr


def test_a_ray_cluster_address_nothing_answers_at_is_one_line_exit_3(catalog):
    """`--ray-address ray://HOST:PORT` (the README's form) was exit 70 (Ray Client's package missing), and
    an address nothing answers at hung for minutes printing Ray's own warnings; `auto` with no cluster
    running on the node was a traceback."""
    pytest.importorskip("ray")
    cat, _ = catalog
    addresses = ("ray://127.0.0.1:1", "127.0.0.1:1", "auto")
    # started together: each spends seconds of wall time (not CPU) loading Ray before it refuses
    procs = [
        subprocess.Popen(
            argv("validate", cat, "--executor", "ray", "--ray-address", address, "--quiet"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
        )
        for address in addresses
    ]
    for address, p in zip(addresses, procs):
        _, err = p.communicate(timeout=300)
        lines = err.strip().splitlines()
        assert p.returncode == 3, (address, p.returncode, err)
        assert lines[0].startswith(f"error: --ray-address {address}: cannot") and lines[1].startswith("hint:"), err


def test_a_catalog_cannot_be_created_under_a_name_every_command_reads_as_a_version(caps, tmp_path):
    """`convert caps a@b` made a catalog that `info`, `validate`... then read as version b of catalog a."""
    p = run("convert", caps, tmp_path / "a@b", check=2)
    assert "cannot hold '@'" in p.stderr and not (tmp_path / "a@b").exists()
    run("convert", caps, tmp_path / "user@host" / "cat", "--clip-seconds", 2, "-q")  # an '@' in a folder above


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_shard_replaced_by_a_fifo_or_a_folder_is_named_as_such_and_its_samples_counted_once(private_catalog, kind):
    """Its samples were listed twice ("cannot be read", then "lost with missing shard") and the shard
    called missing while it was present."""
    cat, vid = private_catalog
    shard = next((cat / "shards").rglob("*.tar"))
    held = [r["key"] for r in index_rows(cat, vid) if r["shard"] == shard.relative_to(cat).as_posix()]
    shard.unlink()
    os.mkfifo(shard) if kind == "fifo" else shard.mkdir()
    checked = run_json("verify", cat, check=1)
    assert [
        p["problem"]
        for p in checked["problems"]
        if p.get("shard") == shard.relative_to(cat).as_posix() and "sample" not in p
    ] == ["not a regular file"]
    report = run_json("validate", cat, check=1)
    lost = [o["item"] for c in report["checks"] for o in c["offenders"] if o["item"] in held]
    assert sorted(lost) == sorted(held)  # once each
