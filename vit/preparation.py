"""How an image becomes model input: one small description, and the function that applies it.

A `Preparation` says how a picture of any size and mode becomes what a model saw in training:
its channels (grayscale or RGB), its size, how it is fitted to that size (stretched, or the
shorter side fitted and the centre cropped; then an optional black border), and the class names
of the model's outputs. A data module produces one (`datamodule.preparation`), vit-train stores
it in every checkpoint, and every command prepares image files with it, so a checkpoint is enough
to classify or draw image files: no data module, no data files. `Preparation.pixels` applies it to
a PIL image; `tensor_pixels` to an image decoded as a tensor on any device, in the same arithmetic.
Like timm's `pretrained_cfg` and Hugging Face's `preprocessor_config.json`, minus the mean/std:
images stay in [0, 1] here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image, ImageOps

from vit.errors import DataError, one_line, require

MODES = {1: "L", 3: "RGB"}  # channels -> Pillow mode
RESIZES = ("stretch", "center_crop")
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
# what Pillow raises for a file it cannot decode
BAD_IMAGE = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


@dataclass(frozen=True)
class Preparation:
    """How a picture becomes a model input of `channels` x `size`.

    The picture is converted to grayscale or RGB (alpha dropped; a palette image goes through RGBA
    so its transparency is read too), resized with bilinear filtering to `size` less a border of
    `pad` black pixels on each side (`resize`: "stretch" to it, or "center_crop": scaled so that
    it covers it with the aspect ratio kept, then cropped around the centre, like torchvision's
    Resize then CenterCrop; PIL crops before it resizes, so edge pixels can differ slightly),
    then padded with that border (Fashion-MNIST's 28x28 images in a 32x32 model).
    """

    channels: int  # 1 (grayscale) or 3 (RGB)
    size: tuple[int, int]  # (height, width) of the model input
    resize: str = "stretch"
    pad: int = 0
    classes: tuple[str, ...] = field(default=())  # names of the model's outputs, in order
    # other names of the same outputs that folders may be named by: ImageNet's synsets (n01440764)
    class_ids: tuple[str, ...] = field(default=())

    def __post_init__(self):
        size = (self.size, self.size) if isinstance(self.size, int) else tuple(int(s) for s in self.size)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "classes", tuple(str(c) for c in self.classes))
        object.__setattr__(self, "class_ids", tuple(str(c) for c in self.class_ids))
        require(
            not self.class_ids or len(self.class_ids) == len(self.classes),
            f"{len(self.class_ids)} class ids for {len(self.classes)} classes",
        )
        require(self.channels in MODES, f"channels={self.channels} must be 1 (grayscale) or 3 (RGB)")
        require(self.resize in RESIZES, f"resize={self.resize!r} must be 'stretch' or 'center_crop'")
        require(self.pad >= 0, f"pad={self.pad} must be >= 0")
        require(min(size) > 2 * self.pad, f"size={size} leaves no room inside a border of {self.pad}")

    @property
    def mode(self) -> str:
        return MODES[self.channels]

    def to_dict(self) -> dict:
        """Plain lists, strings and numbers: what a checkpoint stores."""
        values = {**asdict(self), "size": list(self.size), "classes": list(self.classes)}
        if self.class_ids:
            values["class_ids"] = list(self.class_ids)
        else:
            del values["class_ids"]
        return values

    @classmethod
    def from_dict(cls, values: dict) -> Preparation:
        return cls(**values)

    def pixels(self, image: Image.Image) -> torch.Tensor:
        """A PIL image -> uint8 (C, H, W), prepared as described above."""
        height, width = (s - 2 * self.pad for s in self.size)
        if image.mode == "P":
            image = image.convert("RGBA")
        if image.mode != self.mode:
            image = image.convert(self.mode)
        if image.size != (width, height):
            if self.resize == "center_crop":
                image = ImageOps.fit(image, (width, height), Image.Resampling.BILINEAR)
            else:
                image = image.resize((width, height), Image.Resampling.BILINEAR)
        pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        pixels = pixels.view(height, width, self.channels).permute(2, 0, 1)
        return F.pad(pixels, (self.pad,) * 4) if self.pad else pixels

    def tensor_pixels(self, image: torch.Tensor) -> torch.Tensor:
        """A decoded image, uint8 (C, h, w), grayscale or RGB, on any device ->
        uint8 (C, H, W) on that device: Pillow's resampling in `pixels`, in its fixed-point
        arithmetic, as two matrix products (rows, then columns, each rounded to 8 bits). The same
        pixels where one pass is needed; within one level where Pillow takes the columns first."""
        height, width = (s - 2 * self.pad for s in self.size)
        if image.shape[0] == 3 and self.channels == 1:  # Pillow's "L": ITU-R 601-2 luma, 16-bit fixed point
            r, g, b = image.int()  # Python-number weights: nothing is built on the image's device
            image = ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16)[None].to(torch.uint8)
        elif image.shape[0] == 1 and self.channels == 3:
            image = image.expand(3, -1, -1)
        h, w = image.shape[-2:]
        if (h, w) != (height, width):
            left, top, right, bottom = 0.0, 0.0, float(w), float(h)
            if self.resize == "center_crop":  # ImageOps.fit's centred box of the output's shape
                ratio = width / height
                crop_w, crop_h = (
                    (w, h) if w / h == ratio else (ratio * h, h) if w / h > ratio else (w, w / ratio)
                )
                left, top = (w - crop_w) / 2, (h - crop_h) / 2
                # Pillow's C code holds the box in single precision
                left, top, right, bottom = torch.tensor([left, top, left + crop_w, top + crop_h]).tolist()
            pixels = image.double()  # exact: 8-bit pixels times 22-bit weights, summed
            if (w, left, right) != (width, 0, w):  # Pillow resamples rows first, rounded to 8 bits
                pixels = (pixels @ bilinear_weights(w, left, right, width, image.device).T).add_(0.5).floor_()
            if (h, top, bottom) != (height, 0, h):
                pixels = (bilinear_weights(h, top, bottom, height, image.device) @ pixels).add_(0.5).floor_()
            image = pixels.to(torch.uint8)  # in [0, 255]: the weights are positive and sum to 1
        return F.pad(image, (self.pad,) * 4) if self.pad else image


def bilinear_weights(size: int, start: float, end: float, out: int, device: torch.device) -> torch.Tensor:
    """(out, size) weights of Pillow's bilinear resampling of the span [start, end) of a line of
    `size` pixels into `out` pixels (Pillow's Resample.c): output pixel i is centred at
    start + (i + 0.5) * scale on the input; a triangle filter of half-width 1, widened by the
    scale when it shrinks (which is its antialiasing), weighs the input pixels of its window;
    each row sums to 1 and, as Pillow does for 8-bit images, is rounded to multiples of 2^-22."""
    scale = (
        torch.tensor(end) - torch.tensor(start)
    ).item() / out  # the difference in single precision, as Pillow
    support = max(scale, 1.0)
    centre = start + (torch.arange(out, device=device, dtype=torch.float64) + 0.5) * scale
    x = torch.arange(size, device=device, dtype=torch.float64)
    low = (centre - support + 0.5).trunc().clamp(min=0)[:, None]
    high = (centre + support + 0.5).trunc().clamp(max=size)[:, None]
    weights = (1 - ((x - centre[:, None] + 0.5) * (1 / support)).abs()).clamp(min=0) * (
        (x >= low) & (x < high)
    )
    return (weights / weights.sum(1, keepdim=True) * 2**22 + 0.5).floor() / 2**22


def for_the_device(images: torch.Tensor, network: object) -> torch.Tensor:
    """Images as `network` takes them fastest: channels-last (NHWC) where it has convolutions,
    which run the faster NHWC kernels (cuDNN's on a GPU, oneDNN's on a CPU: on a 2-core Zen 3 in fp32
    the CPU config's training step took 1.16-1.25x the images per second, its inference
    1.17-1.19x; `benchmarks/memory_format.py`, docs/speed.md). As they are for a network without
    convolutions (plain patches): there the copy buys nothing at inference, and the allocator
    keeps each step's copy (vit-train's peak memory grew with the epoch's steps). The
    classifier's steps and `vit.metrics.predict_probabilities` (vit-eval) hand every batch over so."""
    convolves = isinstance(network, torch.nn.Module) and any(
        isinstance(m, torch.nn.Conv2d) for m in network.modules()
    )
    if images.ndim == 4 and convolves:
        return images.contiguous(memory_format=torch.channels_last)
    return images


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 pixels -> float32 in [0, 1], the form every model input takes (float stays as it is)."""
    return images.float().div_(255) if images.dtype == torch.uint8 else images


def prepare(pictures: list[Image.Image], preparation: Preparation) -> torch.Tensor:
    """PIL images -> float32 (N, C, H, W) in [0, 1], ready for the model."""
    return to_float(torch.stack([preparation.pixels(picture) for picture in pictures]))


def read_images(files: list[str | Path], preparation: Preparation) -> torch.Tensor:
    """Image files -> float32 (N, C, H, W) in [0, 1]; a file Pillow cannot read is a DataError
    that names it."""
    images = []
    for file in files:
        try:
            with Image.open(file) as picture:
                images.append(preparation.pixels(picture))
        except BAD_IMAGE as e:
            raise DataError(f"cannot read image {file}: {one_line(e)}") from e
    return to_float(torch.stack(images))


def image_files(paths: list[Path]) -> list[Path]:
    """The files named, and the image files in the folders named (sorted), in order."""
    files = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise FileNotFoundError(f"no image files ({', '.join(sorted(IMAGE_SUFFIXES))}) in {path}")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"image not found: {path}")
    return files
