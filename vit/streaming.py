"""Image folders as streaming chunks (litdata): for data that outgrows memory.

`write_chunks(root, out)` reads the folder tree `ImageFolders` reads (`root/train/<class>/*`, and
`root/val/`, `root/test/` with the same class folders) and writes, per split, `out/<split>/`:
litdata's chunks (its `BinaryWriter`, the format `litdata.optimize` writes), each item an image
file's bytes as they are on disk (JPEG stays JPEG: no decoded pixels, so the chunks are about the
size of the files) and its label; and `out/vit.json`: the format, the classes in label order, each
split's image count and the files skipped. Every file is decoded once first, by a few threads with a
progress bar, so that a corrupt or truncated image is named in one line (`on_bad_file: error`) or
left out and listed (`skip`) before anything is written. The chunks are written into a hidden folder
beside `out` and renamed to `out` when complete: a run stopped at any moment leaves no `out`.

`out` may be a prefix of an S3 bucket (`s3://bucket/prefix`, `Store`): the chunks are written into a
temporary folder as for a disk, then uploaded, `vit.json` last, so that a reader never takes a set
still being uploaded for a complete one (S3 has no rename); a failure removes what was uploaded.
The endpoint and credentials come from the environment (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`,
...), as boto3 and litdata read them.

`read_manifest(out)` reads `vit.json` back and refuses a folder written in another format.

`StreamingImages` trains on the chunks: litdata streams them (sharded across processes, resumable
mid-epoch: `resumable_loader`), and each image is decoded in the loader's workers (`Decode`) or,
with `decode="device"`, each batch of JPEG files on the device it goes to (`decode_batch`). The
evaluation commands read a split through `StreamedSplit`, which decodes what they ask for.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Literal

import torch
from PIL import Image
from torch.utils.data import Dataset

from vit.datamodules import ImageDataModule, ImageFolders, RandomStateAtResume, holdout
from vit.decode import check_same_classes, class_folders, list_images, open_each
from vit.errors import DataError, DataNotFoundError, UsageError, one_line, require
from vit.preparation import Preparation, to_float
from vit.storage import is_url

FORMAT = "vit-chunks-1"  # what vit.json says; a reader refuses another
SPLITS = ("train", "val", "test")
MANIFEST = "vit.json"
# boto3's client for the chunks in an object store: a server that went away fails a read within
# seconds (litdata's own client makes up to 1000 attempts, botocore's default waits 60 s to connect)
S3_CLIENT = {
    "connect_timeout": 5,
    "read_timeout": 30,
    "retries": {"total_max_attempts": 3, "mode": "standard"},
}
# what the object store answers when the credentials are not accepted
REFUSED = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken"}


def client_config():
    """botocore's `Config` of `S3_CLIENT`."""
    from botocore.config import Config

    return Config(**S3_CLIENT)


class Store:
    """A prefix of an S3 bucket (`s3://bucket/prefix`, or a whole bucket: `s3://bucket`), reached with
    boto3 as litdata reaches it: the endpoint, region and credentials come from the environment
    (`AWS_ENDPOINT_URL`, `AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, ...).
    What goes wrong there is a one-line `DataError` naming the URL (`errors`)."""

    def __init__(self, url: str | Path):
        import boto3

        scheme, _, path = str(url).partition("://")
        require(scheme == "s3", f"{url}: only s3:// object stores are supported, not {scheme}://")
        self.bucket, _, prefix = path.partition("/")
        require(self.bucket != "", f"{url} names no bucket (s3://bucket/prefix)")
        self.prefix = prefix.strip("/")
        self.url = "/".join(["s3:/", self.bucket, *([self.prefix] if self.prefix else [])])
        self.client = boto3.client("s3", config=client_config())

    def key(self, name: str) -> str:
        """The key of object `name` under the prefix."""
        return f"{self.prefix}/{name}" if self.prefix else name

    @contextmanager
    def errors(self):
        """boto3's errors as one line naming the URL: a bucket that is not there
        (`DataNotFoundError`), no credentials or credentials refused, a server out of reach
        (`DataError`)."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        try:
            yield
        except NoCredentialsError:
            raise DataError(
                f"{self.url}: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
                f"AWS_PROFILE) in the environment"
            ) from None
        except ClientError as e:
            error = e.response.get("Error", {})
            code, message = error.get("Code"), error.get("Message") or one_line(e)
            where = self.client.meta.endpoint_url
            if code == "NoSuchBucket":
                raise DataNotFoundError(f"{self.url}: no bucket {self.bucket!r} at {where}") from None
            if code in REFUSED:
                raise DataError(
                    f"{self.url}: {where} refused the credentials ({code}: {one_line(message)}); "
                    f"they are read from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
                ) from None
            raise DataError(f"{self.url}: {code}: {one_line(message)}") from None
        except BotoCoreError as e:
            raise DataError(f"{self.url}: {one_line(e)}") from None

    def is_empty(self) -> bool:
        """Whether no object's key starts with the prefix; a missing bucket, refused credentials or
        a server out of reach fail here, before any work."""
        with self.errors():
            listed = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.key(""), MaxKeys=1)
        return listed["KeyCount"] == 0

    def read(self, name: str) -> bytes | None:
        """Object `name`'s bytes; None where there is none."""
        with self.errors():
            try:
                return self.client.get_object(Bucket=self.bucket, Key=self.key(name))["Body"].read()
            except self.client.exceptions.NoSuchKey:
                return None

    def put(self, path: Path, name: str) -> None:
        with self.errors(), open(path, "rb") as f:
            self.client.put_object(Bucket=self.bucket, Key=self.key(name), Body=f)

    def upload(self, folder: Path) -> None:
        """Every file under `folder` as the object of its relative path under the prefix,
        `MANIFEST` last; on any failure the objects uploaded are deleted (as far as the store
        lets: where it does not, what is left has no `MANIFEST`, so no reader takes it)."""
        files = sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())
        files.sort(key=lambda name: name == MANIFEST)  # last: the sign that the rest is there
        uploaded = []
        try:
            for name in files:
                self.put(folder / name, name)
                uploaded.append(name)
        except BaseException:
            self.delete(uploaded)
            raise

    def delete(self, names: list[str]) -> None:
        """Delete objects `names`; stops at the first that fails (the store is out of reach, and
        each further try would wait as long), saying what is left."""
        for i, name in enumerate(names):
            try:
                self.client.delete_object(Bucket=self.bucket, Key=self.key(name))
            except Exception:
                print(
                    f"warning: could not delete {len(names) - i} objects uploaded to {self.url}; delete them"
                )
                return


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
    store = Store(out) if is_url(out) else None
    out = store.url if store else Path(out).expanduser()
    if on_bad_file not in ("error", "skip"):
        raise UsageError(f"on_bad_file={on_bad_file!r} must be 'error' or 'skip'")
    if store is None and out.exists():
        raise UsageError(f"{out} already exists; remove it, or write the chunks to another folder")
    train = root / "train"
    if not train.is_dir():
        raise DataNotFoundError(f"image folder not found: {train} (expected {root}/train/<class>/<images>)")
    classes = class_folders(train) if classes is None else list(classes)
    splits = [name for name in SPLITS if (root / name).is_dir()]
    for name in splits:
        check_same_classes(root / name, classes, train)
    if store is not None and not store.is_empty():  # the bucket and the credentials checked, too
        raise UsageError(f"{out} already holds objects; delete them, or write the chunks to another prefix")
    held_out = "val" not in splits
    val_from = "folder" if not held_out else f"held out of train: val_size {val_size}, seed {seed}"
    manifest = {"format": FORMAT, "classes": classes, "images": {}, "skipped": {}, "val": val_from}
    if store is None:
        partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    else:  # uploaded when complete
        partial = Path(tempfile.mkdtemp(prefix="vit-chunks-"))
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
        if store is None:
            partial.rename(out)
        else:
            store.upload(partial)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    counts = ", ".join(f"{name} {n}" for name, n in manifest["images"].items())
    print(f"wrote the chunks of {counts} images into {out} in {time.perf_counter() - started:.1f} s")
    return manifest


def read_manifest(folder: str | Path) -> dict:
    """What `write_chunks` recorded in `folder/vit.json` (`folder` a path, or a URL `s3://...`);
    refuses a folder that is not there, or was written in another format."""
    if is_url(folder):
        store = Store(folder)
        folder, path, text = store.url, f"{store.url}/{MANIFEST}", store.read(MANIFEST)
        if text is None:
            raise DataNotFoundError(f"chunks {folder}: no {MANIFEST}: not written by vit-chunks, or not yet")
    else:
        folder = Path(folder).expanduser()
        path = folder / MANIFEST
        if not path.is_file():
            what = "no such folder" if not folder.exists() else f"no {MANIFEST}: not written by vit-chunks"
            raise DataNotFoundError(f"chunk folder {folder}: {what}")
        text = path.read_text()
    try:
        manifest = json.loads(text)
    except ValueError as e:
        raise DataError(f"{path} is not JSON ({one_line(e)})") from None
    if manifest.get("format") != FORMAT:
        raise DataError(
            f"{folder} holds chunks of format {manifest.get('format')!r}, not {FORMAT!r}: "
            f"write them again with vit-chunks"
        )
    return manifest


@contextmanager
def reading(folder: str):
    """Any error while reading the chunks of `folder` from an object store (a server gone away:
    botocore's error, or litdata's when its download thread stopped), raised in this process or
    in a loader's worker (torch raises it again here with the worker's traceback in its message,
    the error itself on its last line), as one line naming the URL. Chunks on a disk: as raised."""
    try:
        yield
    except Exception as e:
        if not is_url(folder):
            raise
        lines = str(e).strip().splitlines()
        from_worker = str(e).startswith("Caught ") and "Traceback" in str(e)
        reason = lines[-1] if from_worker else f"{type(e).__name__}: {e}"
        raise DataError(f"reading the chunks of {folder}: {one_line(reason)}") from e


def litdata_for_object_stores() -> None:
    """Two changes to litdata (tested with 0.2.76) for reading chunks from an object store, made
    for the whole process when a `chunks_dataset` first does (forked loader workers inherit them):
    - every request goes through litdata's boto3 client, which takes `S3_CLIENT`: its chunk
      downloads otherwise go through obstore, which takes neither those retries (it retries a
      server gone away for 3 minutes) nor an http:// endpoint (a MinIO without TLS). litdata falls
      back to boto3 itself where obstore's runtime belongs to another process (a worker forked
      after obstore started): here it is said to;
    - its download thread, stopped by an error, no longer prints the error's traceback: the
      reader raises it where it waits for the chunk, and `reading` makes that one line."""
    from litdata.streaming import downloader, reader

    downloader._OBSTORE_INIT_PID = -1  # no process of ours
    reader.PrepareChunksThread._report_crash = lambda thread, error: None


def chunks_dataset(folder: str, **kwargs):
    """litdata's `StreamingDataset` (with `kwargs`) over the chunks of a split: a folder, or a URL
    (`s3://bucket/prefix/train`), read with boto3's client of `S3_CLIENT` (few retries, short
    timeouts) and cached where litdata caches (`~/.lightning/chunks/`, or `$LITDATA_CACHE_DIR`)."""
    from litdata import StreamingDataset

    if not is_url(folder):
        return StreamingDataset(folder, **kwargs)
    litdata_for_object_stores()
    with reading(folder):
        return StreamingDataset(folder, storage_options={"config": client_config()}, **kwargs)


class Decode:
    """An item of the chunks -> (uint8 image (C, H, W) prepared with `preparation`, label): what
    the loader's workers run on each item."""

    def __init__(self, preparation: Preparation):
        self.preparation = preparation

    def __call__(self, item: dict) -> tuple[torch.Tensor, int]:
        with Image.open(io.BytesIO(bytes(item["image"]))) as image:
            return self.preparation.pixels(image), int(item["label"])


class Encoded:
    """An item of the chunks -> (the file's bytes as a 1-D uint8 tensor, label): what the loader's
    workers hand on when the batches are decoded on the device (`decode_batch`)."""

    def __call__(self, item: dict) -> tuple[torch.Tensor, int]:
        return torch.frombuffer(bytearray(item["image"]), dtype=torch.uint8), int(item["label"])


def encoded_batch(items: list[tuple[torch.Tensor, int]]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """collate_fn of encoded items: the files' bytes as a list (their lengths differ), the labels."""
    files, labels = zip(*items, strict=True)
    return list(files), torch.tensor(labels)


def decode_batch(files: list[torch.Tensor], preparation: Preparation, device: torch.device) -> torch.Tensor:
    """JPEG files' bytes (1-D uint8 tensors on the CPU) -> uint8 images (B, C, H, W) on `device`,
    decoded there as one batch (torchcodec's `decode_jpeg`: nvJPEG on a GPU) and prepared there
    as `preparation` says (`Preparation.tensor_pixels`: Pillow's resampling, to within one level)."""
    from torchcodec.decoders import decode_jpeg

    not_jpeg = [i for i, data in enumerate(files) if bytes(data[:3]) != b"\xff\xd8\xff"]
    if not_jpeg:
        raise DataError(
            f"decode='device' reads JPEG files only, and {len(not_jpeg)} of this batch are not; "
            f"decode them in the loader's workers (decode='workers')"
        )
    # RGB, then Pillow's grayscale where one channel is asked for: the JPEG's own luma is a level or two off
    images = decode_jpeg(files, mode="RGB", device=device)
    return torch.stack([preparation.tensor_pixels(image) for image in images])


class StreamedSplit(Dataset):
    """A split of the chunks read on demand, for the evaluation commands: `split[i]`,
    `split[start:stop]` or `split[indices]` decodes those images alone and returns them as
    `InMemory` does, float32 in [0, 1] ready for the model, with their labels. A command that
    walks the split in batches holds one batch of pixels at a time, whatever the split's size."""

    def __init__(self, folder: str, preparation: Preparation):
        self.folder = folder
        self.items = chunks_dataset(folder)
        self.decode = Decode(preparation)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index) -> tuple[torch.Tensor, torch.Tensor]:
        with reading(self.folder):
            if isinstance(index, int):
                image, label = self.item(index)
                return to_float(image), torch.tensor(label)
            indices = range(len(self))[index] if isinstance(index, slice) else torch.as_tensor(index).tolist()
            images, labels = zip(*(self.item(i) for i in indices), strict=True)
            return to_float(torch.stack(images)), torch.tensor(labels)

    def item(self, i: int) -> tuple[torch.Tensor, int]:
        # a slice of one: litdata (0.2.76) reads `dataset[i]` from an object store alone, by byte
        # ranges of another chunk layout than its writer's, and gets nothing; a slice downloads
        # the chunk into its cache, as iterating does
        return self.decode(self.items[i : i + 1][0])


def resumable_loader(dataset, epoch: Callable[[], int] | None = None, **kwargs):
    """litdata's `StreamingDataLoader` over `dataset` (from `chunks_dataset`: what goes wrong
    reading it from an object store is one line, `reading`), resumable: Lightning puts its
    `state_dict()` (the epoch, the samples yielded) in every checkpoint and hands it back to
    `load_state_dict` when a run resumes in the middle of an epoch, and the loader then goes on with
    the samples of that epoch it had not yielded, each process with its share; the random state
    that augmentation and dropout draw from is the data module's to keep, and the loader puts it
    back (`RandomStateAtResume`). litdata starts a new epoch afresh only when the previous epoch's
    iterator ran out, and Lightning stops reading an epoch at its known length without asking for
    the item after the last: so here every epoch but the one just resumed starts from its
    beginning, and shuffles as litdata shuffles Lightning's `epoch()` (litdata counts from 1),
    which a run resumed at an epoch's end, whose loader Lightning gives no state, needs."""
    from litdata import StreamingDataLoader

    class Loader(RandomStateAtResume, StreamingDataLoader):
        resumed = False  # a state was loaded, and its epoch has not begun yet

        def load_state_dict(self, state: dict) -> None:
            super().load_state_dict(state)
            self.resumed = self.mid_epoch = self.restore

        def __iter__(self):
            self.restore, self.resumed = self.resumed, False
            if not self.restore and epoch is not None:
                self.current_epoch = max(self.current_epoch, epoch())  # litdata adds 1
            with reading(self.dataset.input_dir.url or ""):
                yield from super().__iter__()

    return Loader(dataset, **kwargs)


class StreamingImages(ImageDataModule):
    """The chunks `vit-chunks` wrote (`root/train/`, `val/`, `test/`, `vit.json`; `root` a folder or
    a URL `s3://bucket/prefix`: `chunks_dataset`), streamed: the loaders read the chunks through
    litdata (`StreamingDataset`, `StreamingDataLoader`: shuffled per epoch, sharded across
    processes and machines, resumable mid-epoch) and decode each image in the loader's workers
    (`num_workers`), or with `decode="device"` each batch of JPEG files on the device it goes to,
    prepared as `ImageFolders` prepares files (`image_size`, `channels`, `resize`); the classes
    are the chunks'. No split is held in memory: the batches are augmented on the device as the
    other data modules' are, and `split(name)` (what the evaluation commands read) is a
    `StreamedSplit`, which decodes the images a command asks for when it asks.
    """

    has_val_split = True  # vit-chunks writes one (held out of train where the folders had none)

    def __init__(
        self,
        root: str,
        image_size: int = 32,
        channels: int = 3,
        resize: str = "stretch",
        classes: list[str] | None = None,  # a checkpoint's: the chunks must have these classes, in order
        decode: Literal["workers", "device"] = "workers",  # device: JPEG batches decoded on the GPU
        **kwargs,
    ):
        require(image_size >= 1, f"image_size={image_size} must be at least 1")
        require(decode in ("workers", "device"), f"decode={decode!r} must be 'workers' or 'device'")
        require(kwargs.get("flip") != "alternate", "flip=alternate needs image indices; streaming has none")
        preparation = self.preparation_for({"image_size": image_size, "channels": channels, "resize": resize})
        manifest = read_manifest(root)
        if classes is not None and list(classes) != manifest["classes"]:
            raise DataError(
                f"the chunks in {root} have the classes {manifest['classes']}, not {list(classes)}"
            )
        preparation = replace(preparation, classes=manifest["classes"])
        super().__init__(root, preparation=preparation, val_size=1, **kwargs)
        if is_url(root):  # not a Path, which would make s3://bucket s3:/bucket
            self.root = root.rstrip("/")
        self.save_hyperparameters()
        self.hparams["classes"] = self.classes
        self.manifest, self.decode = manifest, decode

    @classmethod
    def preparation_for(cls, hparams: dict) -> Preparation:
        return ImageFolders.preparation_for(hparams)  # the same options, prepared the same way

    def dataset(self, name: str, shuffle: bool):
        """litdata's dataset of split `name`, dealt as one node's whatever the nodes. litdata counts
        the nodes itself (the world's processes over one machine's GPUs, or NNODES) and, counting
        several, keeps each node from the second epoch on to the chunks it was dealt in the
        first, so that its cache of a remote data set stays warm; but a chunk split between two
        nodes then goes to both, whole: its images are seen twice an epoch, others never, and
        the processes' shares differ in length (the longer waits for the others at its last
        step). Counted as one node, every epoch is dealt afresh across all processes, each image
        once; chunks read where they lie (a disk, a shared file system) need no cache, and those
        of an object store cost a colder cache (a node downloads chunks it did not read before).

        Evaluated (not `shuffle`), no image is dropped: with several processes litdata drops
        each one's last partial batch (`drop_last`), which a training epoch can spare and a
        validation's figures cannot (`loader`)."""
        from litdata.utilities.env import _DistributedEnv

        transform = Encoded() if self.decode == "device" else Decode(self.preparation)
        folder = str(self.folder(name))
        dataset = chunks_dataset(folder, shuffle=shuffle, seed=self.seed, transform=transform)
        world = dataset.distributed_env
        dataset.distributed_env = _DistributedEnv(world.world_size, world.global_rank, num_nodes=1)
        if not shuffle:  # set here: litdata warns of drop_last=False given with several processes
            dataset.drop_last = False
        return dataset

    def loader(self, name: str, shuffle: bool = False):
        """Batches of split `name`; shuffled, a last partial batch is dropped, as `batches` drops
        it, unless it is the only one. Evaluated, each image once across the processes: litdata
        deals each process whole batches, as many each, and the images left over to the last
        process; the batches are smaller where the split holds fewer than one a process, since
        a process with none would leave the others waiting (DDP syncs buffers at the first
        forward of a validation)."""
        dataset = self.dataset(name, shuffle)
        images, batch_size = self.manifest["images"][name], self.batch_size
        if not shuffle:
            processes = dataset.distributed_env.world_size
            require(
                images >= processes,
                f"the {name} split has {images} images for {processes} processes: each needs one",
            )
            batch_size = min(batch_size, images // processes)
        drop_last = shuffle and images > batch_size
        collate = {"collate_fn": encoded_batch} if self.decode == "device" else {}
        epoch = self.epoch if shuffle else None
        return resumable_loader(dataset, epoch, batch_size=batch_size, num_workers=self.num_workers,
                                drop_last=drop_last, **collate)  # fmt: skip

    def folder(self, name: str) -> str:
        """Where the chunks of split `name` are (a path or a URL); refuses a split the chunks do
        not have."""
        require(name in SPLITS, f"no split {name!r}; choose one of {', '.join(SPLITS)}")
        if name not in self.manifest["images"]:
            raise DataNotFoundError(f"the chunks in {self.root} have no {name} split")
        return f"{self.root}/{name}"

    def split(self, name: str) -> StreamedSplit:
        return StreamedSplit(self.folder(name), self.preparation)

    def setup(self, stage: str) -> None:
        pass  # the loaders stream; nothing to read first

    def epoch(self) -> int:
        """Lightning's current epoch (0 outside a trainer): what the training loader shuffles for."""
        return self.trainer.current_epoch if self.trainer is not None else 0

    def train_dataloader(self):
        return self.resuming(self.loader("train", shuffle=True))

    def val_dataloader(self):
        return self.loader("val")

    def test_dataloader(self):
        return self.loader("test")

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        if self.decode == "device":  # the files' bytes: decoded where the batch is going
            files, labels = batch
            device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
            return decode_batch(files, self.preparation, device), labels
        return batch

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """Every split streams uint8 images: training batches are augmented as every data module's
        are; the others are only made float."""
        if self.trainer is not None and self.trainer.training:
            return super().on_after_batch_transfer(batch, dataloader_idx)
        images, labels = batch
        return to_float(images), labels
