"""Soak: many more faults and hostile inputs than `make test` runs, with a tally for docs/reliability.md.

    .venv/bin/python benchmarks/soak.py [--kills 200] [--damaged 200] [--out bench-out/soak]

1. kill -9 of `dsbuild convert` at seeded random moments, alternately of the whole process group and of
   the parent alone (what an OOM killer does); after each: no worker outlives its parent, no partial
   version is listed, every listed version verifies; finally a re-run must give the clean version id.
2. every damage kind of the sample generator, many seeds: convert must finish, quarantine or repair.
3. loader bit flips: a random byte of a random shard flipped; the loader must finish the epoch with every
   other sample delivered exactly once and the damaged one counted.
4. hostile catalogs: a copy of a good catalog with one hostile edit each (FIFO or symlink-to-secret
   commit.json, manifest edited to match a flipped shard, duplicated index row, keys escaping the
   catalog, a tags file that is a device); `log`, `verify` and the loader must refuse with our own
   errors, never hang, never read or write outside the catalog.
5. red team (``--red-team N``): N copies of a small good catalog, each with one hostile tar member header
   forged into a seeded random member of a random shard (``../`` or absolute name, symlink, hard link,
   FIFO, character device, setuid/setgid/sticky mode, 8 GB size), a shard truncated or given a member
   in its end padding, or a seeded random sample's actions array rewritten as a big-endian float64 or
   Fortran-order array; every hash and the manifest re-pinned; then every way out runs over it: verify,
   every export, the ``shards`` check, pull and the loader. Counted: refused with our error, handed out
   (an export, pull or ``shards`` that accepted a forged copy: must be 0; ``forged_accepted_by`` names
   kind and way), delivered by the loader (must be 0), forged copies ``verify`` passed, disagreements
   with verify, errors that escaped (must be 0), files written outside the target (must be 0). Every
   15th copy is a control, re-pinned without an edit, which every way out must accept.
Prints JSON: faults injected, bad inputs tried, versions checked, data lost (must be 0). Sections run with
a count of 0 are skipped (``--kills 0 --damaged 0 --flips 0 --hostile 0 --red-team 40``: the red team only).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dsbuild.convert import ConvertConfig, convert  # noqa: E402
from dsbuild.core.errors import DsbuildError  # noqa: E402
from dsbuild.core.executor import ExecutorSpec  # noqa: E402
from dsbuild.lineage.catalog import Catalog  # noqa: E402
from dsbuild.lineage.verify import verify  # noqa: E402
from dsbuild.loader import Loader  # noqa: E402
from dsbuild.samples.synthetic import DAMAGE, generate  # noqa: E402
from tests.helpers import alive, children  # noqa: E402

CLI = [sys.executable, "-c", "from dsbuild.cli.app import main; main()"]
ARGS = ["--clip-seconds", "1", "--shard-size", "300000"]


def kills(caps: Path, out: Path, n: int, rng: random.Random) -> dict:
    t = time.monotonic()
    clean = json.loads(
        subprocess.run(
            CLI + ["convert", str(caps), str(out / "clean"), *ARGS, "--json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )["version_id"]
    duration = time.monotonic() - t
    cat, interrupted, checked, bad, orphans = out / "killed", 0, 0, 0, 0
    for _ in range(n):
        if (cat / "catalog.json").exists() and Catalog.open(cat).versions():
            shutil.rmtree(cat)
        p = subprocess.Popen(
            CLI + ["convert", str(caps), str(cat), *ARGS, "--workers", "2"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        time.sleep(rng.uniform(0, duration))
        if p.poll() is None:
            interrupted += 1
            workers = children(p.pid)
            if interrupted % 2:
                os.kill(p.pid, signal.SIGKILL)  # the parent alone: its workers must die with it
            else:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            time.sleep(0.5)
            orphans += sum(alive(w) for w in workers)
        p.wait()
        if (cat / "catalog.json").exists():
            for v in Catalog.open(cat).versions():
                checked += 1
                bad += v.version_id != clean or not verify(Catalog.open(cat), v.version_id).ok
    final = json.loads(
        subprocess.run(
            CLI + ["convert", str(caps), str(cat), *ARGS, "--json"], capture_output=True, text=True, check=True
        ).stdout
    )["version_id"]
    return {
        "kills": n,
        "interrupted": interrupted,
        "orphaned_workers": orphans,
        "versions_checked": checked,
        "bad_versions": bad,
        "rerun_matches_clean": final == clean,
    }


HOSTILE = (
    "fifo_commit",
    "symlink_commit",
    "forged_manifest",
    "duplicated_index_row",
    "escaping_tag_file",
    "device_tags",
)


def _hostile_edit(cat: Path, vid: str, kind: str, secret: Path) -> None:
    import hashlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    vdir = cat / "versions" / vid
    if kind == "fifo_commit":
        (vdir / "commit.json").unlink()
        os.mkfifo(vdir / "commit.json")
    elif kind == "symlink_commit":
        (vdir / "commit.json").unlink()
        (vdir / "commit.json").symlink_to(secret)
    elif kind == "forged_manifest":
        doc = json.loads((vdir / "manifest.json").read_text())
        shard = cat / doc["shards"][0]["path"]
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
        doc["shards"][0]["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
        (vdir / "manifest.json").write_text(json.dumps(doc, indent=2, sort_keys=True))
    elif kind == "duplicated_index_row":
        t = pq.read_table(vdir / "index.parquet")
        pq.write_table(pa.concat_tables([t, t.slice(0, 1)]), vdir / "index.parquet")
    elif kind == "escaping_tag_file":
        (cat / "tags.json").symlink_to(secret)
    elif kind == "device_tags":
        (cat / "tags.json").symlink_to("/dev/zero")


def hostile(caps: Path, out: Path, rounds: int) -> dict:
    """Every command and the loader on hostile copies of a good catalog: our errors only, in bounded time."""
    good = out / "hostile-good"
    vid = convert(caps, good, ConvertConfig(clip_seconds=1.0)).version_id
    secret = out / "secret.json"
    secret.write_text(json.dumps({"tags": {"leak": "0" * 64}, "format": "dsbuild.tags/1"}))
    tried = escaped = accepted = 0
    for i in range(rounds):
        kind = HOSTILE[i % len(HOSTILE)]
        cat = out / f"hostile-{i}"
        shutil.copytree(good, cat, symlinks=True)
        _hostile_edit(cat, vid, kind, secret)
        for args in (["log", str(cat), "--json"], ["verify", f"{cat}@{vid}", "--json"]):
            tried += 1
            try:
                r = subprocess.run(CLI + args, capture_output=True, text=True, timeout=120)
            except subprocess.TimeoutExpired:
                escaped += 1
                print(f"{kind}: {args[0]} hung", file=sys.stderr)
                continue
            if "Traceback" in r.stderr or r.returncode in (0, 70):
                escaped += r.returncode == 70 or "Traceback" in r.stderr
                # `log` lists history and never reads manifests; only `verify` is asked to judge them
                accepted += (
                    r.returncode == 0 and args[0] == "verify" and kind in ("forged_manifest", "duplicated_index_row")
                )
        shutil.rmtree(cat, ignore_errors=True)
    return {"hostile_catalog_commands": tried, "hostile_escaped_errors": escaped, "hostile_accepted_as_valid": accepted}


HEADER_EDITS = {
    "dotdot_name": lambda name: {"name": "../../../" + name},
    "absolute_name": lambda name: {"name": "/tmp/dsbuild-soak-" + name},
    "symlink": lambda name: {"type": b"2", "linkname": "/etc/passwd", "size": 0},
    "hardlink": lambda name: {"type": b"1", "linkname": "/etc/passwd", "size": 0},
    "fifo": lambda name: {"type": b"6", "size": 0},
    "char_device": lambda name: {"type": b"3", "size": 0},
    "setuid": lambda name: {"mode": 0o4755},
    "setgid": lambda name: {"mode": 0o2644},
    "sticky": lambda name: {"mode": 0o1644},
    "huge_size": lambda name: {"size": 8_000_000_000},
}
ARRAY_EDITS = ("big_endian_float64", "fortran_order")  # a sample's actions.npy rewritten (test_forged_arrays)
# control: no edit, all must accept
RED_TEAM = (*HEADER_EDITS, "truncated", "hidden_in_padding", *ARRAY_EDITS, "control")


def _array_edit(kind: str, victim: str):
    """``edit(key, members)`` for ``reseal``: sample ``victim``'s actions array rewritten as ``kind`` (a
    valid .npy of the wrong dtype or order)."""
    import io

    import numpy as np

    from tests.security.test_forged_arrays import REWRITE

    def edit(key: str, members: list) -> list:
        if key != victim:
            return members
        return [(ext, REWRITE[kind](np.load(io.BytesIO(p))) if ext == "actions.npy" else p) for ext, p in members]

    return edit


def _red_edit(kind: str, rng: random.Random):
    """``shard_bytes(n, data)`` for ``reseal``: ``kind`` forged into a random shard, at a random member."""
    from tests.security.conftest import BLOCK, _hidden_in_padding, _member_ends, _padded, retar

    def edit(n: int, data: bytes) -> bytes:
        if n != target or kind == "control":
            return data
        ends = _member_ends(data)
        if kind == "truncated":
            return _padded(data[: ends[rng.randrange(len(ends) - 1)]]) if len(ends) > 6 else data[: ends[-2]]
        if kind == "hidden_in_padding":
            return _hidden_in_padding(0, data)
        at = rng.choice([0, *ends[:-1]])
        name = data[at : at + 100].rstrip(b"\0").decode()
        return data[:at] + retar(data[at : at + BLOCK], **HEADER_EDITS[kind](name)) + data[at + BLOCK :]

    target = None

    def choose(shards: int) -> None:
        nonlocal target
        target = rng.randrange(shards)

    return edit, choose


def _ways_out(cat: Path, vid: str, out: Path, i: int) -> dict:
    """Every way bytes leave the catalog ``cat`` (version ``vid``), by name, as calls that raise to refuse."""
    from dsbuild.core.errors import CorruptDataError
    from dsbuild.export import TOOLS, export
    from dsbuild.lineage.transfer import transfer
    from dsbuild.lineage.verify import check_shards

    def load() -> None:
        loader = Loader(str(cat), decode="bytes", batch_size=2, seed=i)
        for _ in loader:
            pass
        if loader.stats()["corrupt"]:
            raise CorruptDataError(f"{loader.stats()['corrupt']} corrupt sample(s)")

    ways: dict[str, Callable[[], object]] = {
        f"export-{t}": functools.partial(export, str(cat), out / f"red-x-{i}-{t}", to=t) for t in TOOLS
    }
    ways["shards"] = lambda: check_shards(Catalog.open(cat), vid)
    ways["pull"] = lambda: transfer(Catalog.open(cat), vid, Catalog.open(out / f"red-pull-{i}", create=True))
    ways["loader"] = load
    return ways


def red_team(out: Path, rounds: int, rng: random.Random) -> dict:
    """Forged, re-pinned shards through every way out of a catalog (see the module's docstring, 5)."""
    from dsbuild.core.errors import CorruptDataError, FormatError
    from tests.security.conftest import restat
    from tests.validators.support import reseal, write_moving_session

    caps, good = out / "red-caps", out / "red-good"
    for i in range(2):
        write_moving_session(caps, f"s{i}", "Kart", f"p-{i}", seconds=4.0, seed=i, size=(64, 48))
    vid = convert(
        caps, good, ConvertConfig(clip_seconds=1.0, shard_size=65_536), executor=ExecutorSpec(workers=1)
    ).version_id
    m = Catalog.open(good).manifest(vid)
    rows = Catalog.open(good).index(vid, ["key", "frames", "n_controls"]).to_pylist()
    victims = [r["key"] for r in rows if r["frames"] > 1 and r["n_controls"] > 1]  # (Fortran order differs)
    counts = dict.fromkeys(
        (
            "red_team_cases",
            "red_team_ways_out",
            "refused",
            "controls_accepted",
            "handed_out",
            "loader_delivered",
            "verify_passed_forged",
            "disagreements",
            "escaped_errors",
            "written_outside",
        ),
        0,
    )
    by_kind: dict[str, int] = {}
    accepted_by: dict[str, dict[str, int]] = {}  # forged kind -> way out -> copies it accepted
    for i in range(rounds):
        kind = RED_TEAM[i % len(RED_TEAM)]
        by_kind[kind] = by_kind.get(kind, 0) + 1
        cat = out / f"red-{i}"
        shutil.copytree(good, cat)
        if kind in ARRAY_EDITS:
            forged = restat(cat, reseal(cat, vid, _array_edit(kind, rng.choice(victims))))
        else:
            edit, choose = _red_edit(kind, rng)
            choose(len(m.shards))
            forged = restat(cat, reseal(cat, vid, None, edit))
        counts["red_team_cases"] += 1
        bad = not verify(Catalog.open(cat), forged).ok
        counts["verify_passed_forged"] += not bad and kind != "control"
        ways = _ways_out(cat, forged, out, i)
        for name, way in ways.items():
            counts["red_team_ways_out"] += 1
            try:
                way()
                refused = False
            except (CorruptDataError, FormatError):
                refused = True
            except Exception as e:  # anything else escaped our error handling
                counts["escaped_errors"] += 1
                print(f"red team {kind}: {name}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
                continue
            counts["refused"] += refused
            if not refused and kind != "control":
                counts["handed_out" if name != "loader" else "loader_delivered"] += 1
                accepted_by.setdefault(kind, {}).setdefault(name, 0)
                accepted_by[kind][name] += 1
            counts["controls_accepted"] += not refused and kind == "control"
            counts["disagreements"] += refused != bad
            if refused != bad:
                print(
                    f"red team {kind}: {name} {'refused' if refused else 'accepted'}, verify "
                    f"{'rejected' if bad else 'passed'}",
                    file=sys.stderr,
                )
        counts["written_outside"] += len(list(Path("/tmp").glob("dsbuild-soak-*"))) + (out / "evil.sh").exists()
        shutil.rmtree(cat, ignore_errors=True)
        for p in out.glob(f"red-*-{i}*"):
            shutil.rmtree(p, ignore_errors=True)
    return {**counts, "red_team_kinds": by_kind, "forged_accepted_by": accepted_by}


def damaged(out: Path, n: int, rng: random.Random) -> dict:
    tried = crashed = refused = 0
    for i in range(n):
        kind = DAMAGE[i % len(DAMAGE)]
        caps = out / f"damaged-{i}"
        generate(caps, sessions=2, seconds=2, seed=rng.randrange(1 << 30), damage={1: kind})
        tried += 1
        try:
            convert(caps, out / f"damaged-cat-{i}", ConvertConfig(clip_seconds=1.0), executor=ExecutorSpec(workers=1))
        except DsbuildError:
            refused += 1  # e.g. both holders of a duplicated id quarantined: nothing left, a clear exit 1
        except Exception as e:
            crashed += 1
            print(f"{kind}: {type(e).__name__}: {e}", file=sys.stderr)
        shutil.rmtree(caps, ignore_errors=True)
        shutil.rmtree(out / f"damaged-cat-{i}", ignore_errors=True)
    return {"damaged_captures": tried, "refused_with_clear_error": refused, "escaped_errors": crashed}


def flips(caps: Path, out: Path, n: int, rng: random.Random) -> dict:
    lost = 0
    for i in range(n):
        cat = out / f"flip-{i}"
        r = convert(caps, cat, ConvertConfig(clip_seconds=1.0), executor=ExecutorSpec(workers=1))
        m = Catalog.open(cat).manifest(r.version_id)
        shard = cat / rng.choice(m.shards).path
        data = bytearray(shard.read_bytes())
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        shard.write_bytes(bytes(data))
        loader = Loader(str(cat), decode="bytes", batch_size=4, seed=i)
        keys = [k for b in loader for k in b["keys"]]
        lost += len(keys) != r.samples or len(set(keys)) + loader.stats()["corrupt"] < r.samples
        shutil.rmtree(cat)
    return {"bit_flips": n, "epochs_with_lost_or_repeated_samples": lost}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=200)
    ap.add_argument("--damaged", type=int, default=200)
    ap.add_argument("--flips", type=int, default=50)
    ap.add_argument("--hostile", type=int, default=24)
    ap.add_argument("--red-team", type=int, default=48)
    ap.add_argument("--out", default=str(ROOT / "bench-out" / "soak"))
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rng = random.Random(7)
    caps = out / "captures"
    if args.kills or args.flips or args.hostile:
        generate(caps, sessions=6, seconds=6, seed=11)
    report: dict = {}
    for count, section in (
        (args.kills, lambda: kills(caps, out, args.kills, rng)),
        (args.damaged, lambda: damaged(out, args.damaged, rng)),
        (args.flips, lambda: flips(caps, out, args.flips, rng)),
        (args.hostile, lambda: hostile(caps, out, args.hostile)),
        (args.red_team, lambda: red_team(out, args.red_team, random.Random(45))),
    ):
        if count:
            for key, value in section().items():  # (two sections count escaped errors: added up)
                report[key] = report[key] + value if key == "escaped_errors" and key in report else value
    report["data_lost"] = (
        report.get("bad_versions", 0)
        + report.get("epochs_with_lost_or_repeated_samples", 0)
        + (0 if report.get("rerun_matches_clean", True) else 1)
        + report.get("escaped_errors", 0)
        + report.get("handed_out", 0)
        + report.get("loader_delivered", 0)
    )
    report["hygiene_failures"] = (
        report.get("orphaned_workers", 0)
        + report.get("hostile_escaped_errors", 0)
        + report.get("hostile_accepted_as_valid", 0)
        + report.get("disagreements", 0)
        + report.get("written_outside", 0)
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
