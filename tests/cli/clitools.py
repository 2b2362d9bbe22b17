"""Helpers for CLI tests. The CLI under test is the real ``dsbuild`` executable, run in a subprocess: exit codes, stdout,
stderr and signals are what a user (or a CI job) sees. Captures and catalogs are made through it too."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent
DSBUILD = BIN / "dsbuild"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def argv(*args) -> list[str]:
    """The real console script when installed (``make venv``), else the same entry point via python."""
    if DSBUILD.exists():
        return [str(DSBUILD), *map(str, args)]
    return [sys.executable, "-c", "from dsbuild.cli.app import main; main()", *map(str, args)]


def env(**extra) -> dict:
    e = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "80"}
    e.pop("FORCE_COLOR", None)
    e.update({k: str(v) for k, v in extra.items()})
    return e


def run(*args, cwd=None, check: int | None = 0, extra_env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """``dsbuild ARGS`` with stdout and stderr captured (pipes: not a terminal). ``check``: expected exit code."""
    p = subprocess.run(argv(*args), capture_output=True, text=True, cwd=cwd, env=env(**(extra_env or {})), **kw)
    if check is not None:
        assert p.returncode == check, (
            f"dsbuild {' '.join(map(str, args))}: exit {p.returncode}, expected {check}\n"
            f"stdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-2000:]}"
        )
    return p


def run_json(*args, **kw):
    return json.loads(run(*args, "--json", **kw).stdout)


def run_tty(*args, cwd=None, columns: int = 200) -> tuple[int, str]:
    """``dsbuild ARGS`` with stdout and stderr on a pseudo-terminal (what a person sees); ANSI codes removed."""
    import pty

    master, slave = pty.openpty()
    p = subprocess.Popen(
        argv(*args),
        stdout=slave,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env=env(COLUMNS=columns, TERM="xterm-256color"),
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    rc = p.wait()
    return rc, ANSI.sub("", b"".join(chunks).decode("utf-8", "replace")).replace("\r", "")


def processes_in_group(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid`` (read from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry))
    return out


def start_s3(cache_dir: Path):
    """A moto S3 server on 127.0.0.1 (a real endpoint the subprocesses reach over HTTP) and the
    environment that points dsbuild at it. Returns (server, env); stop with server.stop()."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    port = server._server.server_port
    return server, {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "DSBUILD_CACHE": str(cache_dir),
    }


def make_buckets(s3_env: dict, *names: str) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3_env["AWS_ENDPOINT_URL"],
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    have = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    for name in names:
        if name not in have:
            client.create_bucket(Bucket=name)
