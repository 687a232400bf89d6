"""Every command reads checkpoints the same safe way: a missing, truncated or foreign file, or one
that would run code when unpickled, is one line naming the file, exit status 1, nothing written,
and none of its code runs."""

import tempfile
from pathlib import Path

import pytest
import torch
from helpers import UnsafePayload, command_error, start_training, tiny_args
from PIL import Image

from vit.commands import attention, eval, train
from vit.errors import UsageError


@pytest.fixture(scope="module")
def bad_checkpoints(trained_checkpoint, tmp_path_factory):
    """A checkpoint cut after 20,000 bytes, one whose unpickling would create a marker file, a
    file that is no checkpoint at all, and an image to give the commands."""
    folder = tmp_path_factory.mktemp("bad")
    truncated = folder / "truncated.ckpt"
    data = trained_checkpoint.read_bytes()
    assert len(data) > 20_000
    truncated.write_bytes(data[:20_000])

    evil = folder / "evil.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {}, "payload": UnsafePayload(folder / "marker")}, evil)
    text = folder / "notes.ckpt"
    text.write_text("not a checkpoint")
    picture = folder / "a.png"
    Image.new("L", (32, 32), 200).save(picture)
    return {"truncated": truncated, "evil": evil, "text": text, "picture": picture, "folder": folder}


COMMANDS = {
    "vit-eval": lambda ckpt, out, picture: (eval.main, ["--ckpt", ckpt, "--out", out]),
    "vit-eval predict": lambda ckpt, out, picture: (eval.main, ["predict", "--ckpt", ckpt, picture]),
    "vit-attention": lambda ckpt, out, picture: (attention.main, ["--ckpt", ckpt, "--out", out]),
    "vit-attention --images": lambda ckpt, out, picture: (
        attention.main, ["--ckpt", ckpt, "--images", picture, "--out", out]
    ),
    "vit-train test": lambda ckpt, out, picture: (
        train.main, ["test", *tiny_args(out), "--ckpt_path", ckpt]
    ),
    "vit-train fit": lambda ckpt, out, picture: (train.main, ["fit", *tiny_args(out), "--ckpt_path", ckpt]),
}  # fmt: skip
PROBLEMS = {
    "truncated": "is not a readable checkpoint (truncated or corrupt?",
    "evil": "it is not a plain-tensor checkpoint (Unsupported global: GLOBAL",
    "text": "is not a readable checkpoint",
}


@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_checkpoint_is_one_line_and_writes_nothing(
    bad_checkpoints, tmp_path, monkeypatch, capsys, command, problem
):
    monkeypatch.chdir(tmp_path)  # Lightning would write lightning_logs/ or config.yaml here
    ckpt, out = bad_checkpoints[problem], tmp_path / "out"
    main, args = COMMANDS[command](ckpt, out, bad_checkpoints["picture"])
    status, message = command_error(main, args, capsys)
    assert status == 1 and str(ckpt) in message and PROBLEMS[problem] in message, message
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert not (bad_checkpoints["folder"] / "marker").exists()


def test_a_truncated_last_checkpoint_is_one_line_when_fit_resumes_it(bad_checkpoints, tmp_path, capsys):
    """`fit --ckpt_path last` finds runs/<name>/*/checkpoints/last.ckpt itself: a file cut short
    (a run killed while saving) is refused before Lightning writes anything into that run."""
    runs = tmp_path / "runs"
    folder = runs / "tiny" / "version_0" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "last.ckpt").write_bytes(bad_checkpoints["truncated"].read_bytes())
    for version in ([], ["--trainer.logger.init_args.version", "0"]):  # newest, or the named run
        status, message = command_error(
            train.main, ["fit", *tiny_args(runs), *version, "--ckpt_path", "last"], capsys
        )
        assert status == 1 and f"{folder / 'last.ckpt'} is not a readable checkpoint" in message
        assert [p.name for p in (runs / "tiny" / "version_0").iterdir()] == ["checkpoints"]


def test_preparations_of_older_or_broken_checkpoints(trained, tmp_path):
    """A checkpoint without a preparation: from its data module's record (image folders from
    before class names were kept: numbered); a broken preparation: one line naming the file."""
    from vit.checkpoint import load_model

    model, _ = trained
    base = {"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}
    old_folders = {"_class_path": "vit.images.ImageFolders", "root": "gone", "image_size": 32, "channels": 1}
    torch.save({**base, "datamodule_hyper_parameters": old_folders}, tmp_path / "old.ckpt")
    _, preparation = load_model(tmp_path / "old.ckpt")
    assert preparation.classes == ("0", "1", "2", "3") and preparation.channels == 1
    torch.save({**base, "preparation": {"channels": 2, "size": [32, 32]}}, tmp_path / "broken.ckpt")
    with pytest.raises(ValueError, match="broken.ckpt does not say how to prepare images") as error:
        load_model(tmp_path / "broken.ckpt")
    assert not isinstance(error.value, UsageError)  # a bad file, not a bad option: exit status 1


@pytest.mark.slow
@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs a second filesystem (/dev/shm) for TMPDIR")
def test_a_run_killed_while_it_writes_leaves_last_ckpt_loadable(runs, tmp_path):
    """kill -9 at several moments of a run that rewrites last.ckpt after every step: each time,
    last.ckpt loads. The system's temporary folder is put on another filesystem (/dev/shm, as a
    tmpfs /tmp is on many machines), where a file written there and moved into place is copied,
    not renamed; a checkpoint must be written beside its target and renamed over it."""
    import time

    from vit.checkpoint import read_checkpoint

    # a checkpoint of about 40 MB (weights and AdamW's moments) written after every step
    args = tiny_args(runs, "--last_checkpoint.every_n_train_steps", "1", "--trainer.max_epochs", "1000",
                     "--model.vit.preset", "s", "--model.vit.depth", "2")  # fmt: skip
    shm = tempfile.mkdtemp(dir="/dev/shm")
    last = runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    for delay in (0.0, 0.05, 0.1, 0.2, 0.35, 0.5):
        process = start_training(
            ["fit", *args, "--trainer.logger.init_args.version", "version_0"], TMPDIR=shm
        )
        deadline = time.monotonic() + 120
        while not last.exists() and time.monotonic() < deadline and process.is_alive():
            time.sleep(0.01)
        time.sleep(delay)
        process.kill()  # SIGKILL
        process.join()
        assert last.exists(), "the run wrote no last.ckpt"
        checkpoint = read_checkpoint(last)  # one line (SystemExit) if truncated
        assert "state_dict" in checkpoint
        last.unlink()
