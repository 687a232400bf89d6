"""CIFAR-10 image folders as one file: the JPEG bytes back to back behind a small index.

A GPU machine that receives only the repository's working tree (64 MiB, `make gpu-check`) cannot
take 60,000 files as a tar (about 29 MB of headers on 55 MB of JPEG bytes) nor the decoded arrays
(184 MB); this file adds under 2 MB to the bytes. Unpacking writes the same folder tree, file
names included, so the data module decodes it as it decodes the original folders and holds out the
same validation images.

    python lab/cifar10_pack.py pack ../shared/data/cifar10-jpeg .gpu/cifar10-jpeg.pack
    python lab/cifar10_pack.py unpack .gpu/cifar10-jpeg.pack /tmp/cifar10-jpeg

Layout: the line `vit-image-pack 1`, one line of JSON (`files`: [[relative path, bytes], ...] in
order), then the files' bytes in that order.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path

import torch
from PIL import Image

MAGIC = b"vit-image-pack 1\n"
SPLITS = ("train", "test")


def files_of(root: Path) -> list[str]:
    """The image files under root/{train,test}/<class>/, as sorted paths relative to root."""
    found = []
    for split in SPLITS:
        for directory, subdirs, names in os.walk(root / split):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
            found += [
                os.path.relpath(os.path.join(directory, n), root) for n in names if not n.startswith(".")
            ]
    return sorted(found)


def pack(root: Path, out: Path) -> tuple[int, int]:
    """Write the pack of `root`'s train and test folders to `out`: (files, bytes written)."""
    files = files_of(root)
    if not files:
        raise SystemExit(f"error: no image files under {root}/train or {root}/test")
    blobs = [(root / name).read_bytes() for name in files]
    index = json.dumps({"files": [[name, len(blob)] for name, blob in zip(files, blobs, strict=True)]})
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with open(partial, "wb") as f:
        f.write(MAGIC + index.encode() + b"\n")
        for blob in blobs:
            f.write(blob)
    partial.replace(out)
    return len(files), out.stat().st_size


def unpack(pack_file: Path, root: Path) -> int:
    """Write the files of `pack_file` under `root` (the folder tree it was made from): the count."""
    with open(pack_file, "rb") as f:
        if f.readline() != MAGIC:
            raise SystemExit(f"error: {pack_file} is not an image pack (no '{MAGIC.decode().strip()}' line)")
        files = json.loads(f.readline())["files"]
        for name, size in files:
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            data = f.read(size)
            if len(data) != size:
                raise SystemExit(f"error: {pack_file} is truncated at {name}")
            path.write_bytes(data)
    return len(files)


def fake_cifar10(root: Path, per_class: int = 4, seed: int = 0) -> Path:
    """A tiny CIFAR-10 image-folder tree of random 32x32 JPEGs (`per_class` per class and split),
    for smoke runs and tests."""
    from vit.datamodules import CIFAR10_CLASSES

    generator = torch.Generator().manual_seed(seed)
    for split in SPLITS:
        for label, name in enumerate(CIFAR10_CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                # a class-dependent colour plus noise: learnable, so a smoke run can beat chance
                base = torch.tensor([label * 25, 255 - label * 25, (label * 70) % 256])[:, None, None]
                noise = torch.randint(-40, 41, (3, 32, 32), generator=generator)
                pixels = (base + noise).clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
                buffer = io.BytesIO()
                Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
                (folder / f"{i:04d}.jpg").write_bytes(buffer.getvalue())
    return root


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="folders -> one pack file")
    p.add_argument("root", type=Path, help="a folder with train/<class>/ and test/<class>/")
    p.add_argument("out", type=Path)
    u = sub.add_parser("unpack", help="one pack file -> folders")
    u.add_argument("pack", type=Path)
    u.add_argument("root", type=Path)
    args = parser.parse_args(argv)
    if args.command == "pack":
        count, size = pack(args.root, args.out)
        print(f"{count} files packed into {args.out} ({size / 2**20:.1f} MiB)")
    else:
        if not args.pack.is_file():
            sys.exit(f"error: no pack file {args.pack}")
        print(f"{unpack(args.pack, args.root)} files unpacked into {args.root}")


if __name__ == "__main__":
    main()
