"""The S3 server's fixtures for the object-store tests, over `lab.s3server`'s servers (moto's
server mode on 127.0.0.1): one for the session, one of a test's own that it may kill, one in this
process that a test may stop and start again with its objects, and one that refuses the test's keys
after its first request; and `StoreFault`, a callback that makes a test's server fail mid-run."""

from __future__ import annotations

import contextlib
from typing import Literal

import pytest
from lightning.pytorch.callbacks import Callback

from lab.s3server import RestartableS3Server, S3Server

SERVERS: dict[str, S3Server] = {}  # the servers of the running test's own, by their URL
# what a run prints on stderr before anything fails: Lightning's first lines, a progress bar
RUN_LINES = ("Seed set to ", "GPU available: ", "TPU available: ", "checking ")


def fault_line(status: int, captured, url: str) -> str:
    """The one line a command that met a store fault printed: exit status 1, its last line on
    stderr `error: URL...`, no other line but those of a run going well (`RUN_LINES`), no
    traceback anywhere; the line."""
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert status == 1 and lines and lines[-1].startswith(f"error: {url}"), captured.err
    assert [line for line in lines[:-1] if not line.startswith(RUN_LINES)] == [], captured.err
    assert "Traceback" not in captured.out + captured.err, captured.out + captured.err
    return lines[-1]


class StoreFault(Callback):
    """The test's server at `url` made to fail during a run: gone (`fault="gone"`: stopped, or
    killed) or refusing the keys (`"refused"`), after training step `at` (`when="step"`), or as the
    first checkpoint of epoch `at` is about to be written (`"checkpoint"`). Once only."""

    def __init__(
        self,
        url: str,
        fault: Literal["gone", "refused"] = "gone",
        when: Literal["step", "checkpoint"] = "step",
        at: int = 0,
    ):
        self.url, self.fault, self.when, self.at = url, fault, when, at
        self.happened = False

    def happen(self, when: str, at: int) -> None:
        if self.happened or (when, at) != (self.when, self.at):
            return
        self.happened = True
        if self.fault == "gone":
            SERVERS[self.url].stop()
        else:
            SERVERS[self.url].refuse_keys()

    def on_train_batch_end(self, trainer, *args) -> None:
        self.happen("step", trainer.global_step)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:  # before it is written
        self.happen("checkpoint", trainer.current_epoch)


# what else would reach a client of the tests' processes: a profile, a token, files of settings
OTHER_AWS_SETTINGS = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")


def point_at(server: S3Server, monkeypatch) -> S3Server:
    """`server`'s address and credentials in the test's environment, and no other AWS settings;
    s3fs's filesystems made for another server or other keys forgotten."""
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    for name in OTHER_AWS_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    from s3fs import S3FileSystem

    S3FileSystem.clear_instance_cache()
    return server


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
    return point_at(s3_server, monkeypatch)


@contextlib.contextmanager
def own(server: S3Server, monkeypatch):
    """`server`, a test's own: started, pointed at, known to `StoreFault`, stopped at the end."""
    pytest.importorskip("moto.server", reason="moto's server: pip install 'moto[server]'")
    point_at(server.start(), monkeypatch)
    SERVERS[server.url] = server
    try:
        yield server
    finally:
        del SERVERS[server.url]
        server.stop()


@pytest.fixture
def own_s3_server(monkeypatch):
    """A server in a process of this test's own, which the test may kill (a server that goes away,
    also for forked loader workers)."""
    with own(S3Server(), monkeypatch) as server:
        yield server


@pytest.fixture
def restartable_s3(monkeypatch):
    """A server in this process, which the test may stop (a store gone) and start again with the
    objects it held."""
    with own(RestartableS3Server(), monkeypatch) as server:
        yield server
        server.start()  # where the test left it stopped: moto's keys are this process's
        server.refuse_keys(False)


@pytest.fixture
def refusing_s3(monkeypatch):
    """A server of its own with moto's IAM checks on after its first request (which makes the
    bucket): the test's key pair, unknown to it, is refused."""
    with own(S3Server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "1"}), monkeypatch) as server:
        yield server
