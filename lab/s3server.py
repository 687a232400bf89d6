"""A real S3-compatible server on this machine: moto's server mode (`moto[server]`, in the dev
extra), started on a free port of 127.0.0.1 and stopped by whoever started it. The tests' fixtures
(tests/s3server.py) and `benchmarks/streaming.py --s3` use it.

Clients find it as they find any S3 endpoint, through the environment (`env()`: `AWS_ENDPOINT_URL`,
`AWS_ACCESS_KEY_ID`, ...). moto accepts any key pair unless the server's environment turns on its
IAM checks (`S3Server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"})`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
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
