import pytest
import torch

from vit.data import TwoCircles, make_two_circles


def test_deterministic_by_seed_and_splits_differ():
    a, b, c = (TwoCircles(num_train=64, num_val=32, num_test=32, seed=seed) for seed in (1, 1, 2))
    for dm in (a, b, c):
        dm.setup("fit")
        dm.setup("test")
    for split in ("train", "val", "test"):
        assert torch.equal(a.splits[split].tensors[0], b.splits[split].tensors[0])
        assert not torch.equal(a.splits[split].tensors[0], c.splits[split].tensors[0])
    assert not torch.equal(a.splits["val"].tensors[0], a.splits["test"].tensors[0])


def test_test_split_does_not_depend_on_train_size():
    small, large = TwoCircles(num_train=64, num_test=32), TwoCircles(num_train=128, num_test=32)
    small.setup("test")
    large.setup("test")
    assert torch.equal(small.splits["test"].tensors[0], large.splits["test"].tensors[0])


def test_images_hold_two_circles_on_the_labelled_line():
    g = torch.Generator().manual_seed(0)
    images, labels = make_two_circles(256, noise=0.0, generator=g)
    assert images.shape == (256, 1, 32, 32) and images.min() >= 0 and images.max() <= 1
    assert set(labels.tolist()) == {0, 1, 2, 3}
    # every image has the same amount of ink: two full circles of the same radius
    ink = images.sum((1, 2, 3))
    torch.testing.assert_close(ink, torch.full_like(ink, ink.median().item()), atol=2.0, rtol=0.0)
    # the principal axis of the ink points the way its label says
    ys, xs = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
    for image, label in zip(images[:, 0], labels, strict=True):
        w = image / image.sum()
        mx, my = (w * xs).sum(), (w * ys).sum()
        cov = torch.stack([
            torch.stack([(w * (xs - mx) ** 2).sum(), (w * (xs - mx) * (ys - my)).sum()]),
            torch.stack([(w * (xs - mx) * (ys - my)).sum(), (w * (ys - my) ** 2).sum()]),
        ])  # fmt: skip
        vx, vy = torch.linalg.eigh(cov).eigenvectors[:, -1]
        angle = torch.rad2deg(torch.atan2(-vy, vx)) % 180
        assert min(abs(angle - label * 45), 180 - abs(angle - label * 45)) <= 12, (label, angle)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(radius=5.0, min_separation=8.0), "touch"),
        (dict(max_separation=30.0), "does not fit"),
        (dict(min_separation=14.0, max_separation=12.0), "max_separation"),
        (dict(angle_jitter=30.0), "angle_jitter"),
    ],
)
def test_bad_settings_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TwoCircles(**kwargs)
