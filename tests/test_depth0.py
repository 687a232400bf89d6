"""Depth 0, the control without attention: the network without its blocks computes what it says,
the options only attention reads are refused, and every tool that shows attention refuses it in
one line (tests/test_cli.py trains, evaluates and exports one through the commands)."""

import re

import pytest
import torch
import torch.nn.functional as F
from helpers import command_error, save_as_vit_train, write_image

from vit import TwoCircles, ViTClassifier, ViTConfig
from vit.commands.attention import main as attention_main
from vit.errors import UsageError
from vit.interpret import activation_patching, head_analysis
from vit.interpret.explore import explore
from vit.interpret.hooks import record_attention, recorders
from vit.interpret.maps import MapSpec, attention_weights, explain
from vit.interpret.score import score
from vit.model import ViT

NO_ATTENTION = "this ViT has depth 0 (no transformer blocks): it has no attention to show"


def control(**options) -> ViT:
    """A depth-0 ViT with a conv stem, learned positions and a class token it never reads."""
    return ViT(
        ViTConfig(
            preset="micro",
            depth=0,
            pool="mean",
            patch_size=4,
            conv_stem=[6, 5],
            conv_stem_strides=[1, 2],
            image_size=(8, 12),
            init="timm",
            **options,
        )  # fmt: skip
    ).eval()


@pytest.mark.parametrize("fc_norm", [False, True])
def test_depth_0_is_the_head_of_the_normed_mean_of_embedded_patches(fc_norm):
    """head(mean over patches of norm(patch_embed(stem(x)) + pos)), or with fc_norm the norm after
    the mean; the patch embedding computed here as a convolution of kernel and stride the token
    patch, from the projection's weights read in the (p1 p2 c) order the model flattens patches in."""
    torch.manual_seed(0)
    model = control(fc_norm=fc_norm)
    norm = model.fc_norm if fc_norm else model.norm
    with torch.no_grad():  # norm weights other than the initial ones, so that using them shows
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    images = torch.rand(3, 3, 8, 12)
    features = model.stem(images)  # (B, 5, 4, 6): the stem halves the image
    proj, token_patch = model.patch_embed.proj, 2  # the patch's 4 pixels: 2 of the stem's map
    kernel = proj.weight.reshape(-1, token_patch, token_patch, 5).permute(0, 3, 1, 2)  # (dim, c, p1, p2)
    tokens = F.conv2d(features, kernel, proj.bias, stride=token_patch).flatten(2).transpose(1, 2)
    tokens = tokens + model.pos_embed[:, 1:]  # the class token's row left out: nothing reads it
    if fc_norm:
        pooled = F.layer_norm(tokens.mean(1), (32,), norm.weight, norm.bias, eps=1e-5)
    else:
        pooled = F.layer_norm(tokens, (32,), norm.weight, norm.bias, eps=1e-5).mean(1)
    expected = pooled @ model.head.weight.T + model.head.bias
    with torch.no_grad():
        torch.testing.assert_close(model(images), expected)
        model.cls_token.add_(10.0)  # the class token takes no part
        torch.testing.assert_close(model(images), expected)
    assert len(model.blocks) == 0 and tokens.shape == (3, 6, 32)


def test_depth_0_ignores_the_blocks_options_and_trains_every_parameter_it_reads():
    """What shapes blocks (heads that do not divide the width, LSA, LayerScale, drop_path) is
    ignored; gradients reach every parameter but the unread class token and the positions' row."""
    model = control(heads=3, locality_attention=True, layer_scale=0.1, drop_path=0.1).train()
    model(torch.rand(2, 3, 8, 12)).sum().backward()
    untouched = {name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum()}
    assert untouched == {"cls_token"}
    assert model.pos_embed.grad[:, 0].abs().sum() == 0 and model.pos_embed.grad[:, 1:].abs().sum() > 0


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(pool="cls"), "depth 0 needs pool='mean': without blocks the class token never sees"),
        (dict(distilled=True), "depth 0 takes no distillation token"),
        (dict(num_registers=4), "depth 0 takes no registers: they only take part in attention"),
        (dict(rel_pos_bias=True), "depth 0 takes no rel_pos_bias: it only biases attention"),
        (dict(attn_window=1), "depth 0 takes no attn_window: it only limits attention"),
        (dict(depth=-1), "depth=-1 must be at least 0"),
    ],
)
def test_depth_0_refuses_what_only_attention_reads(options, message):
    config = ViTConfig(preset="micro", **{"depth": 0, "pool": "mean", **options})
    with pytest.raises(UsageError, match=re.escape(message)):
        config.resolve()


def test_the_looking_tools_refuse_a_depth_0_model_in_one_line():
    model, images = control(), torch.rand(2, 3, 8, 12)
    calls = {
        "attention_weights": lambda: attention_weights(model, images),
        "explain": lambda: explain(model, images, MapSpec("rollout")),
        "explore": lambda: explore(model, images),
        "score": lambda: score(model, images),
        "heads": lambda: head_analysis.analyse(model, images),
        "patching": lambda: activation_patching.analyse(model, images, images),
        "recorders": lambda: recorders(model, "residual"),
        "record_attention": lambda: record_attention(model, [], lambda w: w).__enter__(),
    }
    for name, call in calls.items():
        with pytest.raises(UsageError) as error:
            call()
        assert str(error.value) == NO_ATTENTION, name


@pytest.fixture(scope="module")
def depth_0_checkpoint(tmp_path_factory):
    """A depth-0 model of two circles saved as vit-train saves it (conftest's `trained_checkpoint`)."""
    data = TwoCircles(num_train=64, num_val=16, num_test=16)
    vit = ViTConfig(preset="micro", patch_size=8, depth=0, pool="mean")
    model = ViTClassifier(num_classes=4, image_size=32, in_channels=1, vit=vit)
    path = tmp_path_factory.mktemp("depth0") / "depth0.ckpt"
    save_as_vit_train(model, data, path)
    return path


@pytest.mark.parametrize(
    "command",
    [[], ["--html"], ["--plots", "--method", "rollout"], ["score"], ["heads"], ["patch"], ["images"]],
    ids=lambda c: " ".join(c) or "maps",
)
def test_vit_attention_and_its_subcommands_refuse_a_depth_0_checkpoint(
    depth_0_checkpoint, tmp_path, capsys, command
):
    """Test images of the checkpoint's data module, or image files (`--images`): exit status 2, one
    line, no output folder."""
    out = tmp_path / "out"
    if command == ["images"]:
        write_image(tmp_path / "a.png", 128, "L", (32, 32))
        command = ["--images", tmp_path / "a.png"]
    subcommand = command[:1] if command[:1] in (["score"], ["heads"], ["patch"]) else []
    args = [*subcommand, "--ckpt", depth_0_checkpoint, "--out", out, *command[len(subcommand) :]]
    status, message = command_error(attention_main, [*args, "--num_images", "4"], capsys)
    assert (status, message) == (2, f"error: {NO_ATTENTION}")
    assert not out.exists()
