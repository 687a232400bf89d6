import pytest
import torch

from vit.cnn import BagCNN, ResNet, receptive_field


@pytest.mark.parametrize("field", [3, 7, 11])
@pytest.mark.parametrize("padding", ["circular", "zeros", "valid"])
def test_bag_cnn_sees_exactly_its_receptive_field(field, padding):
    torch.manual_seed(0)
    model = BagCNN(num_classes=4, in_channels=1, receptive_field=field, width=8, padding=padding).eval()
    assert receptive_field(model) == field
    x = torch.randn(1, 1, 32, 32, requires_grad=True)
    features = model.features(x)
    row, col = features.shape[-2] // 2, features.shape[-1] // 2
    features[0, :, row, col].sum().backward()
    seen = x.grad[0, 0].abs() > 0
    rows, cols = seen.nonzero().unbind(1)
    assert (rows.max() - rows.min() + 1, cols.max() - cols.min() + 1) == (field, field)


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
    assert receptive_field(model) >= 32
    out = model(torch.randn(3, 1, 32, 32))
    out.sum().backward()
    assert out.shape == (3, 4) and all(p.grad is not None for p in model.parameters())


def test_bad_receptive_field():
    with pytest.raises(ValueError, match="must be odd"):
        BagCNN(num_classes=2, receptive_field=4)
