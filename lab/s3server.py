"""A real S3-compatible server on this machine: moto's server mode (`moto[server]`, in the dev
extra), started on a free port of 127.0.0.1 and stopped by whoever started it: `S3Server` in a
process of its own, `RestartableS3Server` in a thread of this one, which comes back with its
objects. The tests' fixtures (tests/s3_fixtures.py) and `benchmarks/streaming.py --s3` use them.

Clients find it as they find any S3 endpoint, through the environment (`env()`: `AWS_ENDPOINT_URL`,
`AWS_ACCESS_KEY_ID`, ...). moto accepts any key pair unless its IAM checks are on: from the start
(`S3Server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"})`), or from now on (`refuse_keys()`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """moto's server in a process of its own, on a free port of 127.0.0.1."""

    def __init__(self, env: dict[str, str] | None = None):
        self.extra_env = env or {}  # of the server's process: INITIAL_NO_AUTH_ACTION_COUNT turns on IAM
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> S3Server:
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.process = subprocess.Popen(command, env={**os.environ, **self.extra_env}, **quiet)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto's server exited with status {self.process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"moto's server did not listen on {self.url} within {timeout} s")

    def stop(self) -> None:
        """Stops the server at once (SIGKILL): to a client, a server that went away."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def env(self) -> dict[str, str]:
        """The environment a client reads this server's address and credentials from."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip

    def bucket(self) -> str:
        """A new, empty bucket; its name."""
        name = f"test-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def refuse_keys(self, refuse: bool = True) -> None:
        """moto's IAM checks on (it refuses every key it has not issued, ours included) or off."""
        request = urllib.request.Request(
            f"{self.url}/moto-api/reset-auth",
            data=b"0" if refuse else b"inf",  # how many requests to let through first
            headers={"Content-Type": "text/plain"},  # else moto reads the body as a form, and fails
            method="POST",
        )
        urllib.request.urlopen(request, timeout=10).close()


class RestartableS3Server(S3Server):
    """moto's server in a thread of this process, on a free port of 127.0.0.1: `stop()` is a
    store gone (the connections clients hold are closed, new ones refused), `start()` brings it back
    on the same port with every object it held (moto keeps them in this process). A process forked
    while it runs holds its listening socket: stopped, it would then take connections and never
    answer; use `S3Server` where loader workers are forked."""

    server = None  # werkzeug's, while it runs
    thread: threading.Thread | None = None

    def start(self, timeout: float = 30) -> RestartableS3Server:
        if self.server is not None:
            return self
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # not a line per request
        app = DomainDispatcherApplication(create_backend_app)
        handler = MotoRequestHandler
        self.server = make_server("127.0.0.1", self.port, app, threaded=True, request_handler=handler)
        self.connections: list[socket.socket] = []
        serve = self.server.process_request

        def process_request(connection, address):  # kept, to be closed when the store goes
            self.connections.append(connection)
            serve(connection, address)

        self.server.process_request = process_request
        # polled every 50 ms for a stop (werkzeug's default, 0.5 s, is what stopping it would wait)
        self.thread = threading.Thread(target=functools.partial(self.server.serve_forever, 0.05), daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.server is None:
            return
        self.server.shutdown()  # no new connections: serve_forever closes the listening socket
        self.thread.join()
        for connection in self.connections:  # and none of the kept-alive ones answers again
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self.server = self.thread = None
