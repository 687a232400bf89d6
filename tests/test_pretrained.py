"""`vit.load_pretrained` builds, from timm's models, a `ViT` whose outputs equal the source's.

No network: the source models are timm's own, built with random weights and then perturbed away
from timm's initialisation (which zeroes biases and starts tokens near zero, and would hide a
wrong mapping), saved to a file and loaded from it."""

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed

from vit import load_pretrained
from vit.errors import UsageError
from vit.model import resample_pos_embed


def perturbed_weights(model: torch.nn.Module, path, seed: int = 0):
    """Every parameter of `model` plus noise, saved to `path` (safetensors); the model keeps them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def source_output(model, images):
    """What timm computes for images in [0, 1]: its model on the normalised images."""
    cfg = model.pretrained_cfg
    mean, std = (torch.tensor(cfg[k])[:, None, None] for k in ("mean", "std"))
    with torch.no_grad():
        return model.eval()((images - mean) / std)


@pytest.mark.parametrize(
    "name",
    [
        "vit_tiny_patch16_224",  # a class token and an ImageNet head
        "vit_small_patch16_224.dino",  # no head: the normed class token
        "deit_tiny_distilled_patch16_224",  # a distillation token and its head, averaged
        "vit_small_patch14_dinov2",  # LayerScale, 518 px, no head
        "vit_small_patch14_reg4_dinov2",  # 4 registers, positions on the patches only
        "vit_little_patch16_reg4_gap_256",  # no class token, registers, average pooling, fc_norm
        "vit_medium_patch16_gap_256",  # no class token, average pooling, final norm before it
    ],
)
def test_timm_models_give_the_same_outputs(tmp_path, name):
    source = timm.create_model(name, pretrained=False)
    weights = perturbed_weights(source, tmp_path / "weights.safetensors")
    ours = load_pretrained(f"timm:{name}", weights=weights)
    size = source.patch_embed.img_size
    images = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(1))
    expected = source_output(source, images)
    with torch.no_grad():
        got = ours(images)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= 1e-4


def test_a_pth_state_dict_loads_too_and_the_head_is_read_from_the_file(tmp_path):
    source = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=7)
    perturbed_weights(source, tmp_path / "unused.safetensors")
    torch.save({"model": source.state_dict()}, tmp_path / "weights.pth")
    ours = load_pretrained("timm:vit_tiny_patch16_224", weights=tmp_path / "weights.pth")
    images = torch.rand(3, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = ours(images)
    assert got.shape == (3, 7) and (got - source_output(source, images)).abs().max() <= 1e-4
    # images come in [0, 1]: the normalisation is the model's, in buffers outside the state dict
    assert ours.mean.flatten().tolist() == [0.5] * 3 and "mean" not in ours.state_dict()


@pytest.mark.parametrize(
    "name, feature",
    [
        ("vit_base_patch16_siglip_224", "has attention pooling"),
        ("vit_base_patch16_rope_224", "is a Eva, not a VisionTransformer"),
    ],
)
def test_features_vit_cannot_express_are_refused_by_name(tmp_path, name, feature):
    weights = tmp_path / "w.safetensors"
    save_file(
        {k: v.contiguous() for k, v in timm.create_model(name, pretrained=False).state_dict().items()},
        str(weights),
    )
    with pytest.raises(UsageError, match=f"timm:{name} {feature}"):
        load_pretrained(f"timm:{name}", weights=weights)


@pytest.mark.parametrize("prefix", [0, 1, 5])
@pytest.mark.parametrize("new_grid", [(20, 20), (12, 18)])
def test_position_embeddings_are_resampled_as_timm_does(prefix, new_grid):
    table = torch.randn(1, prefix + 14 * 14, 32, generator=torch.Generator().manual_seed(0))
    expected = resample_abs_pos_embed(table, list(new_grid), (14, 14), num_prefix_tokens=prefix)
    got = resample_pos_embed(table, new_grid, (14, 14), prefix)
    assert got.shape == (1, prefix + new_grid[0] * new_grid[1], 32)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_a_model_takes_another_image_size(tmp_path):
    """set_image_size resamples the positions: the model then equals timm's built for that size
    with the same weights (timm resamples them when it loads them into another size)."""
    source = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False)
    weights = perturbed_weights(source, tmp_path / "w.safetensors")
    ours = load_pretrained("timm:vit_small_patch14_reg4_dinov2", weights=weights)
    ours.set_image_size((224, 280))
    other = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, img_size=(224, 280))
    state = dict(source.state_dict())
    state["pos_embed"] = resample_abs_pos_embed(state["pos_embed"], [16, 20], (37, 37), num_prefix_tokens=0)
    other.load_state_dict(state)
    images = torch.rand(2, 3, 224, 280, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (ours(images) - source_output(other, images)).abs().max() <= 1e-4


def test_bad_input_is_one_line(tmp_path):
    class Payload:
        def __reduce__(self):
            return (open, (str(tmp_path / "marker"), "w"))

    torch.save({"head.weight": Payload()}, tmp_path / "evil.pth")
    (tmp_path / "notes.safetensors").write_text("not weights")
    small = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3)
    save_file(
        {k: v for k, v in small.state_dict().items() if "blocks.11" not in k},
        str(tmp_path / "cut.safetensors"),
    )
    for source, weights, error, message in (
        ("timm:no_such_vit", None, UsageError, "timm has no model 'no_such_vit'"),
        ("hub:vit", None, UsageError, "unknown model source 'hub:vit'"),
        ("timm:vit_tiny_patch16_224", tmp_path / "evil.pth", ValueError, "refusing"),
        ("timm:vit_tiny_patch16_224", tmp_path / "notes.safetensors", ValueError, "is not a weights file"),
        ("timm:vit_tiny_patch16_224", tmp_path / "cut.safetensors", ValueError, "Missing key.*blocks.11"),
        ("timm:vit_tiny_patch16_224", tmp_path / "missing.pth", FileNotFoundError, "weights not found"),
    ):
        with pytest.raises(error, match=message) as caught:
            load_pretrained(source, weights=weights)
        assert "\n" not in str(caught.value)
    assert not (tmp_path / "marker").exists()
