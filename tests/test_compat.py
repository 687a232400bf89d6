"""Checkpoints and export folders written before the ViTConfig layout (tests/fixtures/compat, made
by its make_fixtures.py with the code of the commit that added them) load in every command, with
the logits they had then."""

import importlib
import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.helpers import ROOT
from vit import compat, load_pretrained
from vit.checkpoint import load_model, read_checkpoint
from vit.commands import attention as attention_command
from vit.commands import eval as eval_command
from vit.commands import export as export_command
from vit.commands.train import run
from vit.export import read_folder

FIXTURES = ROOT / "tests" / "fixtures" / "compat"
CASES = ("two_circles", "conv_stem", "registers")
EXPECTED = load_file(FIXTURES / "logits.safetensors")
IMAGES = EXPECTED["images"]

# The model options of each fixture as the command line gives them today.
OPTIONS = {
    "two_circles": ["--model.vit.preset", "micro"],
    "conv_stem": [
        "--model.vit.preset", "micro", "--model.vit.mlp_ratio", "2.0", "--model.vit.patch_size", "8",
        "--model.vit.patch_norm", "true", "--model.vit.init", "torch", "--model.vit.pool", "mean",
        "--model.vit.conv_stem", "[4, 8, 16]", "--model.vit.locality_attention", "true",
    ],
    "registers": [
        "--model.vit.preset", "micro", "--model.vit.pool", "cls", "--model.vit.num_registers", "2",
        "--model.vit.layer_scale", "0.1", "--model.vit.drop_path", "0.1",
    ],
}  # fmt: skip


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(IMAGES)


@pytest.mark.parametrize("case", CASES)
def test_an_old_checkpoint_gives_its_logits(case):
    model, preparation = load_model(FIXTURES / f"{case}.ckpt")
    torch.testing.assert_close(logits(model), EXPECTED[f"{case}.logits"], atol=1e-6, rtol=0)
    assert preparation.classes[0] == "horizontal -"


def test_an_old_export_folder_gives_its_logits():
    expected = EXPECTED["two_circles.logits"]
    torch.testing.assert_close(logits(load_pretrained(str(FIXTURES / "export_two_circles"))), expected)
    model, preparation = read_folder(FIXTURES / "export_two_circles")
    torch.testing.assert_close(logits(model), expected, atol=1e-6, rtol=0)
    assert preparation.classes[2] == "vertical |"


@pytest.mark.parametrize("case", CASES)
def test_vit_export_of_an_old_checkpoint_gives_its_logits(case, tmp_path):
    export_command.main(["--ckpt", FIXTURES / f"{case}.ckpt", "--out", tmp_path / case])
    model = load_pretrained(str(tmp_path / case))
    torch.testing.assert_close(logits(model), EXPECTED[f"{case}.logits"], atol=1e-6, rtol=0)


@pytest.mark.parametrize("case", CASES)
def test_vit_eval_and_vit_attention_read_an_old_checkpoint(case, tmp_path):
    ckpt = FIXTURES / f"{case}.ckpt"
    eval_command.main(["--ckpt", ckpt, "--out", tmp_path / "eval"])
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert 0 <= metrics["top1"] <= 1
    for method in ("cls", "rollout", "grad-rollout"):
        out = tmp_path / method
        attention_command.main(["--ckpt", ckpt, "--out", out, "--num_images", "2", "--method", method])
        assert list(out.glob("*.png")), method


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_vit_train_resumes_an_old_checkpoint(case, tmp_path):
    ckpt = FIXTURES / f"{case}.ckpt"
    assert read_checkpoint(ckpt)["global_step"] == 3
    fixture = json.loads((FIXTURES / "fixtures.json").read_text())["cases"][case]
    data = [a for a in fixture[: fixture.index("--trainer.max_epochs")] if a != "configs/two_circles.yaml"]
    args = ["fit", "--config", str(ROOT / "configs/two_circles.yaml"), *data[1:], *OPTIONS[case]]
    args += ["--trainer.max_epochs", "3", "--trainer.max_steps", "5", "--ckpt_path", str(ckpt)]
    args += ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    args += ["--trainer.logger.init_args.save_dir", str(tmp_path)]
    cli = run(args)
    assert cli.trainer.global_step == 5  # two steps after the three of the fixture
    (last,) = Path(tmp_path).glob("*/*/checkpoints/last.ckpt")
    assert read_checkpoint(last)["global_step"] == 5


def test_a_checkpoint_whose_data_module_had_policy_groups_builds_it(trained_checkpoint, tmp_path):
    """Image data modules' checkpoints recorded `policy_groups` (a policy drew one operation per
    group of the batch) until each image drew its own: the option is dropped when read."""
    from tests.helpers import make_folders
    from vit.checkpoint import load_checkpoint
    from vit.datamodules import ImageFolders

    ckpt = torch.load(trained_checkpoint, weights_only=True)
    root = make_folders(tmp_path / "images", classes=("ant", "bee", "cat", "dog"))
    ckpt["datamodule_hyper_parameters"] = {
        "_class_path": "vit.datamodules.ImageFolders", "root": str(root), "image_size": 32, "channels": 1,
        "classes": ["ant", "bee", "cat", "dog"], "policy": "trivial", "policy_groups": 16,
    }  # fmt: skip
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    with pytest.raises(TypeError, match="policy_groups"):
        ImageFolders(**{k: v for k, v in ckpt["datamodule_hyper_parameters"].items() if k != "_class_path"})
    _, data = load_checkpoint(old)
    assert isinstance(data, ImageFolders) and data.policy is not None


@pytest.mark.slow
def test_a_saved_config_naming_vit_callbacks_evidence_mass_trains_with_it(tmp_path):
    """EvidenceMass lived in vit.callbacks until it moved into vit.interpret: a run's saved
    config.yaml (and configs/two_circles.yaml then) names it there, and still builds it; so does
    a command line naming AttentionMaps where it lived next (vit.interpret.callbacks)."""
    from vit.interpret.watching import AttentionMaps, EvidenceMass

    config = FIXTURES / "two_circles_config.yaml"
    assert "class_path: vit.callbacks.EvidenceMass" in config.read_text()
    args = ["fit", "--config", str(config), "--data.init_args.num_train", "64"]
    args += ["--data.init_args.num_val", "64", "--data.init_args.num_test", "64"]
    args += ["--data.init_args.batch_size", "64", "--trainer.max_epochs", "1"]
    args += ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    args += ["--trainer.logger.init_args.save_dir", str(tmp_path)]
    cli = run([*args, "--trainer.callbacks+=vit.interpret.callbacks.AttentionMaps"])
    assert [c for c in cli.trainer.callbacks if isinstance(c, EvidenceMass)]
    assert [c for c in cli.trainer.callbacks if isinstance(c, AttentionMaps)]
    assert "val/evidence_mass_rollout" in cli.trainer.callback_metrics


def test_every_moved_class_is_found_where_it_lives_now_and_old_paths_are_rewritten():
    for new in compat.MOVED_CLASSES.values():
        module, name = new.rsplit(".", 1)
        assert isinstance(getattr(importlib.import_module(module), name), type), new
    config = yaml.safe_load((FIXTURES / "two_circles_config_v2_interpret_callbacks.yaml").read_text())
    paths = [c["class_path"] for c in compat.moved_class_paths(config)["trainer"]["callbacks"]]
    assert paths == ["vit.interpret.watching.EvidenceMass", "vit.interpret.watching.AttentionMaps"]
    old, new = "vit.interpret.callbacks.AttentionMaps", "vit.interpret.watching.AttentionMaps"
    args = [f"--trainer.callbacks+={old}", f"{old}X", f"my.{old}"]  # only a whole class path
    assert compat.moved_class_args(args) == [f"--trainer.callbacks+={new}", *args[1:]]
