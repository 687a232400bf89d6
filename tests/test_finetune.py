"""Fine-tuning a pretrained ViT from the CLI: `vit-train fit --model.pretrained SOURCE`."""

import math
import shutil

import pytest
import torch
from helpers import command_error, tiny_args
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, SequentialLR

from vit.checkpoint import load_model
from vit.classifier import CNNClassifier
from vit.commands import train as cli
from vit.errors import UsageError
from vit.export import save_folder
from vit.model import ViT, resample_pos_embed
from vit.optim import adamw, warmup_cosine
from vit.preparation import Preparation
from vit.pretrained import for_finetuning


@pytest.fixture
def source(tmp_path):
    """A small ViT of 5 classes for 16x16 grayscale images, with its normalisation, exported."""
    torch.manual_seed(0)
    model = ViT(
        num_classes=5, image_size=16, patch_size=8, in_channels=1, dim=32, depth=3, heads=2,
        num_registers=2, mean=(0.5,), std=(0.25,),
    ).eval()  # fmt: skip
    save_folder(model, Preparation(1, 16, classes=[f"c{i}" for i in range(5)]), tmp_path / "source")
    return model, tmp_path / "source"


def test_a_pretrained_model_gets_a_new_head_and_resampled_positions(source):
    model, folder = source
    tuned = for_finetuning(str(folder), None, num_classes=2, image_size=32, in_channels=1, drop_path=0.1)
    assert tuned.head.out_features == 2 and tuned.image_size == (32, 32)
    assert tuned.config.drop_path == 0.1 and tuned.config.num_registers == 2
    expected = resample_pos_embed(model.pos_embed.data, (4, 4), (2, 2), model.pos_embed_prefix)
    torch.testing.assert_close(tuned.pos_embed.data, expected)
    for name, value in model.state_dict().items():  # everything else is the source's
        if not name.startswith(("head.", "pos_embed")):
            assert torch.equal(tuned.state_dict()[name], value), name
    assert torch.equal(tuned.mean, model.mean)  # images still come in [0, 1]
    with pytest.raises(ValueError, match="takes 1-channel images and the data has 3 channels"):
        for_finetuning(str(folder), None, num_classes=2, image_size=32, in_channels=3)


def test_layer_decay_scales_the_learning_rate_by_depth(source):
    model, _ = source
    optimizer = adamw(model, lr=1e-3, weight_decay=0.05, layer_decay=0.5)
    lr_of = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    assert lr_of[id(model.head.weight)] == 1e-3 and lr_of[id(model.norm.weight)] == 1e-3
    assert lr_of[id(model.blocks[2].attn.qkv.weight)] == 1e-3 * 0.5
    assert lr_of[id(model.blocks[0].attn.qkv.weight)] == 1e-3 * 0.5**3
    for embedding in (model.pos_embed, model.reg_token, model.cls_token, model.patch_embed.proj.weight):
        assert lr_of[id(embedding)] == 1e-3 * 0.5**4
    decays = {id(p): group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}
    assert decays[id(model.blocks[0].attn.qkv.weight)] == 0.05 and decays[id(model.pos_embed)] == 0.0
    assert len(lr_of) == len(list(model.parameters()))
    with pytest.raises(UsageError, match="layer_decay needs a ViT"):
        CNNClassifier(layer_decay=0.7)


def test_the_schedule_is_the_warm_up_and_cosine_it_was():
    """LambdaLR(warmup_cosine) gives the learning rates of the LinearLR + CosineAnnealingLR chain
    it replaced (which per-group rates of layer decay cannot use: its floor is absolute)."""
    total, warmup, lr, floor = 50, 5, 1e-3, 0.01
    rates = []
    for make in ("old", "new"):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
        if make == "old":
            cosine = CosineAnnealingLR(optimizer, T_max=total - warmup, eta_min=lr * floor)
            linear = LinearLR(optimizer, start_factor=1 / (warmup + 1), total_iters=warmup)
            scheduler = SequentialLR(optimizer, [linear, cosine], milestones=[warmup])
        else:
            scheduler = LambdaLR(
                optimizer, lambda s: warmup_cosine(s / total, warmup / total, floor, 1 / (warmup + 1))
            )
        steps = []
        for _ in range(total):
            steps.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        rates.append(steps)
    torch.testing.assert_close(torch.tensor(rates[1]), torch.tensor(rates[0]), rtol=1e-6, atol=1e-12)
    assert math.isclose(warmup_cosine(1.0, warmup / total, floor), floor)


@pytest.mark.slow
def test_fine_tuning_from_the_cli_writes_a_checkpoint_that_stands_alone(source, tmp_path, capsys):
    model, folder = source
    runs = tmp_path / "runs"
    options = ["--model.pretrained", str(folder), "--model.layer_decay", "0.7", "--trainer.max_epochs", "1"]
    cli.main(["fit", *tiny_args(runs, *options)])
    ckpt = runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    recorded = torch.load(ckpt, weights_only=True)["hyper_parameters"]
    assert recorded["pretrained"] == str(
        folder
    )  # two circles: 4 classes, 32x32, where the source had 5, 16x16
    assert recorded["architecture"]["num_classes"] == 4 and recorded["architecture"]["num_registers"] == 2
    shutil.rmtree(folder)  # the checkpoint holds the architecture: the source is not read again
    classifier, preparation = load_model(ckpt)
    assert classifier.model.image_size == (32, 32) and list(classifier.model.config.mean) == [0.5]
    assert classifier.model.blocks[0].attn.qkv.weight.shape == model.blocks[0].attn.qkv.weight.shape
    assert not torch.equal(
        classifier.model.blocks[2].mlp.fc1.weight, model.blocks[2].mlp.fc1.weight
    )  # trained

    args = ["fit", *tiny_args(runs, "--model.pretrained", str(folder))]
    status, line = command_error(cli.main, args, capsys)
    assert status == 2 and f"unknown model source '{folder}'" in line
    folder.mkdir()
    status, line = command_error(cli.main, args, capsys)
    assert status == 1 and f"{folder} holds no config.json written by vit-export" in line
    args = ["fit", *tiny_args(runs, "--model.weights", "w.safetensors")]
    status, line = command_error(cli.main, args, capsys)
    assert status == 2 and "weights goes with pretrained" in line


def test_a_run_saved_with_the_old_schedule_resumes_at_its_step():
    """Checkpoints written before the schedule was one LambdaLR hold a SequentialLR's state, which
    LambdaLR cannot load (KeyError: 'lr_lambdas'); converted, the rates go on as they would have."""
    from vit.compat import scheduler_state

    total, warmup, lr, floor, saved_at = 40, 4, 1e-3, 0.01, 13
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    cosine = CosineAnnealingLR(optimizer, T_max=total - warmup, eta_min=lr * floor)
    linear = LinearLR(optimizer, start_factor=1 / (warmup + 1), total_iters=warmup)
    old = SequentialLR(optimizer, [linear, cosine], milestones=[warmup])
    for _ in range(saved_at):
        optimizer.step()
        old.step()
    state = old.state_dict()
    expected = []
    for _ in range(total - saved_at):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        old.step()

    resumed = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    new = LambdaLR(resumed, lambda s: warmup_cosine(s / total, warmup / total, floor, 1 / (warmup + 1)))
    with pytest.raises(KeyError):
        new.load_state_dict(dict(state))
    new.load_state_dict(scheduler_state(dict(state)))
    resumed.param_groups[0]["lr"] = new.get_last_lr()[0]  # Lightning restores the optimizer's too
    got = []
    for _ in range(total - saved_at):
        got.append(resumed.param_groups[0]["lr"])
        resumed.step()
        new.step()
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-6, atol=1e-12)
