"""Files written whole or not at all (`vit.storage.atomic_file`): what vit-train's checkpoints, its
run folder's text files and the image folders' cache go through. A process killed or stopped while
it writes leaves the file as it was, and a stopped write leaves nothing behind."""

import multiprocessing
import os
import time
from pathlib import Path

import pytest
import torch

import vit.cache
from vit import storage
from vit.checkpoint import AtomicCheckpointIO

SIZE = 8 * 2**20  # large enough that a kill lands mid-write


def rewrite(path: Path) -> None:
    """`path` rewritten forever, each version SIZE bytes of one value."""
    for i in range(10**6):
        storage.write_bytes(path, bytes([i % 256]) * SIZE)


def test_a_file_rewritten_and_killed_at_any_moment_is_one_version_whole(tmp_path):
    path = tmp_path / "runs" / "file"
    for delay in (0.0, 0.01, 0.03, 0.07, 0.15):
        process = multiprocessing.get_context("fork").Process(target=rewrite, args=(path,))
        process.start()
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(delay)
        process.kill()  # SIGKILL
        process.join()
        data = path.read_bytes()
        assert len(data) == SIZE and data.count(data[:1]) == SIZE, f"torn after {delay} s"


class Stopped(KeyboardInterrupt):
    """Ctrl-C, as it lands in the middle of a write."""


def half_then_stop(obj, f) -> None:
    Path(f).write_bytes(b"half a file")
    raise Stopped


def test_a_write_stopped_midway_leaves_the_old_file_and_nothing_beside_it(tmp_path):
    path = tmp_path / "file"
    path.write_bytes(b"old")
    with pytest.raises(Stopped), storage.atomic_file(path) as temporary:
        half_then_stop(None, temporary)
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["file"]


def test_a_cache_write_stopped_by_ctrl_c_leaves_no_partial_file(tmp_path, monkeypatch):
    """The first decode of a large folder writes a cache of hundreds of MB; Ctrl-C then must not
    leave a partial copy of it in the data folder's .vit-cache."""
    monkeypatch.setattr(torch, "save", half_then_stop)
    with pytest.raises(Stopped):
        vit.cache.save_cache(tmp_path, "train.pt", {"signature": "x"})
    assert os.listdir(tmp_path / ".vit-cache") == []


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_a_checkpoint_is_made_with_the_mode_of_the_files_beside_it(tmp_path, umask):
    """Not readable by its owner alone: a run folder shared with a group (umask 002) shares its
    checkpoints too."""
    old = os.umask(umask)
    try:
        (tmp_path / "metrics.csv").write_text("step\n")
        AtomicCheckpointIO().save_checkpoint({"step": torch.zeros(1)}, tmp_path / "last.ckpt")
    finally:
        os.umask(old)

    def mode(name: str) -> int:
        return (tmp_path / name).stat().st_mode & 0o777

    assert mode("last.ckpt") == mode("metrics.csv") == 0o666 & ~umask
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["step"].shape == (1,)
