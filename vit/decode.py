"""Reading data files into uint8 tensors: folders of image files (decoded by a few threads, with
a progress bar, and cached: `vit.cache`) and IDX files (MNIST, Fashion-MNIST)."""

from __future__ import annotations

import gzip
import hashlib
import os
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import torch
from PIL import Image
from tqdm import tqdm

from vit.cache import CACHE_VERSION, cache_folders, load_cache, report, save_cache
from vit.errors import DataError, DataNotFoundError, one_line
from vit.preparation import BAD_IMAGE, Preparation

DECODE_THREADS = min(4, os.cpu_count() or 1)  # Pillow decodes without the GIL; more gains little


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


def open_each(
    files: list[str],
    read: Callable[[int, Image.Image], object],
    on_bad_file: str,
    desc: str,
    skip_hint: str = "on_bad_file=skip",
) -> list[tuple[int, str]]:
    """Open each of `files` and call `read(index, image)` on it, by a few threads with a progress
    bar. Returns (index, why) of each file that could not be read; with `on_bad_file` "error" the
    first one stops it with one line naming the file (and `skip_hint`, the option that skips)."""

    def read_chunk(chunk: range) -> list[tuple[int, str]]:
        bad = []
        for i in chunk:
            try:
                with Image.open(files[i]) as image:
                    read(i, image)
            except BAD_IMAGE as e:
                bad.append((i, f"{type(e).__name__}: {one_line(e)}"))
        return bad

    chunks = [range(i, min(i + 256, len(files))) for i in range(0, len(files), 256)]
    bad: list[tuple[int, str]] = []
    with ThreadPoolExecutor(DECODE_THREADS) as pool, tqdm(total=len(files), desc=desc, unit="img") as bar:
        for chunk, failed in zip(chunks, pool.map(read_chunk, chunks), strict=True):
            bar.update(len(chunk))
            bad += failed
            if bad and on_bad_file == "error":
                pool.shutdown(cancel_futures=True)
                index, reason = bad[0]
                raise DataError(
                    f"cannot read image {files[index]} ({reason}); remove it, or pass {skip_hint}"
                )
    return bad


def decode_images(
    files: list[str], preparation: Preparation, on_bad_file: str, desc: str
) -> tuple[torch.Tensor, list[int], list[str]]:
    """Decode `files` into uint8 (N, C, H, W) with `preparation`, by a few threads with a progress
    bar. Returns the images, the indices of the files that could not be read, and why."""
    images = torch.empty(len(files), preparation.channels, *preparation.size, dtype=torch.uint8)

    def decode(i: int, image: Image.Image) -> None:
        images[i] = preparation.pixels(image)

    bad = open_each(files, decode, on_bad_file, desc)
    return images, [i for i, _ in bad], [reason for _, reason in bad]


def read_image_folder(
    root: Path, split: str, classes: list[str], preparation: Preparation, on_bad_file: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The images of `root/<split>/<class>/*` as uint8 (N, C, H, W), prepared with `preparation`,
    and their labels: from the cache when it matches the files, else decoded (and cached)."""
    folder = root / split
    files, labels, signature = list_images(folder, classes)
    if not files:
        raise DataError(f"no files in the class folders of {folder}")
    (height, width), mode = preparation.size, preparation.mode
    size = str(height) if height == width else f"{height}x{width}"
    suffix = "-crop" if preparation.resize == "center_crop" else ""  # stretched: the name it always had
    signature = f"{signature}:{size}:{mode}{suffix}"
    name = f"{split}-{height}x{width}-{mode}{suffix}.pt"
    start = time.perf_counter()
    for path in (cache_folder / name for cache_folder in cache_folders(root)):
        if (cache := load_cache(path, signature)) is not None:
            seconds = time.perf_counter() - start
            report(f"loaded {len(cache['labels'])} images of {folder} from {path} in {seconds:.1f} s")
            break
    else:
        images, bad, reasons = decode_images(files, preparation, on_bad_file, f"decoding {folder}")
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


def read_masks(root: Path, split: str, classes: list[str], preparation: Preparation) -> torch.Tensor:
    """The evidence masks of `root/<split>/<class>/*`: `root/masks/<split>/<class>/<name>.png`
    for each image file (its name with .png for its suffix), each of its image's size, prepared
    as the image is (resized, cropped) and read white (> 127) as evidence: (N, H, W) bool."""
    files, _, _ = list_images(root / split, classes)
    gray = replace(preparation, channels=1)
    masks = torch.empty(len(files), *preparation.size, dtype=torch.bool)
    for i, file in enumerate(tqdm(files, desc=f"reading masks of {root / split}", unit="mask")):
        relative = Path(file).relative_to(root / split)
        mask_file = root / "masks" / split / relative.with_suffix(".png")
        if not mask_file.is_file():
            raise DataNotFoundError(f"no mask for {file}: expected {mask_file}")
        try:
            with Image.open(file) as image, Image.open(mask_file) as mask:
                if mask.size != image.size:
                    (w, h), (iw, ih) = mask.size, image.size
                    raise DataError(f"mask {mask_file} is {w}x{h} pixels, its image {file} {iw}x{ih}")
                masks[i] = gray.pixels(mask)[0] > 127
        except BAD_IMAGE as e:
            raise DataError(f"cannot read mask {mask_file} ({type(e).__name__}: {one_line(e)})") from e
    return masks


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
