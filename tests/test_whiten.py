"""airbench's whitening initialisation of the conv stem's first layer (`ViTClassifier(whiten_stem=True)`,
`vit.layers.whiten_`; `CNNClassifier(arch="airbench", whiten_stem=True)`): at fit start, before the
first step, its filters decorrelate the training images' patches; a resumed run keeps its
checkpoint's. The ViT's filters learn on; airbench's stay, and its bias learns for 3 epochs."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lab.cifar10_pack import fake_cifar10
from vit import CNNClassifier, ViTClassifier, ViTConfig
from vit.datamodules import CIFAR10
from vit.errors import UsageError
from vit.layers import WHITEN_EPS, first_conv, whiten_

VIT = ViTConfig(preset="micro", patch_size=4, conv_stem=[64], conv_stem_strides=[1])


class FirstFilters(Callback):
    """The stem's first filters as training starts (after on_fit_start)."""

    def on_train_start(self, trainer, pl_module):
        self.weight = first_conv(pl_module.model.stem).weight.detach().clone()


def responses(filters: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """Each filter's response to every 3x3 patch of the images: (patches, filters)."""
    patches = F.unfold(images.double(), 3).transpose(1, 2).reshape(-1, filters[0].numel())
    return patches @ filters.flatten(1).double().T


def train(root, model, callbacks, ckpt_path=None, **stop) -> torch.Tensor:
    """Fit `model` on the made-up CIFAR-10 at `root` (batches of 16, no crops, no validation)
    until `stop` (max_steps or max_epochs); returns the train split's images, float in [0, 1]."""
    data = CIFAR10(root=str(root), val_size=10, batch_size=16, crop_padding=0)
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, callbacks=list(callbacks), default_root_dir=root.parent, **stop,
    )  # fmt: skip
    trainer.fit(model, data, ckpt_path=ckpt_path)
    return data.split("train").images.float() / 255


def fit(root, whiten: bool, max_steps: int = 1, ckpt_path=None, callbacks=(), vit=VIT):
    L.seed_everything(0, verbose=False)
    model = ViTClassifier(vit=vit, whiten_stem=whiten)
    first = FirstFilters()
    initial = first_conv(model.model.stem).weight.detach().clone()
    images = train(root, model, [first, *callbacks], ckpt_path, max_steps=max_steps)
    return initial, first.weight, images


def assert_whitened(whitened: torch.Tensor, initial: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """54 of 64 filters set: the first 27 whose responses to the images' 3x3 patches have the
    covariance diag(eigenvalue / (eigenvalue + eps)) of the patches' (the identity, but for the few
    components of JPEG's least variance, which eps damps), their negatives, the other 10 as
    initialised. Returns that expected covariance."""
    patches = F.unfold(images.double(), 3).transpose(1, 2).reshape(-1, 27)
    eigenvalues = torch.linalg.eigvalsh(patches.T.cov(correction=0)).flip(0)
    expected = torch.diag(eigenvalues / (eigenvalues + WHITEN_EPS))
    covariance = responses(whitened[:27], images).T.cov(correction=0)
    torch.testing.assert_close(covariance, expected, atol=1e-4, rtol=0)
    assert torch.equal(whitened[27:54], -whitened[:27])
    assert torch.equal(whitened[54:], initial[54:])
    return expected


def test_the_stem_starts_training_whitening_the_training_patches(tmp_path):
    """54 filters (2 x 3x3x3) of the 64: 27 whose responses to the training images' patches are
    uncorrelated, of variance 1 (less where eps damps a component of almost none), and their
    negatives; the other 10 as initialised. Without whiten_stem the same measure is far from it.
    Resumed from a checkpoint, the run starts from the checkpoint's filters, not whitened again."""
    root = fake_cifar10(tmp_path / "data", per_class=6)
    every_step = ModelCheckpoint(tmp_path / "ckpts", every_n_train_steps=1, save_top_k=-1)
    initial, whitened, images = fit(root, whiten=True, callbacks=[every_step])
    assert len(images) == 50
    expected = assert_whitened(whitened, initial, images)
    assert (expected.diagonal()[:10] > 0.99).all()

    initial, untouched, _ = fit(root, whiten=False)
    assert torch.equal(untouched, initial)
    assert (responses(untouched[:27], images).T.cov(correction=0) - expected).abs().max() > 0.5

    checkpoint = torch.load(tmp_path / "ckpts" / "epoch=0-step=1.ckpt", weights_only=True)
    _, resumed, _ = fit(root, whiten=True, max_steps=2, ckpt_path=tmp_path / "ckpts" / "epoch=0-step=1.ckpt")
    assert torch.equal(resumed, checkpoint["state_dict"]["model.stem.0.weight"])
    assert not torch.equal(resumed, whitened)  # the step moved them


def test_an_airbench_stem_whitens_its_first_blocks_first_convolution(tmp_path):
    """With airbench94's blocks as the stem, whiten_stem sets the first block's first 3x3
    convolution (64 filters) as it does ConvStem's first layer: 27 pairs of whitening filters and
    their negatives, the last 10 as initialised."""
    root = fake_cifar10(tmp_path / "data", per_class=6)
    vit = ViTConfig(preset="micro", patch_size=4, conv_stem=[64], conv_stem_block="airbench")
    initial, whitened, images = fit(root, whiten=True, vit=vit)
    assert_whitened(whitened, initial, images)
    assert not torch.equal(whitened[:3], initial[:3])  # the Dirac filters are overwritten


def test_a_narrow_layer_takes_the_largest_components_in_pairs():
    """8 filters for 27 components: the 4 of largest variance, each with its negative: their
    responses are uncorrelated, of variance about 1, and their directions the top principal ones."""
    torch.manual_seed(0)
    ramp = torch.linspace(0, 1, 16)
    images = (ramp[None, None, :, None] * ramp + 0.2 * torch.rand(40, 3, 16, 16)).clamp(0, 1)
    conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
    assert whiten_(conv, images) == 8
    filters = conv.weight.detach()
    patches = F.unfold(images.double(), 3).transpose(1, 2).reshape(-1, 27)
    eigenvalues, eigenvectors = torch.linalg.eigh(patches.T.cov(correction=0))
    top = eigenvalues[-4:].flip(0)  # the 4 largest
    expected = torch.diag(top / (top + WHITEN_EPS))
    torch.testing.assert_close(
        responses(filters[:4], images).T.cov(correction=0), expected, atol=1e-5, rtol=0
    )
    assert (expected.diagonal() > 0.99).all() and torch.equal(filters[4:], -filters[:4])
    top = eigenvectors[:, -4:]
    directions = filters[:4].flatten(1).double()
    directions = directions / directions.norm(dim=1, keepdim=True)
    torch.testing.assert_close((directions @ top).abs().max(1).values, torch.ones(4, dtype=torch.float64),
                               atol=1e-6, rtol=0)  # fmt: skip


def test_whiten_stem_is_refused_without_a_conv_stem():
    with pytest.raises(UsageError, match="whiten_stem needs a conv stem"):
        ViTClassifier(vit=ViTConfig(preset="micro", patch_size=4), whiten_stem=True)


class AirbenchStem(Callback):
    """The airbench stem's weight and bias as each training epoch starts, and at the end."""

    def __init__(self):
        self.weights, self.biases = [], []

    def record(self, stem):
        self.weights.append(stem.weight.detach().clone())
        self.biases.append(stem.bias.detach().clone())

    def on_train_epoch_start(self, trainer, pl_module):
        self.record(pl_module.model.stem)

    def on_train_end(self, trainer, pl_module):
        self.record(pl_module.model.stem)


def fit_airbench(root, whiten: bool, max_epochs: int, ckpt_path=None, callbacks=()):
    L.seed_everything(0, verbose=False)
    model = CNNClassifier(arch="airbench", width=8, optimizer="sgd", lr=0.2, whiten_stem=whiten)
    stem = AirbenchStem()
    initial = model.model.stem.weight.detach().clone()
    images = train(root, model, [stem, *callbacks], ckpt_path, max_epochs=max_epochs)
    return initial, stem, images


def test_the_airbench_cnn_whitens_its_stem_freezes_it_and_trains_its_bias_for_three_epochs(tmp_path):
    """CNNClassifier(arch="airbench", whiten_stem=True): the 24 filters of its 2x2 stem are 12
    whose responses to the training images' 2x2 patches are uncorrelated, of variance
    eigenvalue / (eigenvalue + 5e-4), and their negatives, and stay so through training; the bias
    learns in epochs 0-2, not after, also in a run resumed after them (requires_grad is not in
    the checkpoint). Without whiten_stem the filters learn; another arch is refused in one line."""
    root = fake_cifar10(tmp_path / "data", per_class=6)
    every_epoch = ModelCheckpoint(tmp_path / "ckpts", save_top_k=-1, save_on_train_epoch_end=True)
    initial, stem, images = fit_airbench(root, whiten=True, max_epochs=5, callbacks=[every_epoch])
    weights, biases = stem.weights, stem.biases  # epochs 0-4 starting, then the end
    patches = F.unfold(images.double(), 2).transpose(1, 2).reshape(-1, 12)
    eigenvalues = torch.linalg.eigvalsh(patches.T.cov(correction=0)).flip(0)
    responses = patches @ weights[0][:12].flatten(1).double().T
    torch.testing.assert_close(
        responses.T.cov(correction=0), torch.diag(eigenvalues / (eigenvalues + 5e-4)), atol=1e-4, rtol=0
    )
    assert torch.equal(weights[0][12:], -weights[0][:12]) and not torch.equal(weights[0], initial)
    assert all(torch.equal(w, weights[0]) for w in weights)
    assert all(not torch.equal(biases[e + 1], biases[e]) for e in range(3))  # epochs 0, 1, 2 learn
    assert torch.equal(biases[4], biases[3]) and torch.equal(biases[5], biases[3])  # 3 and 4 do not

    # resumed after epoch 3 (epoch=3.ckpt): epoch 4 and 5 leave the stem as the checkpoint has it
    checkpoint = torch.load(tmp_path / "ckpts" / "epoch=3-step=12.ckpt", weights_only=True)
    _, resumed, _ = fit_airbench(
        root, whiten=True, max_epochs=6, ckpt_path=tmp_path / "ckpts" / "epoch=3-step=12.ckpt"
    )
    assert all(torch.equal(w, checkpoint["state_dict"]["model.stem.weight"]) for w in resumed.weights)
    assert all(torch.equal(b, checkpoint["state_dict"]["model.stem.bias"]) for b in resumed.biases)

    initial, learned, _ = fit_airbench(root, whiten=False, max_epochs=1)
    assert not torch.equal(learned.weights[-1], initial)
    with pytest.raises(UsageError, match="whiten_stem needs arch=airbench"):
        CNNClassifier(arch="bag", whiten_stem=True)
