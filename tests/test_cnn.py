import pytest
import torch
from einops import rearrange

from vit import CNNClassifier
from vit.cnn import AirbenchCNN, BagCNN, ResNet, receptive_field_of


@pytest.mark.parametrize("field", [3, 7, 11])
@pytest.mark.parametrize("padding", ["circular", "zeros", "valid"])
def test_bag_cnn_sees_exactly_its_receptive_field(field, padding):
    torch.manual_seed(0)
    model = BagCNN(num_classes=4, in_channels=1, receptive_field=field, width=8, padding=padding).eval()
    assert receptive_field_of(model) == field
    x = torch.randn(1, 1, 32, 32, requires_grad=True)
    features = model.features(x)
    row, col = features.shape[-2] // 2, features.shape[-1] // 2
    features[0, :, row, col].sum().backward()
    seen = x.grad[0, 0].abs() > 0
    rows, cols = seen.nonzero().unbind(1)
    assert (rows.max() - rows.min() + 1, cols.max() - cols.min() + 1) == (field, field)


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_a_downsampling_cnn_sees_the_field_it_reports(depth):
    """Stride 2 in every other 3x3 layer: fields of 3, 7, 11, 19 pixels for 1-4 layers (2L + 1
    without the strides: 3, 5, 7, 9)."""
    torch.manual_seed(0)
    model = BagCNN(num_classes=4, depth=depth, downsample=True, width=8, padding="zeros", mlp_head=True)
    assert model.receptive_field == receptive_field_of(model) == [3, 7, 11, 19][depth - 1]
    x = torch.randn(1, 1, 64, 64, requires_grad=True)
    features = model.eval().features(x)
    features[0, :, features.shape[-2] // 2, features.shape[-1] // 2].sum().backward()
    rows, cols = (x.grad[0, 0].abs() > 0).nonzero().unbind(1)
    assert (rows.max() - rows.min() + 1, cols.max() - cols.min() + 1) == (model.receptive_field,) * 2
    assert isinstance(model.head[0], torch.nn.Linear) and model(x).shape == (1, 4)  # the MLP head


def test_circular_padding_is_translation_equivariant_and_zero_padding_is_not():
    torch.manual_seed(0)
    x = torch.randn(2, 1, 16, 16)
    shifted = torch.roll(x, shifts=(5, 3), dims=(2, 3))
    for padding, invariant in (("circular", True), ("zeros", False)):
        model = BagCNN(num_classes=4, in_channels=1, receptive_field=5, width=8, padding=padding).eval()
        same = torch.allclose(model(x), model(shifted), atol=1e-5)
        assert same == invariant, padding


def test_resnet_covers_the_image_and_trains():
    model = ResNet(num_classes=4, in_channels=1, widths=(8, 16, 32))
    assert receptive_field_of(model) >= 32
    out = model(torch.randn(3, 1, 32, 32))
    out.sum().backward()
    assert out.shape == (3, 4) and all(p.grad is not None for p in model.parameters())


def test_bad_receptive_field():
    with pytest.raises(ValueError, match="must be odd"):
        BagCNN(num_classes=2, receptive_field=4)


def test_airbench_cnn_is_airbench94s_network():
    """airbench94's sizes: a 24-channel 2x2 stem, blocks of 64, 256, 256 channels on maps of 15, 7
    and 3 pixels, 1.97 million parameters; `CNNClassifier(arch="airbench")` builds it at width 64
    and scales it with `width`."""
    model = AirbenchCNN(num_classes=10)
    assert sum(p.numel() for p in model.parameters()) == 1_972_792
    x = torch.rand(2, 3, 32, 32)
    maps = [model.stem(x)]
    for block in model.blocks:
        maps.append(block(maps[-1]))
    assert [tuple(m.shape[1:]) for m in maps] == [(24, 31, 31), (64, 15, 15), (256, 7, 7), (256, 3, 3)]
    assert model(x).shape == (2, 10) and model.head.bias is None
    default = CNNClassifier(arch="airbench").model
    assert [b[0].out_channels for b in default.blocks] == [64, 256, 256]
    small = CNNClassifier(num_classes=4, in_channels=1, arch="airbench", width=8).model
    assert [b[0].out_channels for b in small.blocks] == [8, 32, 32] and small.stem.out_channels == 8


def test_airbench_stem_whitens_the_patches_it_was_set_on():
    """After `whiten` (with a negligible eps), the stem's first 12 channels on the same images are
    centred and uncorrelated with unit variance, the other 12 their negatives, and it is frozen."""
    torch.manual_seed(0)
    images = torch.rand(32, 3, 16, 16) * torch.tensor([1.0, 0.5, 0.2])[:, None, None]  # unequal channels
    images[:, 1] += 0.5 * images[:, 0]  # correlated channels
    model = AirbenchCNN(num_classes=10)
    model.whiten(images, eps=1e-8)
    out = rearrange(model.stem(images), "n c y x -> (n y x) c").detach()
    torch.testing.assert_close(out[:, 12:], -out[:, :12])
    torch.testing.assert_close(out.mean(0), torch.zeros(24), atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.cov(out[:, :12].T), torch.eye(12), atol=1e-3, rtol=0)
    assert not model.stem.weight.requires_grad and model.stem.bias.requires_grad
