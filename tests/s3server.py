"""A real S3-compatible server for the tests: moto's server mode (`moto[server]`, which `make test`
installs with the dev extra), started on 127.0.0.1 by the test that needs it and stopped after.

Clients find it as they would find any S3 endpoint, through the environment (`AWS_ENDPOINT_URL`,
`AWS_ACCESS_KEY_ID`, ...): `env()` is what a test puts there, for itself (monkeypatch) or for a
command it runs. moto accepts any key pair; a test of wrong credentials turns on its IAM checks.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

import pytest


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


@pytest.fixture(scope="session")
def s3_server():
    """One moto server for the session's tests (each makes its own buckets)."""
    pytest.importorskip("moto.server", reason="moto's server: pip install 'moto[server]'")
    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch) -> S3Server:
    """The session's server, with its address and credentials in this test's environment."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    return s3_server


@pytest.fixture
def own_s3_server(monkeypatch):
    """A server of this test's own, which the test may stop (a server that goes away)."""
    pytest.importorskip("moto.server", reason="moto's server: pip install 'moto[server]'")
    server = S3Server().start()
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    yield server
    server.stop()
