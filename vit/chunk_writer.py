"""Image folders written as streaming chunks (litdata's format), for data that outgrows memory.

`write_chunks(root, out)` reads the folder tree `ImageFolders` reads (`root/train/<class>/*`, and
`root/val/`, `root/test/` with the same class folders) and writes, per split, `out/<split>/`:
litdata's chunks (its `BinaryWriter`, the format `litdata.optimize` writes), each item an image
file's bytes as they are on disk (JPEG stays JPEG: no decoded pixels, so the chunks are about the
size of the files) and its label; and `out/vit.json`: the format, the classes in label order, each
split's image count and the files skipped. Every file is decoded once first, by a few threads with a
progress bar, so that a corrupt or truncated image is named in one line (`on_bad_file: error`) or
left out and listed (`skip`) before anything is written. The chunks are written into a hidden folder
beside `out` and renamed to `out` when complete: a run stopped at any moment leaves no `out`.

`out` may be a prefix of an S3 bucket (`s3://bucket/prefix`): the chunks are written into a
temporary folder as for a disk, then uploaded through `vit.storage` (the package's one client of
the object store), `vit.json` last, so that a reader never takes a set still being uploaded for a
complete one (S3 has no rename); a failure removes what was uploaded. The endpoint and credentials
come from the environment (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, ...).

`vit.chunk_reader` reads the chunks back; `vit.streaming.StreamingImages` trains on them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from vit import storage
from vit.datamodules import holdout
from vit.decode import check_same_classes, class_folders, list_images, open_each
from vit.errors import DataError, DataNotFoundError, UsageError, require

FORMAT = "vit-chunks-1"  # what vit.json says; a reader refuses another
SPLITS = ("train", "val", "test")
MANIFEST = "vit.json"


def readable(files: list[str], on_bad_file: str, desc: str) -> tuple[list[int], list[str]]:
    """The indices of `files` that decode, and the files that do not (with why); with
    `on_bad_file` "error" the first bad file stops it with one line naming it."""
    # image.load() decodes the whole file: a truncated JPEG fails there, not when it is opened
    bad = open_each(files, lambda i, image: image.load(), on_bad_file, desc, "--on_bad_file skip")
    skipped = {i for i, _ in bad}
    return [i for i in range(len(files)) if i not in skipped], [f"{files[i]} ({reason})" for i, reason in bad]


def write_split(folder: Path, entries: list[tuple[str, int]], chunk_bytes: int | str) -> None:
    """The files of `entries` (path, label), their bytes as they are, as litdata chunks in `folder`
    (`BinaryWriter`, in this process: the chunks, then their index.json)."""
    from litdata.streaming.writer import BinaryWriter

    folder.mkdir(parents=True)
    writer = BinaryWriter(str(folder), chunk_bytes=chunk_bytes)
    for i, (path, label) in enumerate(entries):
        with open(path, "rb") as f:
            writer[i] = {"image": f.read(), "label": label}
    writer.done()
    writer.merge()


def store_url(out: str) -> str:
    """`out`, a prefix of an S3 bucket (`s3://bucket/prefix`, or a whole bucket `s3://bucket`),
    without a trailing slash; refuses another scheme and a URL without a bucket."""
    scheme = str(out).partition("://")[0]
    require(scheme == "s3", f"{out}: only s3:// object stores are supported, not {scheme}://")
    require(storage.bucket(out) != "", f"{out} names no bucket (s3://bucket/prefix)")
    return str(out).rstrip("/")


def upload(folder: Path, url: str) -> None:
    """Every file under `folder` as the object of its relative path under `url`, `MANIFEST`
    last; on any failure the objects uploaded are deleted (as far as the store lets: where it
    does not, what is left has no `MANIFEST`, so no reader takes it)."""
    files = sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())
    files.sort(key=lambda name: name == MANIFEST)  # last: the sign that the rest is there
    uploaded = []
    try:
        for name in files:
            storage.upload(folder / name, f"{url}/{name}")
            uploaded.append(f"{url}/{name}")
    except BaseException:
        try:
            storage.remove(uploaded)
        except DataError:
            print(f"warning: could not delete the {len(uploaded)} objects uploaded to {url}; delete them")
        raise


def write_chunks(
    root: str | Path,
    out: str | Path,
    classes: list[str] | None = None,
    on_bad_file: str = "error",
    chunk_bytes: int | str = "64MB",
    val_size: int | float = 0.1,
    seed: int = 0,
) -> dict:
    """Write the splits of the image folders under `root` as streaming chunks into `out`, a new
    folder or an empty prefix of an S3 bucket (`s3://bucket/prefix`; see the module's docstring).
    `classes` orders the labels (default: the sorted class folders of train). Without
    `root/val/`, `val_size` training images (a count, or a fraction below 1) drawn with `seed` are
    written as the val split instead, as `ImageFolders` holds them out. Returns what
    `out/vit.json` holds."""
    root = Path(root).expanduser()
    in_store = storage.is_url(out)
    out = store_url(out) if in_store else Path(out).expanduser()
    if on_bad_file not in ("error", "skip"):
        raise UsageError(f"on_bad_file={on_bad_file!r} must be 'error' or 'skip'")
    if not in_store and out.exists():
        raise UsageError(f"{out} already exists; remove it, or write the chunks to another folder")
    train = root / "train"
    if not train.is_dir():
        raise DataNotFoundError(f"image folder not found: {train} (expected {root}/train/<class>/<images>)")
    classes = class_folders(train) if classes is None else list(classes)
    splits = [name for name in SPLITS if (root / name).is_dir()]
    for name in splits:
        check_same_classes(root / name, classes, train)
    if in_store and not storage.is_empty(out):  # the bucket and the credentials checked, too
        raise UsageError(f"{out} already holds objects; delete them, or write the chunks to another prefix")
    held_out = "val" not in splits
    val_from = "folder" if not held_out else f"held out of train: val_size {val_size}, seed {seed}"
    manifest = {"format": FORMAT, "classes": classes, "images": {}, "skipped": {}, "val": val_from}
    if in_store:  # uploaded when complete
        partial = Path(tempfile.mkdtemp(prefix="vit-chunks-"))
    else:
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
            parts = {name: entries}
            if name == "train" and held_out:
                train, val = holdout(len(entries), val_size, seed)
                parts = {"train": [entries[i] for i in train], "val": [entries[i] for i in val]}
            for part, items in parts.items():
                write_split(partial / part, items, chunk_bytes)
                manifest["images"][part] = len(items)
            manifest["skipped"][name] = bad
            if bad:
                print(f"warning: skipped {len(bad)} unreadable files in {root / name}, the first: {bad[0]}")
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=2))
        if in_store:
            upload(partial, out)
        else:
            partial.rename(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    counts = ", ".join(f"{name} {n}" for name, n in manifest["images"].items())
    print(f"wrote the chunks of {counts} images into {out} in {time.perf_counter() - started:.1f} s")
    return manifest
