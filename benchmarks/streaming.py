"""Streamed chunks against the in-memory data modules: peak memory and loader speed.

    python -m benchmarks.streaming memory             # vit-train and vit-eval at 1,000 and 8,000 images
    python -m benchmarks.streaming speed              # images/s of three loaders at 32 and 224 px
    python -m benchmarks.streaming speed --smoke      # seconds, on generated images
    python -m benchmarks.streaming speed --s3         # and the chunks streamed from an S3 server

memory: for each size, a folder of generated JPEGs (train/, and test/ holding the same files) and
its chunks (`vit.chunk_writer.write_chunks`); then, each in a process of its own, one epoch of
`vit-train fit` on `vit.datamodules.ImageFolders` and on `vit.streaming.StreamingImages`, and
`vit-eval` of each run's checkpoint on its test split. The peak resident memory of each process
(its `ru_maxrss`, read with `os.wait4`) is the figure: the in-memory module decodes every split
into memory and grows with the data; the streaming one holds a batch at a time.

speed: images per second out of the training loader, no model, of (a) `ImageFolders` (batches
indexed out of the decoded split in memory; its one-time decode is reported apart), (b)
`StreamingImages` (chunks read and each image decoded in `--workers` loader workers), (c)
torchvision's `ImageFolder` with a `DataLoader` (files opened and decoded in the same number of
workers), on the same JPEG files: CIFAR-10's (32 px) and the same images enlarged to 224 px;
with a GPU, (d) `StreamingImages(decode="device")`: the workers read, the GPU decodes each batch.

--s3 adds, to either, the same chunks uploaded to an S3-compatible server on this machine (moto's,
`lab.s3server`, on 127.0.0.1) and streamed from there: litdata downloads each chunk into its cache
(here a folder of the work folder) and reads it as it reads a disk's, so the figures say what the
download and the client cost beside a disk, not what a network between machines costs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

from lab.machine import cpu_name
from lab.s3server import S3Server

REPO = Path(__file__).resolve().parents[1]
CIFAR10 = REPO.parent / "shared" / "data" / "cifar10-jpeg"  # this project's machines
CLASSES = ("ant", "bee", "cat")


def generated_folder(root: Path, count: int, size: int, seed: int = 0) -> Path:
    """`count` JPEGs of `size` px in `root/train/<class>/`, and `root/test/` holding the same
    files (hard links): smooth random colour fields, about the bytes of a photo of that size."""
    noise = torch.Generator().manual_seed(seed)
    for i in range(count):
        name = CLASSES[i % len(CLASSES)]
        path = root / "train" / name / f"{i:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        coarse = torch.randint(0, 256, (8, 8, 3), dtype=torch.uint8, generator=noise).numpy()
        Image.fromarray(coarse).resize((size, size), Image.BICUBIC).save(path, quality=90)
        (root / "test" / name).mkdir(parents=True, exist_ok=True)
        os.link(path, root / "test" / name / path.name)
    return root


# Runs a module as `python -m` does and, as the process exits, writes its peak resident memory
# (VmHWM, this process alone: the wait4 figure would also count any child, such as the
# brief copy of the process that starts a subprocess) to the file named first.
PEAK = """
import atexit, runpy, sys
out, module, sys.argv = sys.argv[1], sys.argv[2], sys.argv[2:]
def peak():
    kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    open(out, "w").write(str(kib))
atexit.register(peak)
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def peak_megabytes(module: str, *args: str) -> float:
    """Run `python -m module args` in a process of its own; its peak resident memory in MB."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "peak"
        command = [sys.executable, "-c", PEAK, str(out), module, *args]
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"python -m {module} {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return int(out.read_text()) / 1024


def memory(
    sizes: list[int],
    image_size: int,
    work: Path,
    chunk_bytes: str = "64MB",
    s3: str | None = None,
    peak=peak_megabytes,
) -> dict[str, dict[int, float]]:
    """Peak MB of vit-train (one epoch) and vit-eval, per data module and size (see the
    module's docstring); `peak(module, *args)` measures one run (a fresh Python, as users start
    them)."""
    from vit.chunk_writer import write_chunks

    modules = {
        "ImageFolders": "vit.datamodules.ImageFolders",
        "StreamingImages": "vit.streaming.StreamingImages",
        **({"StreamingImages from S3": "vit.streaming.StreamingImages"} if s3 else {}),
    }
    peaks: dict[str, dict[int, float]] = {}
    for count in sizes:
        folder = generated_folder(work / f"images{count}", count, image_size)
        write_chunks(folder, work / f"chunks{count}", chunk_bytes=chunk_bytes)
        roots = {"ImageFolders": folder, "StreamingImages": work / f"chunks{count}"}
        if s3:
            roots["StreamingImages from S3"] = f"{s3}/chunks{count}"
            write_chunks(folder, roots["StreamingImages from S3"], chunk_bytes=chunk_bytes)
        for short, module in modules.items():
            root = roots[short]
            runs = work / f"runs{count}"
            train = [
                "fit", "--data", module, "--data.root", str(root),
                "--data.image_size", str(image_size), "--data.batch_size", "250", "--data.crop_padding", "0",
                "--model.vit.preset", "micro", "--model.vit.patch_size", str(image_size // 4),
                "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false",
                "--trainer.logger.init_args.save_dir", str(runs),
                "--trainer.logger.init_args.name", short.replace(" ", "_"),
            ]  # fmt: skip
            peaks.setdefault(f"vit-train, {short}", {})[count] = peak("vit.commands.train", *train)
            ckpt = runs / short.replace(" ", "_") / "version_0" / "checkpoints" / "last.ckpt"
            peaks.setdefault(f"vit-eval, {short}", {})[count] = peak("vit.commands.eval", "--ckpt", str(ckpt))
    return peaks


def images_per_second(loader, epochs: int) -> float:
    """Images per second out of `loader` over `epochs` epochs, after one epoch of warm-up (the
    workers start, the files reach the page cache)."""
    for _ in loader:
        pass
    start, seen = time.perf_counter(), 0
    for _ in range(epochs):
        for images, _labels in loader:
            seen += len(images)
    return seen / (time.perf_counter() - start)


class GPUDecoded:
    """The training batches of a `StreamingImages(decode="device")` decoded on the GPU, as
    `on_before_batch_transfer` decodes them in training; each batch waited for, so that the
    time counts the decoding."""

    def __init__(self, data):
        self.data, self.device = data, torch.device("cuda")

    def __iter__(self):
        from vit.chunk_reader import decode_batch

        for files, labels in self.data.train_dataloader():
            images = decode_batch(files, self.data.preparation, self.device)
            torch.cuda.synchronize()
            yield images, labels


def cifar10_folder(root: Path, per_class: int, size: int, smoke: bool) -> Path:
    """`root/train/<class>/` with `per_class` CIFAR-10 training JPEGs a class, enlarged to `size` px
    where it is not 32 (bicubic, JPEG quality 90); generated images under --smoke or without
    the copy."""
    if smoke or not CIFAR10.is_dir():
        return generated_folder(root, per_class * len(CLASSES), size)
    for folder in sorted((CIFAR10 / "train").iterdir()):
        (root / "train" / folder.name).mkdir(parents=True)
        for path in sorted(folder.iterdir())[:per_class]:
            if size == 32:
                shutil.copy(path, root / "train" / folder.name / path.name)
            else:
                with Image.open(path) as image:
                    image.resize((size, size), Image.BICUBIC).save(
                        root / "train" / folder.name / path.name, quality=90
                    )
    return root


def speed(
    sizes: list[int],
    per_class: int,
    workers: int,
    batch: int,
    epochs: int,
    work: Path,
    smoke: bool,
    s3: str | None = None,
) -> dict:
    """Images/s of the three loaders at each image size (see the module's docstring)."""
    from torchvision import datasets
    from torchvision.transforms import v2

    from vit.chunk_writer import write_chunks
    from vit.datamodules import ImageFolders
    from vit.streaming import StreamingImages

    results = {}
    for size in sizes:
        folder = cifar10_folder(work / f"files{size}", per_class, size, smoke)
        write_chunks(folder, work / f"chunks{size}", val_size=1)
        options = dict(image_size=size, batch_size=batch, num_workers=workers)
        start = time.perf_counter()
        in_memory = ImageFolders(str(folder), val_size=1, **{**options, "num_workers": 0})
        in_memory.split("train")  # decodes every file (and writes the cache)
        decode_seconds = time.perf_counter() - start
        streaming = StreamingImages(str(work / f"chunks{size}"), **options)
        prepare = v2.Compose([v2.PILToTensor(), v2.Resize((size, size), antialias=True)])
        files = datasets.ImageFolder(str(folder / "train"), transform=prepare)
        loaders = {
            "in memory (ImageFolders)": in_memory.train_dataloader(),
            f"streaming (StreamingImages, {workers} workers)": streaming.train_dataloader(),
            f"ImageFolder + DataLoader ({workers} workers)": torch.utils.data.DataLoader(
                files, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
                persistent_workers=workers > 0,
            ),
        }  # fmt: skip
        if s3:
            url = f"{s3}/chunks{size}"
            write_chunks(folder, url, val_size=1)
            from_s3 = StreamingImages(url, **options)
            loaders[f"streaming from S3 ({workers} workers)"] = from_s3.train_dataloader()
        if torch.cuda.is_available():  # the workers hand on the files' bytes; nvJPEG decodes each batch
            on_gpu = StreamingImages(str(work / f"chunks{size}"), decode="device", **options)
            loaders[f"streaming, decoded on the GPU ({workers} workers read)"] = GPUDecoded(on_gpu)
        results[size] = {name: images_per_second(loader, epochs) for name, loader in loaders.items()}
        results[size]["in-memory decode, once (s)"] = decode_seconds
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["memory", "speed"])
    parser.add_argument("--sizes", type=int, nargs="+", help="memory: image counts; speed: pixel sizes")
    parser.add_argument("--image_size", type=int, default=64, help="memory: the images' size in pixels")
    parser.add_argument("--chunk_bytes", default="64MB", help="memory: the chunks' size (vit-chunks')")
    parser.add_argument("--per_class", type=int, default=500, help="speed: CIFAR-10 images a class")
    parser.add_argument("--workers", type=int, default=2, help="speed: loader workers of (b) and (c)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2, help="speed: epochs timed, after one of warm-up")
    parser.add_argument(
        "--work", type=Path, help="where the images and chunks go (default: a temporary folder)"
    )
    parser.add_argument("--smoke", action="store_true", help="a few generated images: seconds, any machine")
    parser.add_argument("--s3", action="store_true", help="also stream the chunks from an S3 server here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.per_class, args.batch, args.epochs = 4, 4, 1
    work = args.work or Path(tempfile.mkdtemp(prefix="vit-streaming-"))
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; torch {torch.__version__}")
    server = s3 = None
    environment = dict(os.environ)  # put back at the end: a test may call main()
    if args.s3:
        server = S3Server().start()
        os.environ.update(server.env())  # for this process, its loaders and the commands it runs
        os.environ["LITDATA_CACHE_DIR"] = str(work / "litdata-cache")  # read by litdata at import
        s3 = f"s3://{server.bucket()}"
    if args.what == "memory":
        sizes = args.sizes or ([30, 60] if args.smoke else [1000, 8000])
        image_size = 16 if args.smoke else args.image_size
        results = memory(sizes, image_size, work, args.chunk_bytes, s3)
        print(f"\npeak resident memory (MB), {image_size}-px JPEGs, chunks of {args.chunk_bytes}")
        print(f"{'process':32}" + "".join(f"{n:>10,} images" for n in sizes))
        for name, peaks in results.items():
            print(f"{name:32}" + "".join(f"{peaks[n]:17.0f}" for n in sizes))
    else:
        sizes = args.sizes or ([16] if args.smoke else [32, 224])
        results = speed(sizes, args.per_class, args.workers, args.batch, args.epochs, work, args.smoke, s3)
        for size, figures in results.items():
            count = args.per_class * (len(CLASSES) if args.smoke or not CIFAR10.is_dir() else 10)
            print(f"\n{size} px, {count} JPEGs, batches of {args.batch}: images/s out of the training loader")
            for name, value in figures.items():
                print(f"  {name:46} {value:10.1f}")
    if server is not None:
        server.stop()
        os.environ.clear()
        os.environ.update(environment)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
