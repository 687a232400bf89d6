"""The chunks `vit.chunk_writer` wrote, read back: `read_manifest` reads `vit.json` and refuses a
folder written in another format; `chunks_dataset` is litdata's dataset of a split, on a disk or in
an object store; the loader's workers turn its items into images (`Decode`) or hand on the files'
bytes for the device to decode (`Encoded`, `encoded_batch`, `decode_batch`); `resumable_loader`
streams them resumably mid-epoch; the evaluation commands read a split through `StreamedSplit`,
which decodes what they ask for.

From an object store (`s3://bucket/prefix/train`) litdata reads through `vit.storage`, the
package's one client of the store (`vit.chunk_download`, the downloader it registers with litdata),
and keeps each chunk in its cache (`~/.lightning/chunks/`, or `$LITDATA_CACHE_DIR`). What goes
wrong there is one line (`reading`), in this process or in a loader's worker.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset

from vit import storage
from vit.chunk_writer import FORMAT, MANIFEST
from vit.datamodules import RandomStateAtResume
from vit.errors import DataError, DataNotFoundError, one_line
from vit.preparation import Preparation, to_float


def read_manifest(folder: str | Path) -> dict:
    """What `write_chunks` recorded in `folder/vit.json` (`folder` a path, or a URL `s3://...`);
    refuses a folder that is not there, or was written in another format."""
    if storage.is_url(folder):
        folder = str(folder).rstrip("/")
        storage.check_bucket(folder)
        path = f"{folder}/{MANIFEST}"
        if not storage.is_file(path):
            raise DataNotFoundError(f"chunks {folder}: no {MANIFEST}: not written by vit-chunks, or not yet")
        text = storage.read_bytes(path).decode()
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
    """What goes wrong reading the chunks of `folder` from an object store as one line, raised in
    this process or in a loader's worker (torch raises it again here with the worker's traceback
    in its message, the error itself on its last line): ours (`vit.storage`'s, naming the object
    and the endpoint) as it was raised; anything else naming `folder`. Chunks on a disk: as raised."""
    try:
        yield
    except Exception as e:
        if not storage.is_url(folder):
            raise
        text = str(e).strip()
        if text.startswith("Caught ") and "Traceback" in text:  # from a worker
            name, _, message = text.splitlines()[-1].partition(": ")
            if isinstance(e, DataError):
                raise type(e)(message) from e
            reason = f"{name.rsplit('.', 1)[-1]}: {message}"
        elif isinstance(e, DataError):
            raise
        else:
            reason = f"{type(e).__name__}: {text}"
        raise DataError(f"reading the chunks of {folder}: {one_line(reason)}") from e


def chunks_dataset(folder: str, **kwargs):
    """litdata's `StreamingDataset` (with `kwargs`) over the chunks of a split: a folder, or a URL
    (`s3://bucket/prefix/train`), read through `vit.storage` (`vit.chunk_download`) and cached
    where litdata caches (`~/.lightning/chunks/`, or `$LITDATA_CACHE_DIR`)."""
    from litdata import StreamingDataset

    if not storage.is_url(folder):
        return StreamingDataset(folder, **kwargs)
    from vit.chunk_download import PyTreeLoader  # and litdata's downloader for s3://, registered

    with reading(folder):
        return StreamingDataset(folder, item_loader=PyTreeLoader(), **kwargs)


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
