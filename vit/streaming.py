"""Image folders streamed from chunks (litdata), for data that outgrows memory: `StreamingImages`,
the data module of the chunks `vit-chunks` writes (`vit.chunk_writer`), on a disk or in an object
store, read through `vit.chunk_reader`.

litdata streams the chunks (sharded across processes, resumable mid-epoch: `resumable_loader`), and
each image is decoded in the loader's workers (`Decode`) or, with `decode="device"`, each batch of
JPEG files on the device it goes to (`decode_batch`). The evaluation commands read a split through
`StreamedSplit`, which decodes what they ask for.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import torch

from vit.chunk_reader import (
    Decode,
    Encoded,
    StreamedSplit,
    chunks_dataset,
    decode_batch,
    encoded_batch,
    read_manifest,
    resumable_loader,
)
from vit.chunk_writer import SPLITS
from vit.datamodules import ImageDataModule, ImageFolders
from vit.errors import DataError, DataNotFoundError, require
from vit.preparation import Preparation, to_float
from vit.storage import is_url


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
