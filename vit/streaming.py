"""Image folders as streaming chunks (litdata): for data that outgrows memory.

`write_chunks(root, out)` reads the folder tree `ImageFolders` reads (`root/train/<class>/*`, and
`root/val/`, `root/test/` with the same class folders) and writes, per split, `out/<split>/`: the
chunks of `litdata.optimize`, each item an image file's bytes as they are on disk (JPEG stays
JPEG: no decoded pixels, so the chunks are about the size of the files) and its label; and
`out/vit.json`: the format, the classes in label order, each split's image count and the files
skipped. Every file is decoded once first, by a few threads with a progress bar, so that a corrupt
or truncated image is named in one line (`on_bad_file: error`) or left out and listed
(`skip`) before anything is written. The chunks are written into a hidden folder beside `out`
and renamed to `out` when complete: a run stopped at any moment leaves no `out`.

`read_manifest(out)` reads `vit.json` back and refuses a folder written in another format.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from PIL import Image
from tqdm import tqdm

from vit.decode import DECODE_THREADS, check_same_classes, class_folders, list_images
from vit.errors import DataError, DataNotFoundError, UsageError, one_line
from vit.preparation import BAD_IMAGE

FORMAT = "vit-chunks-1"  # what vit.json says; a reader refuses another
SPLITS = ("train", "val", "test")
MANIFEST = "vit.json"


def check_image(path: str) -> str | None:
    """Why the image file at `path` cannot be decoded, or None when it can."""
    try:
        with Image.open(path) as image:
            image.load()  # the whole file: a truncated JPEG fails here, not at open
    except BAD_IMAGE as e:
        return f"{type(e).__name__}: {one_line(e)}"
    return None


def readable(files: list[str], on_bad_file: str, desc: str) -> tuple[list[int], list[str]]:
    """The indices of `files` that decode, and the files that do not (with why); with
    `on_bad_file` "error" the first bad file stops it with one line naming it."""
    good, bad = [], []
    with ThreadPoolExecutor(DECODE_THREADS) as pool, tqdm(total=len(files), desc=desc, unit="img") as bar:
        for i, reason in enumerate(pool.map(check_image, files, chunksize=64)):
            bar.update()
            if reason is None:
                good.append(i)
                continue
            if on_bad_file == "error":
                pool.shutdown(cancel_futures=True)
                raise DataError(
                    f"cannot read image {files[i]} ({reason}); remove it, or pass --on_bad_file skip"
                )
            bad.append(f"{files[i]} ({reason})")
    return good, bad


def _item(entry: tuple[str, int]) -> dict:
    path, label = entry
    with open(path, "rb") as f:
        return {"image": f.read(), "label": label}


def write_chunks(
    root: str | Path,
    out: str | Path,
    classes: list[str] | None = None,
    on_bad_file: str = "error",
    chunk_bytes: int | str = "64MB",
    workers: int = 1,
) -> dict:
    """Write the splits of the image folders under `root` as streaming chunks into `out` (see the
    module's docstring). `classes` orders the labels (default: the sorted class folders of
    train). Returns what `out/vit.json` holds."""
    from litdata import optimize

    root, out = Path(root).expanduser(), Path(out).expanduser()
    if on_bad_file not in ("error", "skip"):
        raise UsageError(f"on_bad_file={on_bad_file!r} must be 'error' or 'skip'")
    if workers < 1:
        raise UsageError(f"workers={workers} must be at least 1")
    if out.exists():
        raise UsageError(f"{out} already exists; remove it, or write the chunks to another folder")
    train = root / "train"
    if not train.is_dir():
        raise DataNotFoundError(f"image folder not found: {train} (expected {root}/train/<class>/<images>)")
    classes = class_folders(train) if classes is None else list(classes)
    splits = [name for name in SPLITS if (root / name).is_dir()]
    for name in splits:
        check_same_classes(root / name, classes, train)
    manifest = {"format": FORMAT, "classes": classes, "images": {}, "skipped": {}}
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    started = time.perf_counter()
    try:
        for name in splits:
            files, labels, _ = list_images(root / name, classes)
            if not files:
                raise DataError(f"no files in the class folders of {root / name}")
            good, bad = readable(files, on_bad_file, f"checking {root / name}")
            if not good:
                raise DataError(f"no readable images in {root / name}")
            entries = [(files[i], int(labels[i])) for i in good]
            optimize(_item, entries, output_dir=str(partial / name), chunk_bytes=chunk_bytes,
                     num_workers=workers, mode="overwrite", verbose=False)  # fmt: skip
            manifest["images"][name], manifest["skipped"][name] = len(entries), bad
            if bad:
                print(f"warning: skipped {len(bad)} unreadable files in {root / name}, the first: {bad[0]}")
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=2))
        partial.rename(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    counts = ", ".join(f"{name} {n}" for name, n in manifest["images"].items())
    print(f"wrote the chunks of {counts} images into {out} in {time.perf_counter() - started:.1f} s")
    return manifest


def read_manifest(folder: str | Path) -> dict:
    """What `write_chunks` recorded in `folder/vit.json`; refuses a folder that is not there, or
    was written in another format."""
    folder = Path(folder).expanduser()
    path = folder / MANIFEST
    if not path.is_file():
        what = "no such folder" if not folder.exists() else f"no {MANIFEST}: not written by vit-chunks"
        raise DataNotFoundError(f"chunk folder {folder}: {what}")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as e:
        raise DataError(f"{path} is not JSON ({one_line(e)})") from None
    if manifest.get("format") != FORMAT:
        raise DataError(
            f"{folder} holds chunks of format {manifest.get('format')!r}, not {FORMAT!r}: "
            f"write them again with vit-chunks"
        )
    return manifest
