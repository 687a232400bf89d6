"""`vit-chunks`: image folders written as streaming chunks (`vit.streaming.write_chunks`).

    vit-chunks --root photos --out photos-chunks

Reads `root/train/<class>/*` (and `root/val/`, `root/test/` with the same class folders), checks
that every image decodes, and writes each split's files, their bytes as they are, into litdata
chunks under `out/<split>/`, with `out/vit.json` (the classes, the counts). Bad input is one line
`error: ...` and exit status 2 (a bad option) or 1 (missing or unreadable data), and no `out`.

litdata is imported inside `chunks`, not at the top: `vit-chunks --help` needs neither it nor torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

from vit.commands.base import Parser, run_command


def chunks(root: str | Path, out: str | Path, **options) -> dict:
    from vit.streaming import write_chunks

    return write_chunks(root, out, **options)


def parser() -> Parser:
    parser = Parser(
        prog="vit-chunks",
        description=(
            "Write image folders (ROOT/train/<class>/<images>, and ROOT/val/, ROOT/test/ alike) as "
            "litdata chunks that a data module streams, for data that outgrows memory: each image "
            "file's bytes as they are (JPEG stays JPEG) and its label, per split, with vit.json "
            "(the classes, the counts). Every image is decoded once first: a bad file is named."
        ),
    )
    parser.add_argument("--root", required=True, metavar="DIR", help="the image folders")
    parser.add_argument("--out", required=True, metavar="DIR", help="a new folder for the chunks")
    parser.add_argument(
        "--classes", nargs="+", default=None, metavar="NAME",
        help="the classes in label order; default: the sorted class folders of train",
    )  # fmt: skip
    parser.add_argument(
        "--on_bad_file", default="error", choices=["error", "skip"],
        help="an image that cannot be decoded stops the run (error) or is left out and listed (skip)",
    )  # fmt: skip
    parser.add_argument("--chunk_bytes", default="64MB", help="the size of one chunk file")
    parser.add_argument(
        "--val_size", type=float, default=0.1, metavar="N",
        help="without ROOT/val/: the training images written as the val split, a fraction below 1 or a count",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="draws the held-out val images")
    return parser


def main(args: list[str] | None = None) -> None:
    options = parser().parse_args(sys.argv[1:] if args is None else [str(a) for a in args])
    val_size = options.val_size if options.val_size < 1 else int(options.val_size)
    run_command(chunks, options.root, options.out, classes=options.classes, on_bad_file=options.on_bad_file,
                chunk_bytes=options.chunk_bytes, val_size=val_size, seed=options.seed)  # fmt: skip


if __name__ == "__main__":
    main()
