"""A real S3 endpoint for tests: moto's server on 127.0.0.1 behind a TCP proxy that can drop a
connection mid-response. Started and stopped by the tests themselves (see the ``s3`` fixture)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class DroppingProxy:
    """A TCP proxy to the S3 server that, when armed, cuts the next response after ``after`` bytes (every
    such response while ``down``: a network that lists but cannot deliver); while ``silent`` it accepts
    connections and never answers."""

    def __init__(self, target: int, after: int = 40_000):
        self.target, self.after = target, after
        self.armed = False
        self.down = False
        self.silent = False  # accept connections, never answer (an endpoint that hangs)
        self.accepted = 0
        self._held: list = []
        self.drops = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            if self.silent:
                self._held.append(client)  # read nothing, answer nothing
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src, dst, response):
        sent = 0
        try:
            while data := src.recv(65536):
                if response and (self.armed or self.down) and sent + len(data) > self.after:
                    self.armed = False
                    self.drops += 1
                    dst.sendall(data[: self.after - sent])
                    raise ConnectionResetError("dropped by the test proxy")
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


@contextmanager
def s3_endpoint(cache: Path, bucket: str = "data") -> Iterator[DroppingProxy]:
    """Start moto on 127.0.0.1, point the AWS environment (and DSBUILD_CACHE) at it, create ``bucket``."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    proxy = DroppingProxy(server._server.server_port)
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "DSBUILD_CACHE": str(cache),
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        import boto3

        boto3.client("s3").create_bucket(Bucket=bucket)
        yield proxy
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()
