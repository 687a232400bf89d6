"""Batched augmentation (vit/augment.py): each operation as torchvision computes it on one image,
a draw per image, the same work whatever the batch, nothing that would wait for a GPU."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms.v2.functional as TF
from syncs import WouldWait
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from vit.augment import (
    BINS,
    GEOMETRIC,
    OPS,
    SIGNED,
    apply,
    draw,
    grid_constants,
    magnitudes,
    mix,
    rand_augment,
    random_crop_flip,
    trivial_augment,
)


def images(n: int = 6, channels: int = 3, size: int = 32, seed: int = 0) -> torch.Tensor:
    """Photos' statistics matter for equalize and autocontrast: smooth gradients plus noise."""
    g = torch.Generator().manual_seed(seed)
    ramp = torch.linspace(0, 1, size)
    base = 40 + 150 * (ramp[None, :] * ramp[:, None])
    noise = torch.randint(0, 60, (n, channels, size, size), generator=g)
    return (base + noise).clamp(0, 255).to(torch.uint8)


def torchvision_op(image: torch.Tensor, name: str, m: float) -> torch.Tensor:
    """torchvision's TrivialAugment/RandAugment operation on one image at magnitude m."""
    from torchvision.transforms.v2 import TrivialAugmentWide

    return TrivialAugmentWide()._apply_image_or_video_transform(
        image, name, m, interpolation=TF.InterpolationMode.NEAREST, fill={type(image): None}
    )


def compare(policy: str, name: str, bins=(0, 7, 15, 30), channels: int = 3) -> None:
    """Colour operations equal torchvision's exactly; a warp may round a pixel centre that falls
    on a boundary the other way (float32 grids computed in another order), so 99% of pixels."""
    x = images(channels=channels)
    table = magnitudes(policy, 32, 32)[OPS.index(name)]
    for b in bins:
        for sign in (1, -1) if name in SIGNED else (1,):
            m = sign * float(table[b])
            op = torch.full((len(x),), OPS.index(name))
            ours = apply(x, op, torch.full((len(x),), m, dtype=torch.float64))
            theirs = torch.stack([torchvision_op(image, name, m) for image in x])
            assert ours.dtype == torch.uint8 and ours.shape == x.shape
            same = (ours == theirs).float().mean((1, 2, 3))  # per image
            if name in GEOMETRIC:
                assert same.min() >= 0.99, (name, m, same.min().item())
            else:
                assert torch.equal(ours, theirs), (name, m, same.min().item())


@pytest.mark.parametrize("name", OPS)
def test_each_trivial_augment_operation_is_torchvisions(name):
    compare("trivial", name)


@pytest.mark.parametrize("name", ["ShearX", "TranslateY", "Rotate", "Posterize", "Color", "Contrast"])
def test_each_operation_on_grayscale_images_too(name):
    compare("trivial", name, bins=(10, 30), channels=1)


@pytest.mark.parametrize("name", ["ShearX", "TranslateX", "TranslateY", "Rotate", "Posterize", "Brightness"])
def test_randaugment_magnitudes_are_torchvisions(name):
    from torchvision.transforms.v2 import RandAugment

    space = RandAugment._AUGMENTATION_SPACE[name][0](BINS, 32, 32)
    torch.testing.assert_close(magnitudes("randaugment", 32, 32)[OPS.index(name)], space.double())
    compare("randaugment", name, bins=(9, 30))


def test_each_image_draws_its_own_operation():
    torch.manual_seed(0)
    x = images(n=1).expand(256, -1, -1, -1).contiguous()
    for policy in (trivial_augment, rand_augment):
        out = policy(x)
        assert out.dtype == torch.uint8 and out.shape == x.shape
        # 14 operations x 31 bins x 2 signs drawn image by image; one draw a batch gives 1 image
        assert len({bytes(image.flatten().tolist()) for image in out}) > 100, policy.__name__


def test_operations_signs_and_bins_are_drawn_uniformly():
    torch.manual_seed(0)
    op, magnitude = draw("trivial", 14000, 32, 32, torch.device("cpu"))
    counts = torch.bincount(op, minlength=len(OPS))
    assert counts.min() > 850 and counts.max() < 1150, counts  # 1000 each, sd 30
    signed = (op >= OPS.index(SIGNED[0])) & (op <= OPS.index(SIGNED[-1]))
    assert 0.45 < (magnitude[signed] < 0).float().mean() < 0.55
    assert (magnitude[~signed] >= 0).all()
    rotate = magnitude[op == OPS.index("Rotate")].abs()
    assert len(rotate.unique()) == BINS and rotate.max() == 135.0
    op, fixed = draw("randaugment", 1000, 32, 32, torch.device("cpu"), bin=9)
    assert set(fixed[op == OPS.index("Rotate")].abs().tolist()) == {9.0}  # RandAugment: one bin


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("policy", [trivial_augment, rand_augment])
def test_the_same_operations_run_for_any_batch_and_any_draw(policy):
    policy(images(n=2))  # the first call makes the constants (magnitudes, grid) on the device
    runs = []
    for batch, seed in ((64, 0), (512, 1)):
        torch.manual_seed(seed)
        with Count() as count:
            policy(images(n=batch))
        runs.append(count.ops)
    assert runs[0] == runs[1] and len(runs[0]) > 100


def test_nothing_would_wait_for_a_gpu():
    x, labels = images(n=16), torch.randint(10, (16,))
    with WouldWait([x, labels]) as watch:
        out = random_crop_flip(x, 4, True)
        out = rand_augment(trivial_augment(out))
        for mixup, cutmix in ((0.8, 0.0), (0.0, 1.0), (0.8, 1.0)):
            mix(out.float() / 255, labels, 10, mixup, cutmix)
    assert not watch.waits, dict(watch.waits)


class HostData(TorchDispatchMode):
    """Operations that mix host tensors into device ones: a tensor built on the host and copied
    (a copy from pageable memory makes a CUDA host wait), or used with them."""

    def __init__(self):
        super().__init__()
        self.found = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        if {t.device.type for t in tensors} >= {"cpu", "meta"}:
            self.found.append(str(func))
        return out


def test_every_tensor_is_made_on_the_images_device():
    """On the meta device (a stand-in for a GPU that WouldWait cannot see through: it takes a
    tensor made on the host as a host tensor), nothing comes from the host."""
    x, labels = (
        torch.zeros(16, 3, 32, 32, dtype=torch.uint8, device="meta"),
        torch.zeros(16, dtype=torch.long, device="meta"),
    )
    magnitudes.cache_clear(), grid_constants.cache_clear()  # made afresh, under watch
    with HostData() as host:
        out = rand_augment(trivial_augment(random_crop_flip(x, 4, True)))
        for mixup, cutmix in ((0.8, 0.0), (0.0, 1.0)):
            mix(out.float() / 255, labels, 10, mixup, cutmix)
    assert not host.found


def test_mixup_is_the_stated_convex_combination():
    torch.manual_seed(0)
    x, labels = torch.rand(8, 3, 4, 4), torch.arange(8) % 10
    mixed, probs = mix(x, labels, 10, mixup_alpha=0.8, cutmix_alpha=0.0)
    lam = probs[0, labels[0]].item()  # the image's own class keeps weight lam
    torch.testing.assert_close(mixed, lam * x + (1 - lam) * x.roll(1, 0))
    torch.testing.assert_close(probs.sum(1), torch.ones(8))
    assert probs[0, labels[7]].item() == pytest.approx(1 - lam)


def test_cutmix_labels_weigh_the_box_by_its_area():
    torch.manual_seed(1)
    x, labels = torch.rand(8, 3, 32, 32), torch.arange(8)
    for _ in range(5):
        mixed, probs = mix(x, labels, 10, mixup_alpha=0.0, cutmix_alpha=1.0)
        pasted = (mixed != x).any(1).float().mean((-2, -1))  # share of pixels from the rolled image
        torch.testing.assert_close(probs[:, labels].diagonal(), 1 - pasted, atol=1e-6, rtol=0)
        torch.testing.assert_close(probs.sum(1), torch.ones(8))


def test_no_mixing_keeps_images_and_labels():
    x, labels = torch.rand(4, 3, 8, 8), torch.arange(4)
    assert mix(x, labels, 10, 0.0, 0.0) == (x, labels)


def test_the_magnitude_tables_are_torchvisions():
    from torchvision.transforms.v2 import TrivialAugmentWide

    for i, name in enumerate(OPS):
        space = TrivialAugmentWide._AUGMENTATION_SPACE[name][0](BINS, 32, 32)
        expected = torch.zeros(BINS, dtype=torch.float64) if space is None else space.double()
        torch.testing.assert_close(magnitudes("trivial", 32, 32)[i], expected, msg=name)
        assert (name in SIGNED) == TrivialAugmentWide._AUGMENTATION_SPACE[name][1]
    assert math.isclose(
        magnitudes("randaugment", 32, 64)[OPS.index("TranslateX")][-1], 150 / 331 * 64, rel_tol=1e-6
    )


@pytest.mark.parametrize("padding_mode", ["constant", "reflect"])
def test_crop_and_flip_draw_per_sample(padding_mode):
    image = (torch.arange(64) + 1).to(torch.uint8).view(1, 1, 8, 8)  # every pixel different
    batch = image.expand(64, 1, 8, 8)
    padded = F.pad(image, (2, 2, 2, 2), mode=padding_mode)[0, 0]
    windows = {(dy, dx): padded[dy : dy + 8, dx : dx + 8] for dy in range(5) for dx in range(5)}
    cropped = random_crop_flip(batch, padding=2, flip=False, padding_mode=padding_mode)
    offsets = [[o for o, window in windows.items() if torch.equal(c[0], window)] for c in cropped]
    assert all(len(o) == 1 for o in offsets)  # each output is one window of the padded image
    assert len({o[0] for o in offsets}) > 5  # drawn per sample

    flipped = random_crop_flip(batch, padding=0, flip=True)
    mirrored = (flipped == batch.flip(-1)).flatten(1).all(1)
    assert ((flipped == batch).flatten(1).all(1) | mirrored).all() and 0 < mirrored.sum() < 64
