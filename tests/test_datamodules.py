"""The real-image data modules on tiny fake data sets: folders of odd-sized images in every mode,
CIFAR-10 in both layouts, Fashion-MNIST IDX files; the cache; batched augmentation; the CLI."""

import csv
import math
import os
import pickle
import re
import shutil
import urllib.error
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision
from helpers import (
    SeedEachProcess,
    command_error,
    fit,
    fit_in_two_processes,
    make_folders,
    run_train,
    write_idx,
    write_image,
)
from PIL import Image
from seen import SeenImages

import vit.cache
import vit.decode
from vit import ViTClassifier, ViTConfig
from vit.checkpoint import load_checkpoint, load_model
from vit.commands import train as cli
from vit.commands.attention import AttentionOptions, attention
from vit.commands.eval import EvalOptions, PredictOptions, evaluate, predict
from vit.datamodules import (
    CIFAR10,
    CIFAR10_CLASSES,
    FashionMNIST,
    ImageFolders,
    InMemory,
    InMemoryDataModule,
    batches,
    holdout,
)
from vit.errors import DataError, DataNotFoundError, UsageError
from vit.preparation import Preparation, prepare
from vit.two_circles import TwoCircles


def test_image_folders_classes_shapes_and_dtypes(tmp_path):
    data = ImageFolders(str(make_folders(tmp_path)), image_size=12, val_size=3)
    assert data.classes == ["ant", "bee", "cat"] and data.num_classes == 3
    assert data.image_size == 12 and data.in_channels == 3
    data.setup("fit")
    train, labels = data.split("train").images, data.split("train").labels
    assert train.shape == (15, 3, 12, 12) and train.dtype == torch.uint8 and labels.dtype == torch.int64
    # every mode became a flat gray image whose level tells its label
    flat = train.flatten(1)
    assert (flat == flat[:, :1]).all()
    assert torch.equal((flat[:, 0].long() - 1) // 10, labels)
    x, y = next(iter(data.val_dataloader()))  # model-ready: float in [0, 1]
    assert x.shape == (3, 3, 12, 12) and x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1
    x, y = next(iter(data.train_dataloader()))  # uint8, for augmentation on the device
    assert x.dtype == torch.uint8 and len(x) == len(y)

    gray = ImageFolders(str(tmp_path), image_size=8, channels=1, val_size=3)
    gray.setup("test")
    x, y = next(iter(gray.test_dataloader()))
    assert gray.in_channels == 1 and x.shape == (6, 1, 8, 8)
    assert torch.equal(x[:, 0, 0, 0], (torch.tensor([101, 102, 111, 112, 121, 122]) / 255).float())

    # classes given in another order: labels follow it (the cache, keyed on that order, too)
    ordered = ImageFolders(str(tmp_path), image_size=8, channels=1, val_size=3, classes=["cat", "ant", "bee"])
    ordered.setup("test")
    x, y = next(iter(ordered.test_dataloader()))
    assert torch.equal(x[:, 0, 0, 0], (torch.tensor([121, 122, 101, 102, 111, 112]) / 255).float())
    assert torch.equal(y, torch.tensor([0, 0, 1, 1, 2, 2]))
    assert ordered.hparams.classes == ["cat", "ant", "bee"]
    with pytest.raises(ValueError, match="names a class twice"):
        ImageFolders(str(tmp_path), classes=["ant", "ant", "bee", "cat"])


def test_validation_is_held_out_disjoint_and_seeded(tmp_path):
    make_folders(tmp_path)

    def values(seed):
        data = ImageFolders(str(tmp_path), image_size=4, val_size=0.25, seed=seed)
        data.setup("fit")
        train, val = (set(data.split(s).images[:, 0, 0, 0].tolist()) for s in ("train", "val"))
        return train, val

    train, val = values(0)
    assert len(val) == round(0.25 * 18) and not train & val and len(train | val) == 18
    assert values(0) == (train, val)  # the same seed holds out the same images
    assert values(1)[1] != val
    assert all(v < 100 for v in train | val)  # nothing from the test folder

    train_idx, val_idx = holdout(100, 10, seed=3)
    assert len(val_idx) == 10 and len(set(train_idx.tolist()) | set(val_idx.tolist())) == 100


def test_val_folder_is_used_and_test_split_is_separate(tmp_path):
    make_folders(tmp_path, per_class={"train": 3, "val": 1, "test": 2})
    data = ImageFolders(str(tmp_path), image_size=4, val_size=0.5)
    data.setup("fit")
    assert len(data.split("train").labels) == 9 and len(data.split("val").labels) == 3  # val_size unused
    assert "test" not in data.splits
    data.setup("test")
    assert (data.split("test").images > 100).all() and (data.split("train").images < 100).all()


def test_cache_is_written_reused_and_rebuilt(tmp_path, monkeypatch):
    make_folders(tmp_path)
    decode = vit.decode.decode_images
    calls = []
    monkeypatch.setattr(vit.decode, "decode_images", lambda *a, **k: calls.append(1) or decode(*a, **k))

    def train_values():
        data = ImageFolders(str(tmp_path), image_size=4, val_size=2)
        data.setup("fit")
        return sorted(
            data.split("train").images[:, 0, 0, 0].tolist() + data.split("val").images[:, 0, 0, 0].tolist()
        )

    first = train_values()
    cache = tmp_path / ".vit-cache" / "train-4x4-RGB.pt"
    assert cache.is_file() and len(calls) == 1
    assert train_values() == first and len(calls) == 1  # read from the cache, not decoded
    ImageFolders(str(tmp_path), image_size=5, val_size=2).setup("fit")  # another size: its own cache
    assert len(calls) == 2 and (tmp_path / ".vit-cache" / "train-5x5-RGB.pt").is_file()

    write_image(tmp_path / "train" / "ant" / "00.png", 99, "RGB", (3, 3))  # a file changes
    changed = train_values()
    assert len(calls) == 3 and 99 in changed and 1 not in changed


def test_bad_values_are_bad_usage_before_the_folders_are_looked_at(tmp_path):
    for options, message in (({"channels": 2}, "channels=2 must be 1"), ({"resize": "squash"}, "resize=")):
        with pytest.raises(UsageError, match=message):
            ImageFolders(str(tmp_path / "nowhere"), **options)
    data = ImageFolders(str(make_folders(tmp_path)), image_size=4, val_size=2)
    with pytest.raises(UsageError, match="no split 'validation'"):
        data.split("validation")


def test_a_corrupt_cache_is_rebuilt_with_a_warning(tmp_path, capsys):
    make_folders(tmp_path)
    ImageFolders(str(tmp_path), image_size=4, val_size=2).setup("fit")
    cache = tmp_path / ".vit-cache" / "train-4x4-RGB.pt"
    good = cache.read_bytes()
    cache.write_bytes(good[: len(good) // 2])  # cut short, as by a full disk
    capsys.readouterr()
    data = ImageFolders(str(tmp_path), image_size=4, val_size=2)
    data.setup("fit")
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"the cache file {cache} cannot be read" in warnings[0]
    assert len(data.split("train")) + len(data.split("val")) == 18
    torch.load(cache, weights_only=True)  # rewritten whole


def test_a_cache_the_data_folder_refuses_goes_to_the_user_folder(tmp_path, monkeypatch):
    """A data folder whose permissions allow writing but whose cache cannot be written there (here
    .vit-cache is a file) caches in the user's folder instead."""
    root = make_folders(tmp_path / "data")
    (root / ".vit-cache").write_text("not a folder")
    monkeypatch.setattr(vit.cache, "USER_CACHE", tmp_path / "user-cache")
    ImageFolders(str(root), image_size=4, val_size=2).setup("fit")
    assert (root / ".vit-cache").read_text() == "not a folder"
    assert len(list((tmp_path / "user-cache").glob("data-*/train-4x4-RGB.pt"))) == 1


def test_read_only_data_folder_caches_in_the_user_folder(tmp_path, monkeypatch):
    root = make_folders(tmp_path / "data")
    monkeypatch.setattr(vit.cache, "USER_CACHE", tmp_path / "user-cache")
    os.chmod(root, 0o555)  # no write bits: left alone, even by root
    try:
        ImageFolders(str(root), image_size=4, val_size=2).setup("fit")
    finally:
        os.chmod(root, 0o755)
    assert not (root / ".vit-cache").exists()
    assert len(list((tmp_path / "user-cache").glob("data-*/train-4x4-RGB.pt"))) == 1


def test_bad_file_stops_with_its_name_or_is_skipped_and_counted(tmp_path, capsys):
    make_folders(tmp_path)
    bad = tmp_path / "train" / "bee" / "03.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(DataError, match=f"cannot read image {re.escape(str(bad))} .*on_bad_file=skip"):
        ImageFolders(str(tmp_path), image_size=4, val_size=2).setup("fit")

    data = ImageFolders(str(tmp_path), image_size=4, val_size=2, on_bad_file="skip")
    data.setup("fit")
    assert len(data.split("train").labels) + len(data.split("val").labels) == 17
    assert "skipped 1 unreadable files" in capsys.readouterr().err
    # the cache remembers the skipped file: still an error without skip
    with pytest.raises(DataError, match="cannot read image .*03.png"):
        ImageFolders(str(tmp_path), image_size=4, val_size=2).setup("fit")


def test_missing_or_inconsistent_folders_are_clear_errors(tmp_path):
    missing = re.escape(str(tmp_path / "nope" / "train"))
    with pytest.raises(DataNotFoundError, match=f"image folder not found: {missing}"):
        ImageFolders(str(tmp_path / "nope"))
    make_folders(tmp_path / "a")
    make_folders(tmp_path / "a", classes=("ant", "dog"), per_class={"test": 1})
    with pytest.raises(DataError, match=r"class folders of .*: missing none, extra \['dog'\]"):
        ImageFolders(str(tmp_path / "a"))
    make_folders(tmp_path / "b", per_class={"train": 2})
    with pytest.raises(DataNotFoundError, match="no test split"):
        ImageFolders(str(tmp_path / "b"), val_size=1).setup("test")
    # CIFAR-10 offline with no copy: where to put the files
    with pytest.raises(FileNotFoundError, match="put torchvision's cifar-10-batches-py folder there"):
        CIFAR10(str(tmp_path / "nope"))


def test_cifar10_reads_image_folders_and_checks_class_names(tmp_path):
    root = make_folders(tmp_path / "jpeg", classes=CIFAR10_CLASSES, per_class={"train": 2, "test": 1})
    write_image(root / "test" / "cat" / "01.jpg", 50, "RGB", (32, 32))
    data = CIFAR10(str(root), val_size=4)
    data.setup("fit")
    data.setup("test")
    assert data.classes == CIFAR10_CLASSES and (data.num_classes, data.image_size, data.in_channels) == (
        10,
        32,
        3,
    )
    assert len(data.split("train").labels) == 16 and len(data.split("test").labels) == 11
    make_folders(tmp_path / "other", classes=("ant", "bee"))
    with pytest.raises(DataError, match="missing .*'airplane'"):
        CIFAR10(str(tmp_path / "other"))


def write_torchvision_cifar(root: Path, per_batch: int = 2) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for b, name in enumerate(names):
        labels = [(b + i) % 10 for i in range(per_batch)]
        data = np.stack([np.full(3072, 10 * b + i, dtype=np.uint8) for i in range(per_batch)])
        with open(folder / name, "wb") as f:
            pickle.dump({"data": data, "labels": labels}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": CIFAR10_CLASSES}, f)


def test_cifar10_reads_torchvision_layout_and_explains_a_failed_download(tmp_path, monkeypatch):
    write_torchvision_cifar(tmp_path / "tv")
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *args, **kwargs: True)
    data = CIFAR10(str(tmp_path / "tv"), val_size=2)
    data.setup("fit")
    data.setup("test")
    train = data.split("train").images
    assert train.shape == (8, 3, 32, 32) and train.dtype == torch.uint8
    assert torch.equal(data.split("test").images[:, 0, 0, 0], torch.tensor([50, 51], dtype=torch.uint8))
    assert torch.equal(data.split("test").labels, torch.tensor([5, 6]))

    def offline(self):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(torchvision.datasets.CIFAR10, "download", offline)
    data = CIFAR10(str(tmp_path / "empty"), download=True)
    with pytest.raises(DataError, match="download failed .*put torchvision's cifar-10-batches-py"):
        data.prepare_data()


@pytest.mark.parametrize("layout", ["flat", "torchvision"])
def test_fashion_mnist_reads_idx_files(tmp_path, layout):
    folder = tmp_path if layout == "flat" else tmp_path / "FashionMNIST" / "raw"
    for prefix, n in (("train", 12), ("t10k", 4)):
        pictures = np.arange(n * 28 * 28).reshape(n, 28, 28) % 251
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", pictures)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    data = FashionMNIST(str(tmp_path), val_size=2)
    assert (data.num_classes, data.image_size, data.in_channels) == (10, 28, 1)
    data.setup("fit")
    data.setup("test")
    assert data.split("train").images.shape == (10, 1, 28, 28) and len(data.split("val").labels) == 2
    x, y = next(iter(data.test_dataloader()))
    assert x.shape == (4, 1, 28, 28) and torch.equal(y, torch.arange(4))
    assert x[1, 0, 0, 0] == (28 * 28 % 251) / 255

    padded = FashionMNIST(str(tmp_path), image_size=32, val_size=2)
    padded.setup("test")
    x32, _ = next(iter(padded.test_dataloader()))
    assert x32.shape == (4, 1, 32, 32) and torch.equal(x32[:, :, 2:30, 2:30], x)
    assert x32[:, :, :2].abs().sum() == 0  # black border
    # the preparation of the same pictures as PIL images gives what the test loader gives
    pictures = [Image.fromarray((image[0] * 255).round().byte().numpy()) for image in x]
    assert torch.equal(prepare(pictures, padded.preparation), x32)

    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataNotFoundError, match="dataset-fashion-mnist"):
        FashionMNIST(str(tmp_path))


def test_prepared_files_match_the_test_loader(tmp_path):
    root = make_folders(tmp_path)
    write_image(root / "test" / "bee" / "09.jpg", 77, "RGB", (50, 37))
    data = ImageFolders(str(root), image_size=12, val_size=2)
    data.setup("test")
    x, _ = next(iter(data.test_dataloader()))
    files = sorted((root / "test").glob("*/*"))  # the loader's order: by class, then name
    assert torch.equal(prepare([Image.open(f) for f in files], data.preparation), x)
    circles = prepare([Image.new("RGB", (40, 30), "white")], TwoCircles().preparation)
    assert circles.shape == (1, 1, 32, 32) and circles.dtype == torch.float32 and circles.min() == 1


@pytest.mark.parametrize("policy", ["none", "trivial", "randaugment"])
def test_batched_augmentation_keeps_shapes_and_labels(tmp_path, policy):
    data = ImageFolders(str(make_folders(tmp_path)), image_size=16, val_size=2, policy=policy)
    labels = torch.arange(32) % 3
    batch = ((labels + 1) * 60).to(torch.uint8)[:, None, None, None].expand(32, 3, 16, 16).contiguous()
    x, y = data.augment(batch, labels)
    assert x.shape == (32, 3, 16, 16) and x.dtype == torch.float32 and torch.equal(y, labels)
    assert 0 <= x.min() and x.max() <= 1
    if policy == "none":  # crop and flip only: each image is its own level or padding (0)
        levels = ((labels + 1) * 60 / 255)[:, None]
        flat = x.flatten(1)
        assert ((flat == 0) | torch.isclose(flat, levels)).all()
        assert torch.isclose(flat.amax(1), levels[:, 0]).all()


def test_alternating_flips_mirror_each_image_in_exactly_one_of_two_epochs(tmp_path):
    """`flip: alternate` (airbench94's): the training loader's batches, augmented as a trainer in
    epoch 0, 1 and 2 gets them, mirror each image in exactly one of two consecutive epochs (some
    in the first, some in the second), epoch 2 as epoch 0; a data module built again (a resumed
    run) mirrors the same images. Streaming, which has no index, refuses it in one line."""
    from types import SimpleNamespace

    from lab.cifar10_pack import fake_cifar10
    from vit.streaming import StreamingImages

    root = fake_cifar10(tmp_path / "data", per_class=4)  # random pixels: no image is its own mirror
    data = CIFAR10(root=str(root), val_size=8, batch_size=8, crop_padding=0, flip="alternate")
    data.setup("fit")
    loader, train = data.train_dataloader(), data.split("train").images.float() / 255
    data.trainer = SimpleNamespace(training=True, current_epoch=0)
    mirrored = []
    for epoch in range(3):
        data.trainer.current_epoch = epoch
        seen = torch.zeros(len(train), dtype=torch.bool)
        flipped = torch.zeros(len(train), dtype=torch.bool)
        for batch in loader:
            images, _, indices = batch
            x, _ = data.on_after_batch_transfer(batch, 0)
            as_is = (x == train[indices]).flatten(1).all(1)
            mirror = (x == train[indices].flip(-1)).flatten(1).all(1)
            assert (as_is ^ mirror).all()
            seen[indices], flipped[indices] = True, mirror
        assert seen.all()
        mirrored.append(flipped)
    assert torch.equal(mirrored[0], ~mirrored[1]) and torch.equal(mirrored[2], mirrored[0])
    assert 0 < mirrored[0].sum() < len(train)
    again = CIFAR10(root=str(root), val_size=8, batch_size=8, crop_padding=0, flip="alternate")
    again.setup("fit")
    again.train_dataloader()
    assert torch.equal(again.mirrored, data.mirrored)
    with pytest.raises(UsageError, match="flip=alternate needs image indices; streaming has none"):
        StreamingImages(str(tmp_path / "chunks"), flip="alternate")
    with pytest.raises(UsageError, match="flip='sometimes' must be true, false or 'alternate'"):
        CIFAR10(root=str(root), flip="sometimes")


def test_crops_reflect_the_border_with_crop_padding_mode_reflect(tmp_path):
    """Crops of images with no zero pixel: zero padding shows zeros at some borders, a reflected
    border (airbench94's translation) never, and then every crop is a window of the image
    reflected at its border. A padding the image is too small to reflect is refused in one line."""
    root = make_folders(tmp_path)
    batch = torch.randint(1, 256, (64, 3, 16, 16), dtype=torch.uint8)
    labels = torch.arange(64) % 3
    zeros = ImageFolders(str(root), image_size=16, val_size=2, crop_padding=4, flip=False)
    assert (zeros.augment(batch, labels)[0] == 0).any()
    reflect = ImageFolders(
        str(root), image_size=16, val_size=2, crop_padding=4, flip=False, crop_padding_mode="reflect"
    )
    x, _ = reflect.augment(batch, labels)
    padded = F.pad(batch, (4,) * 4, mode="reflect").float() / 255
    windows = padded.unfold(2, 16, 1).unfold(3, 16, 1)  # (B, C, 9, 9, 16, 16): every crop offset
    found = (windows == x[:, :, None, None]).all(-1).all(-1).all(1)  # (B, 9, 9)
    assert (x > 0).all() and (found.flatten(1).sum(1) >= 1).all()
    assert len({tuple(f.nonzero()[0].tolist()) for f in found}) > 5  # offsets drawn per image
    with pytest.raises(UsageError, match="crop_padding=16 must be under the image's size"):
        ImageFolders(str(root), image_size=16, val_size=2, crop_padding=16, crop_padding_mode="reflect")
    with pytest.raises(UsageError, match="crop_padding_mode='edge' must be 'constant' or 'reflect'"):
        ImageFolders(str(root), image_size=16, val_size=2, crop_padding_mode="edge")


@pytest.mark.parametrize(
    "mix", [{"mixup_alpha": 0.4}, {"cutmix_alpha": 1.0}, {"mixup_alpha": 0.2, "cutmix_alpha": 1.0}]
)
def test_mixing_gives_soft_labels_that_sum_to_one(tmp_path, mix):
    data = ImageFolders(str(make_folders(tmp_path)), image_size=16, val_size=2, **mix)
    batch = torch.randint(0, 256, (16, 3, 16, 16), dtype=torch.uint8)
    x, y = data.augment(batch, torch.arange(16) % 3)
    assert x.shape == (16, 3, 16, 16) and y.shape == (16, 3) and y.dtype == torch.float32
    torch.testing.assert_close(y.sum(1), torch.ones(16))


def test_classifier_takes_soft_labels():
    torch.manual_seed(0)
    model = ViTClassifier(
        num_classes=3, image_size=16, in_channels=3, vit=ViTConfig(preset="micro", patch_size=4)
    )
    x, hard = torch.rand(6, 3, 16, 16), torch.tensor([0, 1, 2, 1, 0, 2])
    soft = F.one_hot(hard, 3).float() * 0.7 + 0.1
    with pytest.warns(UserWarning, match="self.log"):  # no trainer attached
        loss = model.training_step((x, soft), 0)
    torch.testing.assert_close(loss, F.cross_entropy(model(x), soft, label_smoothing=0.1))
    predicted = model(x).argmax(1)
    assert model.train_acc.compute() == (predicted == hard).float().mean()


def train_args(root: Path, runs: Path, *extra: str) -> list[str]:
    return [
        "fit",
        "--model.vit.preset", "micro",
        "--model.vit.patch_size", "4",
        "--data", "vit.datamodules.ImageFolders",
        "--data.root", str(root),
        "--data.image_size", "16",
        "--data.batch_size", "8",
        "--data.val_size", "4",
        "--trainer.max_epochs", "1",
        "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--trainer.log_every_n_steps", "1",
        "--trainer.logger.init_args.save_dir", str(runs),
        "--trainer.logger.init_args.name", "folders",
        *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_vit_train_fits_an_image_folder_and_the_checkpoint_rebuilds_it(tmp_path, runs, capsys):
    root = make_folders(tmp_path / "data", per_class={"train": 8, "test": 2})
    cli.main(train_args(root, runs, "--data.mixup_alpha", "0.2"))
    run = runs / "folders" / "version_0"
    assert "class_path: vit.datamodules.ImageFolders" in (run / "config.yaml").read_text()
    with open(run / "metrics.csv") as f:  # MixUp's soft labels: loss and accuracy are logged
        rows = list(csv.DictReader(f))
    assert [float(r["train/acc"]) for r in rows if r.get("train/acc")]
    assert all(math.isfinite(float(r["train/loss"])) for r in rows if r.get("train/loss"))
    model, data = load_checkpoint(run / "checkpoints" / "last.ckpt")
    assert isinstance(data, ImageFolders) and data.root == root and data.classes == ["ant", "bee", "cat"]
    assert (
        model.hparams.num_classes == 3 and model.hparams.image_size == 16 and data.hparams.mixup_alpha == 0.2
    )
    data.setup("test")
    x, y = next(iter(data.test_dataloader()))
    assert model(x).shape == (6, 3)

    # a file that turns out unreadable while fitting: one line naming it, from the command too
    bad = root / "train" / "cat" / "bad.png"
    bad.write_text("oops")
    status, message = command_error(cli.main, train_args(root, runs), capsys)
    assert status == 1 and message.startswith(f"error: cannot read image {bad}")
    status, message = command_error(cli.main, train_args(tmp_path / "missing", runs), capsys)
    assert status != 0  # command_error checks that no traceback was printed
    assert message.startswith(f"error: image folder not found: {tmp_path / 'missing' / 'train'}")


@pytest.mark.slow
def test_a_checkpoint_predicts_and_draws_image_files_where_its_data_is_absent(
    tmp_path, runs, capsys, monkeypatch
):
    """Checkpoints record the class names, so `vit-eval predict` and `vit-attention --images` work
    on a machine without the training folders; evaluating a split there is a one-line error."""
    root = make_folders(tmp_path / "data", per_class={"train": 8, "test": 2})
    cli.main(train_args(root, runs, "--data.resize", "center_crop"))
    ckpt = runs / "folders" / "version_0" / "checkpoints" / "last.ckpt"
    recorded = torch.load(ckpt, weights_only=True)
    assert recorded["datamodule_hyper_parameters"]["classes"] == ["ant", "bee", "cat"]
    assert recorded["preparation"] == {
        "channels": 3, "size": [16, 16], "resize": "center_crop", "pad": 0, "classes": ["ant", "bee", "cat"]
    }  # fmt: skip
    picture = tmp_path / "photo.png"
    write_image(picture, 120, "RGB", (40, 22))
    shutil.rmtree(root)

    # the rebuilt data module prepares images as training did: cropped, not stretched
    wide = Image.new("RGB", (60, 20), (0, 0, 255))
    wide.paste((255, 0, 0), (20, 0, 40, 20))
    _, preparation = load_model(ckpt)
    assert preparation == Preparation(3, 16, "center_crop", classes=("ant", "bee", "cat"))
    crop, stretch = Preparation(3, 16, "center_crop"), Preparation(3, 16)
    assert torch.equal(prepare([wide], preparation)[0], crop.pixels(wide) / 255)
    assert not torch.equal(prepare([wide], preparation)[0], stretch.pixels(wide) / 255)

    # image files need the checkpoint alone: no data module is built
    def refuse(*args, **kwargs):
        raise AssertionError("a data module was built")

    with monkeypatch.context() as patch:
        for cls in (TwoCircles, CIFAR10, ImageFolders, FashionMNIST):
            patch.setattr(cls, "__init__", refuse)
        [result] = predict(PredictOptions(ckpt=ckpt, images=[picture], top_k=2))
        assert result["top_k"][0]["class"] in {"ant", "bee", "cat"} and len(result["top_k"]) == 2
        written = attention(AttentionOptions(ckpt=ckpt, images=[picture], out=tmp_path / "maps", layer=-1))
        assert {png.name for png in written} == {"cls.png", "cls_000_photo.png"}
        with pytest.raises(AssertionError, match="a data module was built"):
            evaluate(
                EvalOptions(ckpt=ckpt), progress=False
            )  # evaluating needs the data (the refusal shows it tried)
    with pytest.raises(DataNotFoundError, match="image folder not found"):
        evaluate(EvalOptions(ckpt=ckpt), progress=False)
    with pytest.raises(DataNotFoundError, match="image folder not found"):
        load_checkpoint(ckpt)  # the data module needs its data

    # another folder with other classes cannot stand in for the recorded ones
    other = make_folders(tmp_path / "other", classes=["dog", "eel"], per_class={"train": 2, "test": 2})
    with pytest.raises(DataError, match=r"missing \['ant', 'bee', 'cat'\], extra \['dog', 'eel'\]"):
        load_checkpoint(ckpt, data={"root": str(other)})


def test_cifar10_and_fashion_mnist_need_their_files_but_not_for_their_preparation(tmp_path):
    for cls, size in ((CIFAR10, 32), (FashionMNIST, 28)):
        with pytest.raises(DataNotFoundError):
            cls(str(tmp_path / "nowhere"))
        preparation = cls.preparation_for({})  # what an older checkpoint of it says
        assert len(preparation.classes) == 10
        assert prepare([Image.new("RGB", (50, 40))], preparation).shape[-2:] == (size, size)


def test_resize_crop_keeps_the_aspect_ratio_and_the_centre(tmp_path, capsys):
    """`resize: center_crop` scales a wide image so that its height fits and keeps the centre square
    (torchvision's Resize then CenterCrop); the default stretches the whole image into the
    square. Splits, the preparation (vit-attention, predict) and the cache agree."""
    root = make_folders(tmp_path)
    wide = Image.new("RGB", (60, 20), (0, 0, 255))  # blue | green | red, in thirds
    wide.paste((0, 255, 0), (20, 0, 40, 20))
    wide.paste((255, 0, 0), (40, 0, 60, 20))
    wide.save(root / "test" / "ant" / "09.png")
    green = torch.tensor([0, 255, 0], dtype=torch.uint8)[:, None, None].expand(3, 8, 8)

    stretched = ImageFolders(str(root), image_size=8, val_size=2)
    cropped = ImageFolders(str(root), image_size=8, val_size=2, resize="center_crop")
    s_images, c_images = stretched.split("test").images, cropped.split("test").images
    # ant's third test file: the green centre (bilinear blends in a little of the neighbours at
    # the edges); stretched, blue on the left and red on the right
    assert torch.equal(c_images[2][:, :, 1:-1], green[:, :, 1:-1]) and (c_images[2][1] >= 224).all()
    assert s_images[2][2, :, 0].float().mean() > 200 and s_images[2][0, :, -1].float().mean() > 200
    assert torch.equal(s_images[:2], c_images[:2])  # flat images: the same either way
    assert torch.equal(prepare([wide], cropped.preparation), c_images[2:3].float() / 255)
    assert torch.equal(prepare([wide], stretched.preparation), s_images[2:3].float() / 255)
    assert cropped.hparams.resize == "center_crop"
    caches = sorted(p.name for p in (root / ".vit-cache").iterdir())
    assert caches == ["test-8x8-RGB-crop.pt", "test-8x8-RGB.pt"]
    with pytest.raises(ValueError, match="resize='squash' must be 'stretch' or 'center_crop'"):
        ImageFolders(str(root), resize="squash")


@pytest.mark.slow
def test_vit_train_runs_data_parallel_on_two_cpu_processes(tmp_path, runs):
    """`--trainer.strategy ddp --trainer.devices 2` on CPU: the two processes split each epoch's
    images (3 steps of 8 per process where one process takes 6), and the epoch-level logs are
    synchronised (no warning asking for sync_dist)."""
    root = make_folders(tmp_path / "photos", per_class={"train": 20, "test": 2})
    ddp = ["--trainer.accelerator", "cpu", "--trainer.strategy", "ddp", "--trainer.devices", "2"]
    result = run_train(
        *train_args(root, runs, "--trainer.max_epochs", "2", "--data.val_size", "6", *ddp),
        cwd=tmp_path, timeout=300, warnings="default",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "sync_dist" not in result.stdout + result.stderr
    with open(runs / "folders" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    minutes = [r for r in rows if r["time/minutes"]]
    assert [int(r["epoch"]) for r in minutes] == [0, 1] and all(r["val/acc"] for r in minutes)
    assert max(int(r["step"]) for r in rows if r["epoch"] == "0") == 2  # steps 0-2: 3 per epoch


class Numbers(InMemoryDataModule):
    """64 one-pixel images numbered 0 to 63 (their labels), in batches of 8."""

    def __init__(self):
        super().__init__(batch_size=8, num_workers=0)

    def split(self, name: str) -> InMemory:
        return InMemory(torch.arange(64).view(64, 1, 1, 1).to(torch.uint8), torch.arange(64), raw=True)


def test_a_training_loader_restored_mid_epoch_gives_the_rest_of_the_epoch_and_what_follows():
    """The training loader's state and its data module's, taken after 3 of 8 batches (as
    Lightning takes them for a checkpoint), make a new data module's loader give the other 5 in
    the same order, then the same next epoch, with the same random numbers drawn between them as
    the loader that went on."""

    def labels(epoch) -> list[list[int]]:
        return [batch[1].tolist() for batch in epoch]

    torch.manual_seed(0)
    data = Numbers()
    first = data.train_dataloader()
    epoch = iter(first)
    seen = [next(epoch) for _ in range(3)]
    state, data_state = first.state_dict(), data.state_dict()
    rest = labels(epoch) + [torch.rand(2).tolist()]  # a random number drawn after the epoch
    following = labels(first)

    torch.manual_seed(123)  # a new process: another random state, which the loader puts back
    again = Numbers()
    again.load_state_dict(data_state)
    second = again.train_dataloader()
    second.load_state_dict(state)
    assert len(second) == 8
    assert labels(second) + [torch.rand(2).tolist()] == rest
    assert labels(second) == following
    assert len({i for b in labels(seen) + rest[:-1] for i in b}) == 64  # the epoch: each image once


def test_each_process_takes_its_share_of_the_epoch_order_as_a_distributed_sampler_would():
    """Two processes, 11 images in batches of 2: each process takes every other index of the
    epoch's order (padded with its first index to 12), as torch's DistributedSampler takes it from
    the same order, in 3 batches; together the shares make the epoch. The loader shows Lightning a
    DistributedSampler, so that it leaves the loader as it is under DDP (in one process, the
    DataLoader's own sampler)."""
    from torch.utils.data import DistributedSampler, SequentialSampler

    dataset = InMemory(torch.arange(11).view(11, 1, 1, 1).to(torch.uint8), torch.arange(11), raw=True)
    order = torch.randperm(11, generator=torch.Generator().manual_seed(5)).tolist()
    shares = []
    for rank in (0, 1):
        loader = batches(dataset, 2, shuffle=True, processes=2, rank=rank)
        assert isinstance(loader.sampler, DistributedSampler) and len(loader) == 3
        loader.batch_sampler.resume_at(5, 0)  # the epoch whose order is drawn with seed 5
        share = [i for _, labels in loader for i in labels.tolist()]
        expected = [order[i] for i in DistributedSampler(order, num_replicas=2, rank=rank, shuffle=False)]
        assert share == expected[:6]
        shares.append(share)
    assert len(set(shares[0]) | set(shares[1])) == 11 and len(shares[0] + shares[1]) == 12
    assert isinstance(batches(dataset, 2, shuffle=True).sampler, SequentialSampler)


def test_a_training_loader_given_the_state_of_a_finished_epoch_starts_the_next_afresh():
    """Where training is counted in steps (max_steps), Lightning hands back the loader's state at
    an epoch's end too: the next epoch is a whole one, not the nothing left of the finished one."""
    dataset = InMemory(torch.arange(64).view(64, 1, 1, 1).to(torch.uint8), torch.arange(64), raw=True)
    first = batches(dataset, 8, shuffle=True)
    finished = [labels for _, labels in first]
    again = batches(dataset, 8, shuffle=True)
    again.load_state_dict(first.state_dict())
    following = [labels for _, labels in again]
    assert len(following) == 8 and torch.cat(following).sort().values.tolist() == list(range(64))
    assert not torch.equal(torch.cat(following), torch.cat(finished))


def test_a_run_resumed_by_another_number_of_processes_goes_on_and_says_it_is_not_exact():
    """A checkpoint written by two processes, resumed by one: the training loader goes on with the
    rest of the checkpoint's epoch, but this process has no random state of its own to put back,
    and the data module warns that the run does not go on as one never stopped would."""
    from vit.datamodules import random_state

    data = TwoCircles(num_train=64, num_val=8, num_test=8, batch_size=8)
    data.setup("fit")
    data.load_state_dict({"random": [random_state(), random_state()]})
    with pytest.warns(
        UserWarning, match="written by 2 processes and the run resumed by 1: it goes on, but not"
    ):
        loader = data.train_dataloader()
    assert loader.random is None
    loader.load_state_dict({"seed": 5, "taken": 2})
    assert len(list(loader)) == 6


def folders_run(root: Path, folder: Path, ckpt_path=None, callbacks=()) -> dict:
    """Two epochs of a micro ViT on `make_folders`' images with random crops and flips, each
    process seeded its own way (`SeedEachProcess`), recording in `folder` what each process trained
    on and the weights it ended with (`SeenImages`): `fit`'s arguments."""
    folder.mkdir(parents=True, exist_ok=True)
    data = ImageFolders(str(root), image_size=16, val_size=4, batch_size=4, crop_padding=2)
    model = ViTClassifier(
        num_classes=3, in_channels=3, image_size=16, vit=ViTConfig(preset="micro", patch_size=8)
    )
    callbacks = [SeenImages(folder), SeedEachProcess(), *callbacks]
    return dict(
        data=data,
        model=model,
        ckpt_path=ckpt_path,
        callbacks=callbacks,
        max_epochs=2,
        default_root_dir=folder,
    )


def assert_same_weights(got: dict, expected: dict) -> None:
    for name, weights in expected.items():
        torch.testing.assert_close(got[name], weights, rtol=0, atol=1e-6, msg=name)


def test_a_run_resumed_mid_epoch_or_at_an_epoch_end_ends_with_the_weights_of_one_never_stopped(tmp_path):
    """One process, 32 images with random crops and flips, 8 steps an epoch: a run resumed from its
    checkpoint at step 3, or from the one written after the validation that ends epoch 0 (as
    last.ckpt is, which `--ckpt_path last` reads to train a finished run longer), trains on the
    batches a run never stopped trained on after it, augmented alike, and ends with its weights."""
    root = make_folders(tmp_path / "data", per_class={"train": 12})
    steps = L.pytorch.callbacks.ModelCheckpoint(tmp_path / "steps", every_n_train_steps=3, save_top_k=-1)
    epochs = L.pytorch.callbacks.ModelCheckpoint(tmp_path / "epochs", every_n_epochs=1, save_top_k=-1)
    fit(**folders_run(root, tmp_path / "never_stopped", callbacks=[steps, epochs]))
    (never_stopped,) = SeenImages.of_processes(tmp_path / "never_stopped", 1)
    assert len(never_stopped["batches"]) == 16
    for ckpt, step in (
        (tmp_path / "steps" / "epoch=0-step=3.ckpt", 3),
        (tmp_path / "epochs" / "epoch=0-step=8.ckpt", 8),
    ):
        fit(**folders_run(root, tmp_path / f"resumed_{step}", ckpt_path=ckpt))
        (resumed,) = SeenImages.of_processes(tmp_path / f"resumed_{step}", 1)
        assert resumed["batches"] == never_stopped["batches"][step:], f"resumed at step {step}"
        assert_same_weights(resumed["weights"], never_stopped["weights"])


@pytest.mark.slow
def test_two_processes_resumed_mid_epoch_end_with_the_weights_of_a_run_never_stopped(tmp_path):
    """DDP on the CPU (gloo, two processes), each seeded its own way, with random crops and flips:
    32 images, 16 a process in 4 batches of 4 each epoch. Resumed from the checkpoint at step 3
    (mid-epoch 0), each process goes on with the batches it had not trained on, augmented alike,
    then epoch 1, and the run ends with the weights of the run never stopped. Each epoch the
    processes' shares are disjoint and make the epoch. (Lightning writes rank 0's checkpoint only:
    the other process's random state is gathered into it.)"""
    root = make_folders(tmp_path / "data", per_class={"train": 12})
    steps = L.pytorch.callbacks.ModelCheckpoint(tmp_path / "steps", every_n_train_steps=3, save_top_k=-1)
    fit_in_two_processes(
        folders_run(root, tmp_path / "never_stopped", callbacks=[steps]),
        folders_run(root, tmp_path / "resumed", ckpt_path=tmp_path / "steps" / "epoch=0-step=3.ckpt"),
    )
    never_stopped, resumed = (
        SeenImages.of_processes(tmp_path / name, 2) for name in ("never_stopped", "resumed")
    )
    assert [len(process["batches"]) for process in never_stopped] == [8, 8]
    for epoch in (0, 1):
        first, second = (
            {tuple(file) for files in process["files"][4 * epoch : 4 * epoch + 4] for file in files}
            for process in never_stopped
        )
        assert len(first) == len(second) == 16 and not first & second
    for rank in (0, 1):
        assert resumed[rank]["batches"] == never_stopped[rank]["batches"][3:], f"rank {rank}"
    assert_same_weights(resumed[0]["weights"], never_stopped[0]["weights"])


@pytest.mark.parametrize("resize", ["stretch", "center_crop"])
@pytest.mark.parametrize("channels", [3, 1])
def test_tensor_pixels_are_pillows_pixels_to_within_one_level(resize, channels):
    """`Preparation.tensor_pixels` (for images decoded as tensors, on a GPU too) against Pillow's
    `pixels`, on noise, the hardest case for a resampler: pictures larger and smaller than the
    output, square and not, crop boxes that fall between pixels, with and without a border."""
    noise = torch.Generator().manual_seed(0)
    sizes = [(32, 32), (48, 40), (21, 29), (64, 51), (7, 5), (100, 33)]  # (width, height)
    outputs = [(32, 32), (20, 36), (36, 20), (9, 9), (64, 80)]  # (height, width)
    for (w, h), size, pad in zip(sizes * 5, [s for s in outputs for _ in sizes], [0, 2] * 15, strict=True):
        array = torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=noise).numpy()
        picture = Image.fromarray(array).convert("RGB" if channels == 3 else "L")
        preparation = Preparation(channels, size, resize, pad=pad if min(size) > 4 else 0)
        tensor = torch.from_numpy(np.array(picture)).reshape(h, w, channels).permute(2, 0, 1)
        got, expected = preparation.tensor_pixels(tensor), preparation.pixels(picture)
        assert got.dtype == torch.uint8 and got.shape == expected.shape == (channels, *size)
        difference = (got.int() - expected.int()).abs()
        assert difference.max() <= 1, ((w, h), size, pad)
    same = torch.randint(0, 256, (channels, 32, 32), dtype=torch.uint8, generator=noise)
    picture = Image.fromarray(same.permute(1, 2, 0).squeeze(-1).numpy())
    for size in [(20, 32), (32, 45), (32, 9)] if resize == "stretch" else []:  # one side already the size:
        preparation = Preparation(channels, size)  # one pass, and then Pillow's very pixels
        assert torch.equal(preparation.tensor_pixels(same), preparation.pixels(picture))
    assert torch.equal(Preparation(channels, 32, resize).tensor_pixels(same), same)  # the size already
    rgb = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8, generator=noise)
    rgb[:, 0, 0] = torch.tensor([0, 62, 229])  # a luma of exactly n + 1/2 - 2^-16: rounds down
    rgb_picture, gray_picture = Image.fromarray(rgb.permute(1, 2, 0).numpy()), Image.fromarray(rgb[0].numpy())
    assert torch.equal(Preparation(1, 32).tensor_pixels(rgb), Preparation(1, 32).pixels(rgb_picture))  # luma
    assert torch.equal(Preparation(3, 32).tensor_pixels(rgb[:1]), Preparation(3, 32).pixels(gray_picture))
