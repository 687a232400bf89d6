"""A data module of the user's own: vit-train fits with it (`--data owndm.Circles`), and vit-eval,
vit-attention and vit-attention score rebuild it when the user names it (`--datamodule
owndm.Circles`), never because a checkpoint names it: a file must not decide what code runs."""

import json
import sys

import pytest
import torch
from helpers import command_error, tiny_args

from vit.checkpoint import load_checkpoint, load_datamodule, load_model
from vit.commands import attention, eval, train
from vit.errors import UsageError

OWN = '''
from vit.two_circles import TwoCircles


class Circles(TwoCircles):
    """Two circles under a class path the registry of vit.checkpoint does not hold."""
'''


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """A checkpoint that vit-train wrote for a micro ViT fitted on `owndm.Circles`, a module in a
    folder on sys.path while this module's tests run."""
    folder = tmp_path_factory.mktemp("own")
    (folder / "owndm.py").write_text(OWN)
    runs = folder / "runs"
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(folder))
        train.main(["fit", *tiny_args(runs, "--data", "owndm.Circles")])
        yield runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    sys.modules.pop("owndm", None)


@pytest.mark.slow
def test_vit_train_records_the_class_path_the_flag_takes(own):
    recorded = torch.load(own, weights_only=True)["datamodule_hyper_parameters"]
    assert recorded["_class_path"] == "owndm.Circles" and recorded["num_test"] == 128


@pytest.mark.slow
def test_the_commands_rebuild_the_data_module_the_user_names(own, tmp_path, capsys):
    eval.main(["--ckpt", own, "--datamodule", "owndm.Circles", "--out", tmp_path / "eval"])
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["data_module"] == "Circles" and metrics["num_images"] == 128
    eval.main(
        ["--ckpt", own, "--datamodule", "owndm.Circles", "--data", "num_test=40", "--out", tmp_path / "40"]
    )
    metrics = json.loads((tmp_path / "40" / "metrics.json").read_text())
    assert metrics["data"]["num_test"] == 40 and metrics["num_images"] == 40  # the recorded, overridden

    attention.main(
        ["--ckpt", own, "--datamodule", "owndm.Circles", "--num_images", "2", "--layer", "-1",
         "--data", "num_test=5", "--out", tmp_path / "maps"]
    )  # fmt: skip
    # 2 of the 5 test images that --data num_test=5 leaves: the first and the last
    assert {p.name for p in (tmp_path / "maps").iterdir()} == {
        "cls.png",
        "cls_000_test0.png",
        "cls_001_test4.png",
    }

    attention.main(
        ["score", "--ckpt", own, "--datamodule", "owndm.Circles", "--num_images", "8", "--no-sanity",
         "--methods", "rollout", "evidence", "--out", tmp_path / "scores"]
    )  # fmt: skip
    scores = json.loads((tmp_path / "scores" / "scores.json").read_text())
    assert scores["settings"]["images"] == "8 test images of Circles"
    assert "relevance_mass" in scores["figures"]["rollout"]  # the circles' evidence, from the data module

    from owndm import Circles

    for given in ("owndm.Circles", Circles):  # in Python: the class path or the class itself
        _, datamodule = load_checkpoint(own, datamodule_class=given)
        assert type(datamodule) is Circles and datamodule.hparams.num_test == 128
        datamodule = load_datamodule(own, cls=given, data={"num_test": 64})  # the data module alone
        assert type(datamodule) is Circles and datamodule.hparams.num_test == 64


COMMANDS = {
    "vit-eval": (eval.main, []),
    "vit-attention": (attention.main, []),
    "vit-attention score": (attention.main, ["score"]),
}


@pytest.mark.parametrize("command", COMMANDS)
def test_without_the_flag_a_command_names_it_in_one_line(own, tmp_path, capsys, command):
    main, first = COMMANDS[command]
    status, message = command_error(main, [*first, "--ckpt", own, "--out", tmp_path / "out"], capsys)
    assert status == 2
    unknown = f"{own} names an unknown data module 'owndm.Circles'"
    assert message == f"error: {unknown}: pass --datamodule owndm.Circles to import it"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "options, message",
    [
        (["--datamodule", "Circles"], "--datamodule 'Circles' is not MODULE.CLASS (such as mydm.Pets)"),
        (
            ["--datamodule", "nowhere.Circles"],
            "--datamodule nowhere.Circles: cannot import nowhere (No module",
        ),
        (["--datamodule", "owndm.Squares"], "--datamodule owndm.Squares: owndm has no Squares"),
        (["--datamodule", "json.dumps"], "--datamodule json.dumps: not a LightningDataModule class"),
        (["--datamodule", "plain.Plain"], "Plain is not a vit.datamodules.InMemoryDataModule: the commands"),
        (["--datamodule", "owndm.Circles", "--data", "colour=red"], "Circles has no option colour; it has"),
    ],
)
def test_a_bad_datamodule_is_one_line_and_writes_nothing(
    own, tmp_path, monkeypatch, capsys, options, message
):
    (tmp_path / "plain.py").write_text(
        "import lightning as L\n\nclass Plain(L.LightningDataModule):\n    def __init__(self, **recorded):\n"
        "        super().__init__()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for main, first in COMMANDS.values():
        status, error = command_error(
            main, [*first, "--ckpt", own, *options, "--out", tmp_path / "out"], capsys
        )
        assert status == 2 and message in error, error
        assert not (tmp_path / "out").exists()
    sys.modules.pop("plain", None)


def test_the_flags_go_with_a_checkpoint_and_its_test_images(tmp_path, capsys):
    picture = tmp_path / "a.png"
    picture.write_bytes(b"")
    images = {"vit-eval": ["--data", f"root={tmp_path}"]}  # vit-eval measures a --model on folders
    for command, (main, first) in COMMANDS.items():
        model = [*first, "--model", "timm:vit_tiny_patch16_224", "--datamodule", "owndm.Circles"]
        assert command_error(main, [*model, *images.get(command, ["--images", picture])], capsys) == (
            2, "error: --datamodule goes with --ckpt (a --model has no data module)"
        )  # fmt: skip
    for main, first in list(COMMANDS.values())[1:]:  # vit-eval reads no image files
        args = [*first, "--ckpt", "x.ckpt", "--images", picture, "--data", "num_test=5"]
        assert command_error(main, args, capsys) == (
            2, "error: --data changes the data module that gives test images: not with --images"
        )  # fmt: skip


PLANTED = """
from pathlib import Path

Path({marker!r}).write_text("imported")

from vit.two_circles import TwoCircles


class Circles(TwoCircles):
    pass
"""


def test_a_checkpoint_never_imports_the_module_it_names(trained_checkpoint, tmp_path, monkeypatch, capsys):
    """A module whose import writes a file, importable, and named by a checkpoint: reading the
    checkpoint and running every command on it without --datamodule leave the file unwritten;
    naming the module with --datamodule writes it (so the import would have shown)."""
    marker = tmp_path / "imported.txt"
    (tmp_path / "planted.py").write_text(PLANTED.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    ckpt = torch.load(trained_checkpoint, weights_only=True)
    ckpt["datamodule_hyper_parameters"]["_class_path"] = "planted.Circles"
    torch.save(ckpt, tmp_path / "planted.ckpt")
    del ckpt["preparation"]  # an older checkpoint: its data module's class says how to prepare images
    torch.save(ckpt, tmp_path / "old.ckpt")
    picture = tmp_path / "a.png"
    from PIL import Image

    Image.new("L", (32, 32), 200).save(picture)

    hint = "names an unknown data module 'planted.Circles': pass --datamodule planted.Circles to import it"
    for path in (tmp_path / "planted.ckpt", tmp_path / "old.ckpt"):
        with pytest.raises(UsageError, match=hint):
            load_checkpoint(path)
    with pytest.raises(UsageError, match=hint):
        load_model(tmp_path / "old.ckpt")
    for main, first in COMMANDS.values():
        status, message = command_error(main, [*first, "--ckpt", tmp_path / "planted.ckpt"], capsys)
        assert status == 2 and hint in message
    status, message = command_error(
        attention.main,
        ["--ckpt", tmp_path / "old.ckpt", "--images", picture, "--out", tmp_path / "o"],
        capsys,
    )
    assert status == 2 and hint in message
    assert not marker.exists() and "planted" not in sys.modules

    try:
        attention.main(
            ["--ckpt", tmp_path / "old.ckpt", "--datamodule", "planted.Circles", "--images", picture,
             "--layer", "-1", "--out", tmp_path / "maps"]
        )  # fmt: skip
        assert marker.read_text() == "imported"  # named, it is imported: its preparation draws the file
        assert {p.name for p in (tmp_path / "maps").iterdir()} == {"cls.png", "cls_000_a.png"}
    finally:
        sys.modules.pop("planted", None)
