"""What a command runs on: a ViT and its images, and the device.

vit-attention and vit-attention score read a network from a checkpoint (`--ckpt`) or from another
library (`--model SOURCE [--weights FILE]`), and images from files (`--images`) or from the test
split of the checkpoint's data module (its class named by `--datamodule` when it is the user's
own, its arguments changed by `--data KEY=VALUE`); they and vit-eval choose a device
(`--device`). The checks here run before any work and say what is wrong in the words of the flags.

torch is imported inside the functions that use it: `--help` needs none of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from vit.errors import UsageError

if TYPE_CHECKING:
    import lightning as L
    import torch

    from vit.model import ViT

DEVICES = ("auto", "cpu", "cuda")


def torch_device(device: str) -> str:
    """The device to run on: for auto, cuda if PyTorch sees a GPU, else cpu."""
    import torch

    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: PyTorch sees no CUDA device")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def parse_data_options(items: list[str]) -> dict:
    """["test_split=far", "separation=[12, 15]"] -> {"test_split": "far", "separation": [12, 15]}:
    each value read as YAML, so numbers, booleans and lists come out typed."""
    options = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise UsageError(f"--data {item!r} is not KEY=VALUE")
        try:
            options[key] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise UsageError(f"--data {item!r}: the value is not YAML ({' '.join(str(e).split())})") from e
    return options


def check_images(model: str | None, images: list[Path] | None, data: dict | None = None) -> None:
    """A --model, unlike a checkpoint, names no data module: its images come from --images. --data
    changes the data module that gives test images: image files need none."""
    if model is not None and not images:
        raise UsageError("--model has no test set: give image files with --images")
    if images and data:
        raise UsageError("--data changes the data module that gives test images: not with --images")


def check_datamodule(datamodule: L.LightningDataModule) -> None:
    """The commands read a data module's images as vit.datamodules.InMemoryDataModule gives them
    (`split(name)`, `classes`, `evidence(name)`): a data module of the user's own derives from it."""
    from vit.datamodules import InMemoryDataModule

    if not isinstance(datamodule, InMemoryDataModule):
        raise UsageError(
            f"{type(datamodule).__name__} is not a vit.datamodules.InMemoryDataModule: the commands "
            "read its images through split(name) and classes"
        )


def check_counts(num_images: int, batch_size: int) -> None:
    if num_images < 1 or batch_size < 1:
        raise UsageError(f"num_images={num_images} and batch_size={batch_size} must be at least 1")


@dataclass
class Inputs:
    """A ViT and the images a command runs it on: image files, or test images of a data module."""

    model: ViT
    images: torch.Tensor  # (B, C, H, W), prepared as the model expects
    class_names: list[str]
    files: list[Path] | None = None  # the image files, in the order of `images`; or else
    datamodule: L.LightningDataModule | None = None  # the data module whose test split holds them,
    indices: list[int] | None = None  # at these indices,
    labels: torch.Tensor | None = None  # with these labels

    @property
    def description(self) -> str:
        """What the images are, for the printout and the JSON: "8 image files", "512 test images
        of TwoCircles"."""
        if self.datamodule is None:
            return f"{len(self.images)} image files"
        return f"{len(self.images)} test images of {type(self.datamodule).__name__}"

    def evidence(self) -> tuple[torch.Tensor | None, str | None]:
        """The evidence pixels of the images (B, H, W) bool where the data module knows them, and
        else None with the reason in words."""
        from vit.datamodules import ImageFolders

        if self.datamodule is None:
            return None, "image files given with --images carry no evidence"
        pixels = self.datamodule.evidence("test")
        if pixels is not None:
            return pixels[self.indices], None
        why = f"{type(self.datamodule).__name__} does not know which pixels carry its labels"
        if isinstance(self.datamodule, ImageFolders):
            why += f" (no masks in {self.datamodule.root}/masks/test/<class>/<image>.png)"
        return None, why


def load_inputs(
    ckpt: Path | None,
    model: str | None,
    weights: Path | None,
    images: list[Path] | None,
    num_images: int,
    data: dict | None = None,
    datamodule_class: str | None = None,
) -> Inputs:
    """The ViT of a checkpoint (or of `model` with its `weights`) and the images to run it on: the
    files or folders of `images`, prepared as the checkpoint or model says, else `num_images`
    test images of the checkpoint's data module (`spread_test_images`), built as
    `vit.checkpoint.load_checkpoint` builds it with `data` and `datamodule_class`."""
    from vit.checkpoint import load_checkpoint, load_network
    from vit.model import ViT
    from vit.preparation import image_files, read_images

    if images:  # files need the checkpoint (or model) alone: no data module is built
        network, preparation = load_network(ckpt, model, weights, datamodule_class)
        names = list(preparation.classes)
    else:
        classifier, datamodule = load_checkpoint(ckpt, data=data, datamodule_class=datamodule_class)
        if datamodule is None:
            raise ValueError(f"{ckpt} names no data module to take test images from; give --images")
        check_datamodule(datamodule)
        datamodule.prepare_data()  # a download, where the data module was told to make one
        network, names = classifier.model, [str(name) for name in datamodule.classes]
    if not isinstance(network, ViT):
        raise ValueError(f"{ckpt} holds a {type(network).__name__}, not a ViT: it has no attention")
    if images:
        files = image_files(images)
        return Inputs(network, read_images(files, preparation), names, files=files)
    from vit.datamodules import spread_test_images

    batch, labels, indices = spread_test_images(datamodule, num_images)
    return Inputs(network, batch, names, datamodule=datamodule, indices=indices, labels=labels)
