"""`vit.load_pretrained` builds, from timm's models, a `ViT` whose outputs equal the source's.

No network: the source models are timm's own, built with random weights and then perturbed away
from timm's initialisation (which zeroes biases and starts tokens near zero, and would hide a
wrong mapping), saved to a file and loaded from it."""

import pytest
import timm
import torch
from safetensors.torch import save_file

from vit import load_pretrained
from vit.errors import UsageError


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
    ],
)
def test_timm_models_give_the_same_outputs(tmp_path, name):
    source = timm.create_model(name, pretrained=False)
    weights = perturbed_weights(source, tmp_path / "weights.safetensors")
    ours = load_pretrained(f"timm:{name}", weights=weights)
    images = torch.rand(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
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
        ("vit_small_patch14_reg4_dinov2", "register tokens"),
        ("deit_tiny_distilled_patch16_224", "a distillation token"),
        ("vit_small_patch14_dinov2", "LayerScale"),
    ],
)
def test_features_vit_cannot_express_are_refused_by_name(tmp_path, name, feature):
    weights = perturbed_weights(timm.create_model(name, pretrained=False), tmp_path / "w.safetensors")
    with pytest.raises(UsageError, match=f"timm:{name} has .*{feature}"):
        load_pretrained(f"timm:{name}", weights=weights)


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
