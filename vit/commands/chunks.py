"""`vit-chunks`: image folders written as streaming chunks (`vit.chunk_writer.write_chunks`).

    vit-chunks --root photos --out photos-chunks
    vit-chunks --root photos --out s3://bucket/photos-chunks   # keys from AWS_ACCESS_KEY_ID, ...

Reads `root/train/<class>/*` (and `root/val/`, `root/test/` with the same class folders), checks
that every image decodes, and writes each split's files, their bytes as they are, into litdata
chunks under `out/<split>/`, with `out/vit.json` (the classes, the counts): into a new folder, or
an empty prefix of an S3 bucket (uploaded when complete, vit.json last). Bad input is one line
`error: ...` and exit status 2 (a bad option) or 1 (missing or unreadable data, a bucket that is
not there, credentials refused), and no `out`.

litdata is imported inside `chunks`, not at the top: `vit-chunks --help` needs neither it nor torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from vit.commands.base import Command, option


@dataclass
class ChunksOptions:
    """The options of vit-chunks: those of `vit.chunk_writer.write_chunks`."""

    root: str = option(None, "the image folders", required=True, metavar="DIR")
    out: str = option(
        None,
        "a new folder for the chunks, or an empty prefix of an S3 bucket (s3://bucket/prefix; the "
        "endpoint and keys from the environment: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)",
        required=True,
        metavar="DIR|URL",
    )
    classes: list[str] | None = option(
        None,
        "the classes in label order; default: the sorted class folders of train",
        nargs="+",
        metavar="NAME",
    )
    on_bad_file: str = option(
        "error",
        "an image that cannot be decoded stops the run (error) or is left out and listed (skip)",
        choices=["error", "skip"],
    )
    chunk_bytes: str = option("64MB", "the size of one chunk file")
    val_size: float = option(
        0.1,
        "without ROOT/val/: the training images written as the val split, a fraction below 1 or a count",
        type=float,
        metavar="N",
        read=lambda size: size if size < 1 else int(size),
    )
    seed: int = option(0, "draws the held-out val images", type=int)


def chunks(options: ChunksOptions) -> dict:
    from vit.chunk_writer import write_chunks

    return write_chunks(**asdict(options))


COMMAND = Command(
    prog="vit-chunks",
    description=(
        "Write image folders (ROOT/train/<class>/<images>, and ROOT/val/, ROOT/test/ alike) as "
        "litdata chunks that a data module streams, for data that outgrows memory: each image "
        "file's bytes as they are (JPEG stays JPEG) and its label, per split, with vit.json "
        "(the classes, the counts), into a folder or an S3 prefix. Every image is decoded once "
        "first: a bad file is named."
    ),
    options=ChunksOptions,
    function=chunks,
)
main = COMMAND.main

if __name__ == "__main__":
    main()
