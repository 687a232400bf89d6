"""Data modules. Each exposes `num_classes`, `image_size`, `in_channels` and `classes`, which the
CLI links into the model, so a config names them once."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from vit.model import require


def make_two_circles(
    n: int,
    image_size: int = 32,
    radius: float = 3.0,
    min_separation: float = 10.0,
    max_separation: float = 16.0,
    angle_jitter: float = 10.0,
    noise: float = 0.05,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` images (n, 1, H, W) in [0, 1] holding two identical anti-aliased filled circles.

    The label is the orientation of the line joining the centres: 0 = 0 deg (-), 1 = 45 deg (/),
    2 = 90 deg (|), 3 = 135 deg (\\), each with +-`angle_jitter` degrees. The separation is drawn
    from the same range for every class, so no class is told apart by distance; the midpoint is
    uniform over the positions that keep both circles inside the image.
    """
    g = generator
    labels = torch.randint(0, 4, (n,), generator=g)
    angle = torch.deg2rad(labels * 45.0 + (torch.rand(n, generator=g) * 2 - 1) * angle_jitter)
    dist = min_separation + torch.rand(n, generator=g) * (max_separation - min_separation)
    # Image rows grow downwards, so "/" (45 deg) goes right and up: y offset is -sin.
    offset = torch.stack((dist * torch.cos(angle), -dist * torch.sin(angle)), dim=1)  # (n, 2) x, y
    lo, hi = radius + 0.5, image_size - radius - 0.5
    half = offset.abs() / 2
    mid = lo + half + torch.rand(n, 2, generator=g) * (hi - lo - 2 * half)
    centres = torch.stack((mid - offset / 2, mid + offset / 2), dim=1)  # (n, 2 circles, 2)

    coords = torch.arange(image_size, dtype=torch.float32) + 0.5
    dx = coords[None, None, None, :] - centres[..., 0, None, None]  # (n, 2, 1, W)
    dy = coords[None, None, :, None] - centres[..., 1, None, None]  # (n, 2, H, 1)
    # Coverage of each pixel by a circle, linear over one pixel at the edge (anti-aliasing).
    ink = (radius + 0.5 - (dx**2 + dy**2).sqrt()).clamp(0, 1).amax(dim=1, keepdim=True)
    images = (ink + noise * torch.randn(ink.shape, generator=g)).clamp(0, 1)
    return images, labels


class TwoCircles(L.LightningDataModule):
    """Two identical circles whose relative placement is the label; generated, no files needed.

    Deterministic from `seed`: each split has its own generator, so the validation and test sets
    do not change when the training set size does.
    """

    classes = ("horizontal -", "diagonal /", "vertical |", "diagonal \\")
    num_classes = 4
    in_channels = 1

    def __init__(
        self,
        image_size: int = 32,
        radius: float = 3.0,
        min_separation: float = 10.0,
        max_separation: float = 16.0,
        angle_jitter: float = 10.0,  # degrees; bins are 45 apart, so 25 degrees separate classes
        noise: float = 0.05,
        num_train: int = 20000,
        num_val: int = 2000,
        num_test: int = 2000,
        batch_size: int = 128,
        num_workers: int = 0,
        seed: int = 0,
    ):
        super().__init__()
        for name, value in (("num_train", num_train), ("num_val", num_val), ("num_test", num_test)):
            require(value >= 1, f"{name}={value} must be at least 1")
        require(batch_size >= 1, f"batch_size={batch_size} must be at least 1")
        require(num_workers >= 0, f"num_workers={num_workers} must be >= 0")
        require(radius > 0 and noise >= 0, f"radius={radius} must be > 0 and noise={noise} >= 0")
        if min_separation < 2 * radius + 1:
            raise ValueError(
                f"min_separation={min_separation} lets circles of radius {radius} touch; "
                f"use at least {2 * radius + 1}"
            )
        if max_separation < min_separation:
            raise ValueError(f"max_separation={max_separation} < min_separation={min_separation}")
        if max_separation + 2 * radius + 1 > image_size:
            raise ValueError(
                f"max_separation={max_separation} with radius={radius} does not fit in "
                f"image_size={image_size}"
            )
        if not 0 <= angle_jitter < 22.5:
            raise ValueError(f"angle_jitter={angle_jitter} must be in [0, 22.5) degrees")
        self.save_hyperparameters()
        self.image_size = image_size
        self.splits: dict[str, TensorDataset] = {}

    def _split(self, name: str) -> TensorDataset:
        if name not in self.splits:
            hp = self.hparams
            index = ("train", "val", "test").index(name)
            g = torch.Generator().manual_seed(hp.seed * 3 + index)
            n = {"train": hp.num_train, "val": hp.num_val, "test": hp.num_test}[name]
            images, labels = make_two_circles(
                n, hp.image_size, hp.radius, hp.min_separation, hp.max_separation,
                hp.angle_jitter, hp.noise, generator=g,
            )  # fmt: skip
            self.splits[name] = TensorDataset(images, labels)
        return self.splits[name]

    def setup(self, stage: str) -> None:
        wanted = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}
        for name in wanted.get(stage, ("test",)):
            self._split(name)

    def _loader(self, name: str, shuffle: bool = False) -> DataLoader:
        return DataLoader(
            self._split(name),
            batch_size=self.hparams.batch_size,
            shuffle=shuffle,
            num_workers=self.hparams.num_workers,
            drop_last=shuffle and len(self._split(name)) > self.hparams.batch_size,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test")
