"""Data modules for real images: CIFAR-10, folders of image files, Fashion-MNIST.

The pipeline is the same for the three:

- **Decode once.** Each split is decoded into one uint8 tensor (N, C, H, W) plus int64 labels and
  kept in memory. Folders of image files are decoded by a few threads, with a progress bar, and
  the result is cached on disk in `<root>/.vit-cache/` (or `~/.cache/vit/` when the data folder is
  read-only), keyed by a signature of the file names, sizes and modification times: the next run
  loads it in a fraction of a second, and a changed file rebuilds it. CIFAR-10's pickled batches
  and Fashion-MNIST's IDX files are arrays already and are read directly.
- **Cheap loaders.** A batch is one index into the in-memory tensor (`InMemory.__getitems__`):
  no per-image work, `num_workers: 0` is enough.
- **Augment whole batches on the device.** The training loader yields uint8 batches;
  `on_after_batch_transfer` (training only) crops and flips every image with its own random
  offsets and mirror, applies an optional TrivialAugment/RandAugment policy, converts to float and
  optionally mixes images (MixUp, CutMix: soft labels), on the GPU when there is one.

Contract (vit-eval and vit-attention rely on it): the validation, test and predict loaders yield
`(images, labels)` ready for the model, no hook needed: images float32 (N, C, H, W) in [0, 1],
labels int64 (N,). The training loader yields uint8 images, which `on_after_batch_transfer` turns
into the same float form (augmented). `preprocess(pil_images)` prepares PIL images exactly as the
test split is: converted to the data module's mode (RGB, or L for one channel), resized to
`image_size` (bilinear; stretched, or for ImageFolders with `resize: center_crop` cropped around the
centre), divided by 255. There is no mean/std normalisation: the patch embedding is
linear, so it represents any per-channel affine map of the pixels exactly, and [0, 1] images can
be drawn as they are.
"""

from __future__ import annotations

import contextvars
import gzip
import hashlib
import os
import pickle
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2
from tqdm import tqdm

from vit.model import require

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
FASHION_MNIST_NAMES = [name for pair in FASHION_MNIST_FILES.values() for name in pair]
POLICIES = {"trivial": v2.TrivialAugmentWide, "randaugment": v2.RandAugment}
USER_CACHE = Path.home() / ".cache" / "vit"  # the cache when the data folder is read-only
CACHE_VERSION = 1  # bump when the decoding changes, so old caches are rebuilt
DECODE_THREADS = min(4, os.cpu_count() or 1)  # Pillow decodes without the GIL; more gains little
BAD_IMAGE = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)  # what Pillow raises


class DataError(ValueError):
    """Missing, unreadable or inconsistent data files; vit-train prints it as one line."""


class DataNotFoundError(DataError, FileNotFoundError):
    """The data files are not where the data module was told to look."""


# Inside `files_optional()`, a data module whose files are absent is built all the same: it
# names its classes and prepares pictures (`preprocess`), and reading a split raises.
_FILES_OPTIONAL = contextvars.ContextVar("files_optional", default=False)


@contextmanager
def files_optional():
    """Build data modules without their files (for a checkpoint used on image files elsewhere)."""
    token = _FILES_OPTIONAL.set(True)
    try:
        yield
    finally:
        _FILES_OPTIONAL.reset(token)


def files_missing(message: str) -> None:
    """The data files are absent: a DataNotFoundError, unless inside `files_optional()`."""
    if not _FILES_OPTIONAL.get():
        raise DataNotFoundError(message)


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def to_pixels(image: Image.Image, mode: str, size: int | tuple[int, int], crop: bool = False) -> torch.Tensor:
    """A PIL image -> uint8 (C, H, W): converted to `mode` ("RGB" or "L"), resized (bilinear) to
    `size` (H, W), or (size, size) for an int: stretched to it, or with `crop` scaled to cover
    it with its aspect ratio kept and cropped to it around the centre (like torchvision's Resize
    then CenterCrop; PIL crops before it resizes, so edge pixels can differ slightly). Alpha is
    dropped; a palette image goes through RGBA so that its transparency is read too."""
    height, width = (size, size) if isinstance(size, int) else size
    if image.mode == "P":
        image = image.convert("RGBA")
    if image.mode != mode:
        image = image.convert(mode)
    if image.size != (width, height):
        if crop:
            image = ImageOps.fit(image, (width, height), Image.Resampling.BILINEAR)
        else:
            image = image.resize((width, height), Image.Resampling.BILINEAR)
    pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    return pixels.view(height, width, len(mode)).permute(2, 0, 1)


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 pixels -> float32 in [0, 1], the form every model input takes."""
    return images.float().div_(255)


def random_crop_flip(images: torch.Tensor, padding: int, flip: bool) -> torch.Tensor:
    """Per-sample random crops of the zero-padded images and per-sample horizontal flips, as one
    gather: sample i reads rows dy_i + (0..H-1) and columns dx_i + (0..W-1), the columns
    reversed when it is mirrored. (B, C, H, W) of any dtype, on any device."""
    b, c, h, w = images.shape
    device = images.device
    padded = F.pad(images, (padding,) * 4) if padding else images
    dy = torch.randint(0, 2 * padding + 1, (b, 1), device=device)
    dx = torch.randint(0, 2 * padding + 1, (b, 1), device=device)
    rows = dy + torch.arange(h, device=device)  # (B, H)
    cols = dx + torch.arange(w, device=device)  # (B, W)
    if flip:
        mirrored = torch.rand(b, 1, device=device) < 0.5
        cols = torch.where(mirrored, cols.flip(1), cols)
    batch = torch.arange(b, device=device)[:, None, None, None]
    channel = torch.arange(c, device=device)[None, :, None, None]
    return padded[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]


def holdout(n: int, val_size: int | float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (train, val) of a seeded random split of range(n), each in increasing order:
    `val_size` images (an int) or that fraction of them (a float below 1) go to validation."""
    count = round(val_size * n) if isinstance(val_size, float) else val_size
    require(1 <= count < n, f"val_size={val_size} leaves no training or no validation images of {n}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return order[count:].sort().values, order[:count].sort().values


# ---------------------------------------------------------------- folders of image files


def class_folders(folder: Path) -> list[str]:
    """Sorted names of the class folders (visible sub-folders) of a split folder."""
    if not folder.is_dir():
        raise DataNotFoundError(f"folder not found: {folder}")
    names = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not names:
        raise DataError(f"{folder} holds no class folders; expected {folder}/<class>/<image files>")
    return names


def check_same_classes(folder: Path, classes: list[str], reference: Path | str) -> None:
    """`folder` has one class folder per name in `classes` (in any order), and no others."""
    found = class_folders(folder)
    if set(found) != set(classes):
        missing, extra = sorted(set(classes) - set(found)), sorted(set(found) - set(classes))
        raise DataError(
            f"{folder} must have the class folders of {reference}: missing {missing or 'none'}, "
            f"extra {extra or 'none'}"
        )


def list_images(folder: Path, classes: list[str]) -> tuple[list[str], torch.Tensor, str]:
    """The files under `folder/<class>/` (recursively, hidden ones left out) in sorted order,
    their labels, and a signature of their names, sizes and modification times. (Plain strings:
    pathlib would triple the time this takes for 60,000 files.)"""
    files, labels, digest = [], [], hashlib.sha256()
    start = len(str(folder)) + 1
    for label, name in enumerate(classes):
        found = []
        for directory, subdirs, names in os.walk(os.path.join(folder, name)):
            subdirs[:] = [d for d in subdirs if not d.startswith(".")]
            found += [os.path.join(directory, n) for n in names if not n.startswith(".")]
        for path in sorted(found):
            stat = os.stat(path)
            digest.update(f"{path[start:]}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
            files.append(path)
            labels.append(label)
    return files, torch.tensor(labels, dtype=torch.int64), digest.hexdigest()


def decode_images(
    files: list[str], mode: str, size: int, on_bad_file: str, desc: str, crop: bool = False
) -> tuple[torch.Tensor, list[int], list[str]]:
    """Decode `files` into uint8 (N, C, size, size) with a few threads and a progress bar
    (`to_pixels`, `crop` as there). Returns the images, the indices of the files that could not
    be read, and why."""
    images = torch.empty(len(files), len(mode), size, size, dtype=torch.uint8)

    def decode(chunk: range) -> list[tuple[int, str]]:
        bad = []
        for i in chunk:
            try:
                with Image.open(files[i]) as image:
                    images[i] = to_pixels(image, mode, size, crop)
            except BAD_IMAGE as e:
                bad.append((i, f"{type(e).__name__}: {one_line(e)}"))
        return bad

    chunks = [range(i, min(i + 256, len(files))) for i in range(0, len(files), 256)]
    bad: list[tuple[int, str]] = []
    with ThreadPoolExecutor(DECODE_THREADS) as pool, tqdm(total=len(files), desc=desc, unit="img") as bar:
        for chunk, failed in zip(chunks, pool.map(decode, chunks), strict=True):
            bar.update(len(chunk))
            bad += failed
            if bad and on_bad_file == "error":
                pool.shutdown(cancel_futures=True)
                index, reason = bad[0]
                raise DataError(
                    f"cannot read image {files[index]} ({reason}); remove it, or pass on_bad_file=skip"
                )
    return images, [i for i, _ in bad], [reason for _, reason in bad]


def writable(folder: Path) -> bool:
    """Whether a cache may go into `folder`: it is writable and its permission bits allow writing
    (root may write anywhere, but a data share without write bits is meant to stay as it is)."""
    return os.access(folder, os.W_OK) and bool(folder.stat().st_mode & 0o222)


def cache_folders(root: Path) -> list[Path]:
    """Where the cache of a data folder may go, in order of preference."""
    root = root.resolve()
    user = USER_CACHE / f"{root.name}-{hashlib.sha256(str(root).encode()).hexdigest()[:12]}"
    return [root / ".vit-cache", user] if writable(root) else [user]


def report(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load_cache(path: Path, signature: str) -> dict | None:
    """The cache at `path` if it exists and was made from the same files, else None."""
    if not path.is_file():
        return None
    try:
        cache = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError):
        return None  # unreadable (an interrupted write from an older version): rebuild it
    ok = isinstance(cache, dict) and cache.get("signature") == signature
    return cache if ok and cache.get("version") == CACHE_VERSION else None


def save_cache(root: Path, name: str, cache: dict) -> Path | None:
    """Write the cache into the first folder of `cache_folders(root)` that takes it, atomically
    (several processes may build it at once). None if no folder does."""
    for folder in cache_folders(root):
        path = folder / name
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            torch.save(cache, tmp)
            os.replace(tmp, path)
            return path
        except OSError:
            tmp.unlink(missing_ok=True)
    return None


def read_image_folder(
    root: Path, split: str, classes: list[str], size: int, mode: str, on_bad_file: str, crop: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The images of `root/<split>/<class>/*` as uint8 (N, C, size, size) and their labels,
    from the cache when it matches the files, else decoded (and cached); `crop` as in `to_pixels`."""
    folder = root / split
    files, labels, signature = list_images(folder, classes)
    if not files:
        raise DataError(f"no files in the class folders of {folder}")
    suffix = "-crop" if crop else ""  # stretched images keep the cache name they always had
    signature = f"{signature}:{size}:{mode}{suffix}"
    name = f"{split}-{size}x{size}-{mode}{suffix}.pt"
    start = time.perf_counter()
    for path in (cache_folder / name for cache_folder in cache_folders(root)):
        if (cache := load_cache(path, signature)) is not None:
            seconds = time.perf_counter() - start
            report(f"loaded {len(cache['labels'])} images of {folder} from {path} in {seconds:.1f} s")
            break
    else:
        images, bad, reasons = decode_images(files, mode, size, on_bad_file, f"decoding {folder}", crop)
        keep = torch.ones(len(files), dtype=torch.bool)
        keep[bad] = False
        skipped = [f"{files[i]} ({reason})" for i, reason in zip(bad, reasons, strict=True)]
        cache = {
            "version": CACHE_VERSION,
            "signature": signature,
            "images": images[keep],
            "labels": labels[keep],
            "skipped": skipped,
        }
        path = save_cache(root, name, cache)
        where = f"cached in {path}" if path else "no writable cache folder, not cached"
        report(
            f"decoded {int(keep.sum())} images of {folder} in {time.perf_counter() - start:.1f} s; {where}"
        )
    if skipped := cache["skipped"]:
        if on_bad_file == "error":
            raise DataError(f"cannot read image {skipped[0]}; remove it, or pass on_bad_file=skip")
        report(f"warning: skipped {len(skipped)} unreadable files in {folder}, the first: {skipped[0]}")
    if not len(cache["labels"]):
        raise DataError(f"no readable images in {folder}")
    return cache["images"], cache["labels"]


# ---------------------------------------------------------------- IDX files (MNIST, Fashion-MNIST)


def read_idx(path: Path) -> torch.Tensor:
    """An IDX file of unsigned bytes (gzipped if it ends in .gz) as a uint8 tensor of its shape."""
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"cannot read {path}: {one_line(e)}") from e
    if len(data) < 4 or data[:3] != b"\x00\x00\x08":
        raise DataError(f"{path} is not an IDX file of unsigned bytes")
    ndim = data[3]
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    pixels = data[4 + 4 * ndim :]
    if len(pixels) != torch.Size(shape).numel():
        raise DataError(f"{path} holds {len(pixels)} bytes after its header, expected shape {shape}")
    return torch.frombuffer(bytearray(pixels), dtype=torch.uint8).view(shape)


# ---------------------------------------------------------------- data modules


class InMemory(Dataset):
    """Images (N, C, H, W) uint8 and labels (N,), indexed a whole batch at a time: the loader's
    batch sampler hands `__getitems__` a batch of indices, and it returns the batch with one index
    operation. With `scale`, images come out float in [0, 1] (evaluation), else uint8 (training:
    the data module augments and converts them on the device)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, scale: bool):
        self.images, self.labels, self.scale = images, labels, scale

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index):
        images = self.images[index]
        return (to_float(images) if self.scale else images), self.labels[index]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return self[torch.as_tensor(indices)]


def whole_batch(batch):
    """collate_fn for `InMemory`: the batch is already made."""
    return batch


class ImageDataModule(L.LightningDataModule):
    """What CIFAR10, ImageFolders and FashionMNIST share: splits decoded once into uint8 tensors,
    held-out validation, whole-batch loaders and batched augmentation on the device.

    The validation, test and predict loaders yield float32 images in [0, 1] ready for the model.
    The training loader yields uint8 images; `on_after_batch_transfer` augments them and
    converts them to float in [0, 1] (see `augment`). `preprocess` prepares PIL images as the test
    split is. Subclasses set `classes`, `image_size` and `in_channels` through this constructor and
    implement `read_split`.
    """

    has_val_split = False  # True when the data has its own validation split; else it is held out
    crop = False  # resize by cropping around the centre instead of stretching (`to_pixels`)

    def __init__(
        self,
        root: str,
        *,
        classes: list[str],
        image_size: int,
        in_channels: int,
        val_size: int | float,
        batch_size: int = 128,
        seed: int = 0,  # draws the held-out validation images
        crop_padding: int = 4,  # random crops of the image padded by this many zero pixels; 0: none
        flip: bool = True,  # random horizontal flips
        policy: Literal["none", "trivial", "randaugment"] = "none",
        policy_groups: int = 16,  # a policy draws one operation per group of the batch
        mixup_alpha: float = 0.0,  # 0: no MixUp
        cutmix_alpha: float = 0.0,  # 0: no CutMix; with both, each batch uses one of the two
        num_workers: int = 0,  # whole-batch indexing of a tensor in memory needs no workers
    ):
        super().__init__()
        require(batch_size >= 1, f"batch_size={batch_size} must be at least 1")
        require(num_workers >= 0, f"num_workers={num_workers} must be >= 0")
        require(crop_padding >= 0, f"crop_padding={crop_padding} must be >= 0")
        require(
            policy in ("none", *POLICIES), f"unknown policy {policy!r}; choose none, {', '.join(POLICIES)}"
        )
        require(policy_groups >= 1, f"policy_groups={policy_groups} must be at least 1")
        require(mixup_alpha >= 0 and cutmix_alpha >= 0, "mixup_alpha and cutmix_alpha must be >= 0")
        valid_fraction = isinstance(val_size, float) and 0 < val_size < 1
        require(
            valid_fraction or (isinstance(val_size, int) and val_size >= 1),
            f"val_size={val_size} must be a count (an integer >= 1) or a fraction in (0, 1)",
        )
        self.root = Path(root).expanduser()
        self.classes = list(classes)
        self.num_classes = len(self.classes)
        self.image_size = image_size
        self.in_channels = in_channels
        self.mode = {1: "L", 3: "RGB"}[in_channels]
        self.val_size, self.batch_size, self.seed, self.num_workers = val_size, batch_size, seed, num_workers
        self.crop_padding, self.flip, self.policy_groups = crop_padding, flip, policy_groups
        self.policy = POLICIES[policy]() if policy != "none" else None
        mixes = [
            mix(alpha=alpha, num_classes=self.num_classes)
            for mix, alpha in ((v2.MixUp, mixup_alpha), (v2.CutMix, cutmix_alpha))
            if alpha > 0
        ]
        self.mix = v2.RandomChoice(mixes) if len(mixes) > 1 else (mixes[0] if mixes else None)
        self.splits: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # name -> (uint8 images, labels)

    def read_split(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 images (N, C, H, W) and int64 labels (N,) of split "train", "test" (and "val"
        when `has_val_split`)."""
        raise NotImplementedError

    def pixels(self, image: Image.Image) -> torch.Tensor:
        """One PIL image as uint8 (C, H, W), as the splits are made."""
        return to_pixels(image, self.mode, self.image_size, self.crop)

    def preprocess(self, images: list[Image.Image]) -> torch.Tensor:
        """PIL images -> float32 (N, C, H, W) in [0, 1], prepared exactly as the test split is."""
        return to_float(torch.stack([self.pixels(image) for image in images]))

    def split(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Split "train", "val" or "test" as (uint8 images, labels), read on first use."""
        if name not in self.splits:
            if name in ("train", "val") and not self.has_val_split:
                images, labels = self.read_split("train")
                train, val = holdout(len(labels), self.val_size, self.seed)
                self.splits["train"] = images[train], labels[train]
                self.splits["val"] = images[val], labels[val]
            else:
                self.splits[name] = self.read_split(name)
        return self.splits[name]

    def setup(self, stage: str) -> None:
        wanted = {"fit": ("train", "val"), "validate": ("val",)}
        for name in wanted.get(stage, ("test",)):
            self.split(name)

    def _loader(self, name: str, train: bool = False) -> DataLoader:
        images, labels = self.split(name)
        return DataLoader(
            InMemory(images, labels, scale=not train),
            batch_size=self.batch_size,
            shuffle=train,
            drop_last=train and len(labels) > self.batch_size,
            collate_fn=whole_batch,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test")

    def augment(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A training batch of uint8 images (B, C, H, W), on any device -> augmented float32 images
        in [0, 1], and the labels: (B,) class indices, or (B, num_classes) probabilities when MixUp
        or CutMix is on.

        Crops and flips draw per image. A torchvision v2 policy draws one operation and magnitude
        per call, for the whole tensor it is given, so it is applied to `policy_groups` groups of
        the batch separately: images of a group share a draw, different groups do not."""
        images = random_crop_flip(images, self.crop_padding, self.flip)
        if self.policy is not None:
            images = torch.cat([self.policy(group) for group in images.chunk(self.policy_groups)])
        images = to_float(images)
        if self.mix is not None:
            images, labels = self.mix(images, labels)
        return images, labels

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        if self.trainer is not None and self.trainer.training:
            return self.augment(*batch)
        return batch


class CIFAR10(ImageDataModule):
    """CIFAR-10: 32x32 RGB images of 10 classes, 50,000 for training and 10,000 for testing.

    `root` holds either torchvision's copy, `root/cifar-10-batches-py/` (downloaded there with
    `download: true` where there is network), or image folders `root/train/<class>/*` and
    `root/test/<class>/*` named after the 10 classes (such as a JPEG copy; decoded once and
    cached). `val_size` training images, drawn with `seed`, are held out for validation; the test
    split is used only by `test`.
    """

    def __init__(self, root: str = "data/cifar10", download: bool = False, val_size: int = 5000, **kwargs):
        super().__init__(
            root, classes=CIFAR10_CLASSES, image_size=32, in_channels=3, val_size=val_size, **kwargs
        )
        self.save_hyperparameters()
        self.download = download
        if (self.root / "cifar-10-batches-py").is_dir() or (download and not (self.root / "train").is_dir()):
            self.layout = "torchvision"
        elif (self.root / "train").is_dir():
            self.layout = "folders"
            check_same_classes(self.root / "train", CIFAR10_CLASSES, Path("CIFAR-10"))
        else:
            files_missing(self.where_to_put_files())
            self.layout = None  # no files: pictures only

    def where_to_put_files(self) -> str:
        return (
            f"CIFAR-10 not found in {self.root}: put torchvision's cifar-10-batches-py folder there "
            f"(extracted from cifar-10-python.tar.gz; download: true fetches it where there is network), "
            f"or image folders {self.root}/train/<class>/ and {self.root}/test/<class>/"
        )

    def prepare_data(self) -> None:
        if self.layout == "torchvision" and self.download:
            from torchvision.datasets import CIFAR10 as TorchvisionCIFAR10

            try:
                for train in (True, False):
                    TorchvisionCIFAR10(str(self.root), train=train, download=True)
            except (OSError, RuntimeError) as e:
                raise DataError(f"download failed ({one_line(e)}); {self.where_to_put_files()}") from e

    def read_split(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        if self.layout is None:
            raise DataNotFoundError(self.where_to_put_files())
        if self.layout == "folders":
            if not (self.root / name).is_dir():
                raise DataNotFoundError(
                    f"CIFAR-10 {name} images not found: expected {self.root}/{name}/<class>/"
                )
            check_same_classes(self.root / name, CIFAR10_CLASSES, Path("CIFAR-10"))
            return read_image_folder(self.root, name, self.classes, 32, "RGB", on_bad_file="error")
        from torchvision.datasets import CIFAR10 as TorchvisionCIFAR10

        try:
            data = TorchvisionCIFAR10(str(self.root), train=name == "train", download=False)
        except RuntimeError as e:  # torchvision: "Dataset not found or corrupted"
            raise DataNotFoundError(f"{one_line(e)} ({self.root}); {self.where_to_put_files()}") from e
        images = torch.from_numpy(data.data).permute(0, 3, 1, 2).contiguous()  # (N, H, W, C) -> (N, C, H, W)
        return images, torch.tensor(data.targets, dtype=torch.int64)


class ImageFolders(ImageDataModule):
    """Folders of image files: `root/train/<class>/*`, and `root/val/` and/or `root/test/` with the
    same class folders. Classes are the sorted folder names, or `classes` in the order given
    (checkpoints record them, and a folder evaluated later must have the same class folders).

    Images of any size and mode (grayscale, palette, RGBA, ...) are converted to RGB, or to
    grayscale with `channels: 1`, and resized to `image_size` x `image_size` (bilinear):
    stretched to the square (`resize: stretch`, the default), or with `resize: center_crop` scaled so
    that the shorter side fits, the aspect ratio kept, and the centre square cropped (like
    torchvision's Resize then CenterCrop); the same for images given later to vit-eval's predict
    and vit-attention. Without `root/val/`, `val_size` training images (a count, or a fraction below 1) drawn
    with `seed` are held out for validation. A file that cannot be decoded stops the run with an
    error naming it (`on_bad_file: error`) or is skipped and counted (`skip`). Decoded splits are
    cached (see the module docstring).
    """

    def __init__(
        self,
        root: str,
        image_size: int = 32,
        channels: Literal[1, 3] = 3,
        val_size: int | float = 0.1,
        on_bad_file: Literal["error", "skip"] = "error",
        classes: list[str] | None = None,  # label order; default: the sorted train class folders
        resize: Literal["stretch", "center_crop"] = "stretch",
        **kwargs,
    ):
        require(image_size >= 1, f"image_size={image_size} must be at least 1")
        require(resize in ("stretch", "center_crop"), f"resize={resize!r} must be 'stretch' or 'center_crop'")
        require(channels in (1, 3), f"channels={channels} must be 1 (grayscale) or 3 (RGB)")
        require(on_bad_file in ("error", "skip"), f"on_bad_file={on_bad_file!r} must be 'error' or 'skip'")
        train = Path(root).expanduser() / "train"
        absent = (
            f"image folder not found: {train} (ImageFolders reads {root}/train/<class>/<images> "
            f"and {root}/val/ and/or {root}/test/ alike)"
        )
        if train.is_dir():
            if classes is None:
                classes = class_folders(train)
            else:
                require(len(set(classes)) == len(classes), f"classes={classes} names a class twice")
                check_same_classes(train, classes, "the classes given (a checkpoint's: its model's outputs)")
        elif classes is None:  # nothing to name the classes
            raise DataNotFoundError(absent)
        else:
            files_missing(absent)
        super().__init__(
            root, classes=classes, image_size=image_size, in_channels=channels, val_size=val_size, **kwargs
        )
        self.save_hyperparameters()
        # recorded in checkpoints, so a checkpoint names its classes where the folders are absent
        self.hparams["classes"] = self.classes
        self.on_bad_file = on_bad_file
        self.crop = resize == "center_crop"
        self.has_val_split = (self.root / "val").is_dir()
        for name in ("val", "test"):
            if (self.root / name).is_dir():
                check_same_classes(self.root / name, classes, train)

    def read_split(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        if not (self.root / name).is_dir():
            raise DataNotFoundError(f"no {name} split: {self.root / name} does not exist")
        return read_image_folder(
            self.root, name, self.classes, self.image_size, self.mode, self.on_bad_file, self.crop
        )


class FashionMNIST(ImageDataModule):
    """Fashion-MNIST (Xiao et al. 2017): 28x28 grayscale images of 10 kinds of clothing, 60,000
    for training and 10,000 for testing, from the original gzip IDX files.

    `root` holds `train-images-idx3-ubyte.gz`, `train-labels-idx1-ubyte.gz`,
    `t10k-images-idx3-ubyte.gz` and `t10k-labels-idx1-ubyte.gz` (or the same names without .gz),
    directly or in torchvision's layout `root/FashionMNIST/raw/`. Debian's package
    `dataset-fashion-mnist` installs them in the default `root`. Patch sizes 4 and 7 divide 28;
    `image_size: 32` pads every image with 2 black pixels on each side, for patch size 8 or 16.
    """

    def __init__(
        self,
        root: str = "/usr/share/datasets/fashion-mnist",
        image_size: int = 28,
        val_size: int | float = 5000,
        **kwargs,
    ):
        require(
            image_size >= 28 and image_size % 2 == 0,
            f"image_size={image_size} must be 28, or an even size above it (the images are padded)",
        )
        super().__init__(
            root,
            classes=FASHION_MNIST_CLASSES,
            image_size=image_size,
            in_channels=1,
            val_size=val_size,
            **kwargs,
        )
        self.save_hyperparameters()
        self.files = self.find_files()
        if self.files is None:
            files_missing(self.where_to_put_files())

    def find_files(self) -> dict[str, Path] | None:
        """The four files, gzipped or not, in `root` or torchvision's `root/FashionMNIST/raw`."""
        for folder in (self.root, self.root / "FashionMNIST" / "raw"):
            found = {}
            for name in FASHION_MNIST_NAMES:
                for path in (folder / f"{name}.gz", folder / name):
                    if path.is_file():
                        found[name] = path
                        break
            if len(found) == len(FASHION_MNIST_NAMES):
                return found
        return None

    def where_to_put_files(self) -> str:
        expected = ", ".join(name + ".gz" for name in FASHION_MNIST_NAMES)
        return (
            f"Fashion-MNIST not found: expected {expected} in {self.root} "
            f"or {self.root}/FashionMNIST/raw (Debian: apt-get install dataset-fashion-mnist puts them "
            f"in /usr/share/datasets/fashion-mnist)"
        )

    def pad(self, images: torch.Tensor) -> torch.Tensor:
        border = (self.image_size - 28) // 2
        return F.pad(images, (border,) * 4) if border else images

    def pixels(self, image: Image.Image) -> torch.Tensor:
        return self.pad(to_pixels(image, "L", 28))

    def read_split(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        if self.files is None:
            raise DataNotFoundError(self.where_to_put_files())
        image_file, label_file = (self.files[n] for n in FASHION_MNIST_FILES[name])
        images, labels = read_idx(image_file), read_idx(label_file)
        if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.shape != images.shape[:1]:
            raise DataError(
                f"{image_file} holds images of shape {tuple(images.shape)} and {label_file} labels of "
                f"shape {tuple(labels.shape)}; expected (N, 28, 28) and (N,)"
            )
        if labels.max() >= len(FASHION_MNIST_CLASSES):
            raise DataError(f"{label_file} holds label {int(labels.max())}; Fashion-MNIST has 10 classes")
        return self.pad(images[:, None]), labels.long()
