"""The S3 server's fixtures for the object-store tests: `lab.s3server.S3Server` (moto's server
mode on 127.0.0.1), one for the session or one of a test's own that it may stop."""

from __future__ import annotations

import pytest

from lab.s3server import S3Server


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
