import pytest
import torch

from vit.cnn import BagCNN, ResNet, receptive_field_of


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
