"""Every command reads checkpoints the same safe way: a missing, truncated or foreign file, or one
that would run code when unpickled, is one line naming the file, exit status 1, nothing written,
and none of its code runs."""

import pytest
import torch
from helpers import command_error, tiny_args
from PIL import Image

from vit.commands import attention, eval, train


@pytest.fixture(scope="module")
def bad_checkpoints(trained_checkpoint, tmp_path_factory):
    """A checkpoint cut after 20,000 bytes, one whose unpickling would create a marker file, a
    file that is no checkpoint at all, and an image to give the commands."""
    folder = tmp_path_factory.mktemp("bad")
    truncated = folder / "truncated.ckpt"
    data = trained_checkpoint.read_bytes()
    assert len(data) > 20_000
    truncated.write_bytes(data[:20_000])

    class Payload:
        def __reduce__(self):
            return (open, (str(folder / "marker"), "w"))  # unpickling it creates the marker file

    evil = folder / "evil.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {}, "payload": Payload()}, evil)
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
