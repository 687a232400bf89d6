"""Data modules for real images: CIFAR-10, folders of image files, Fashion-MNIST.

The pipeline is the same for the three:

- **Decode once.** Each split is decoded into one uint8 tensor (N, C, H, W) plus int64 labels and
  kept in memory. Folders of image files are decoded by a few threads and cached on disk
  (`vit.decode`, `vit.cache`); CIFAR-10's pickled batches and Fashion-MNIST's IDX files are arrays
  already and are read directly.
- **Cheap loaders.** A batch is one index into the in-memory tensor (`InMemory.__getitems__`):
  no per-image work, `num_workers: 0` is enough.
- **Augment whole batches on the device.** The training loader yields uint8 batches;
  `on_after_batch_transfer` (training only) crops and flips every image with its own random
  offsets and mirror, applies an optional TrivialAugment/RandAugment policy, converts to float and
  optionally mixes images (MixUp, CutMix: soft labels), on the GPU when there is one.

Contract, shared with `TwoCircles` through `InMemoryDataModule` (vit-eval and vit-attention rely
on it): `split(name)` is the one way to read a split: an `InMemory` dataset whose items are
float32 images (C, H, W) in [0, 1] and int64 labels, ready for the model; the validation, test
and predict loaders yield its batches. The training loader of the three image data modules yields
uint8 images, which `on_after_batch_transfer` turns into the same float form (augmented).
`preparation` says how an image file becomes what the test split holds (mode, size, resize or
crop, border, class names); checkpoints store it. There is no mean/std normalisation: the patch
embedding is linear, so it represents any per-channel affine map of the pixels exactly, and
[0, 1] images can be drawn as they are.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from vit.augment import POLICIES, mix, random_crop_flip
from vit.decode import check_same_classes, class_folders, read_idx, read_image_folder, read_masks
from vit.errors import DataError, DataNotFoundError, UsageError, one_line, require
from vit.preparation import Preparation, to_float

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
FASHION_MNIST_NAMES = [name for pair in FASHION_MNIST_FILES.values() for name in pair]


def holdout(n: int, val_size: int | float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (train, val) of a seeded random split of range(n), each in increasing order:
    `val_size` images (an int) or that fraction of them (a float below 1) go to validation."""
    count = round(val_size * n) if isinstance(val_size, float) else val_size
    require(1 <= count < n, f"val_size={val_size} leaves no training or no validation images of {n}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return order[count:].sort().values, order[:count].sort().values


class InMemory(Dataset):
    """A split held in memory: `images` (N, C, H, W), uint8 or float in [0, 1], and `labels` (N,),
    indexed a whole batch at a time: the loader's batch sampler hands `__getitems__` a batch of
    indices, and it returns the batch with one index operation. Images come out float32 in
    [0, 1], ready for the model, unless `raw` (training: uint8 batches, which the data module
    augments and converts on the device). `indexed` batches also carry their indices (where
    augmentation depends on the image: alternating flips)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, raw: bool = False, indexed: bool = False):
        self.images, self.labels, self.raw, self.indexed = images, labels, raw, indexed

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index):
        images = self.images[index]
        return (images if self.raw else to_float(images)), self.labels[index]

    def __getitems__(self, indices: list[int] | torch.Tensor) -> tuple[torch.Tensor, ...]:
        index = torch.as_tensor(indices)
        if self.images.is_cuda and not index.is_cuda:  # from pinned memory, the copy does not wait
            index = index.pin_memory().to(self.images.device, non_blocking=True)
        return (*self[index], index) if self.indexed else self[index]


def rank_and_count() -> tuple[int, int]:
    """(this process's rank, the number of processes) of torch.distributed's process group, which
    Lightning sets up under DDP; (0, 1) without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def every_process(value) -> list:
    """`value` of every process, in rank order (`[value]` in one process); every process must
    ask, at the same point of its run."""
    count = rank_and_count()[1]
    if count == 1:
        return [value]
    values = [None] * count
    torch.distributed.all_gather_object(values, value)
    return values


def random_state() -> dict:
    """torch's random state in this process, which augmentation, dropout and MixUp draw from: the
    CPU generator's and, where CUDA is in use, each device's."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    return {"cpu": torch.get_rng_state(), "cuda": cuda}


def set_random_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class RandomStateAtResume:
    """A training loader (a DataLoader subclass) that puts back, when it makes its next iterator,
    the random state `random` that a resumed run had when its checkpoint was written (the data
    module's, `InMemoryDataModule.resuming`): in the middle of an epoch (`mid_epoch`, which the
    loader's own `load_state_dict` sets) just after that iterator has drawn its workers' seed, as
    the stopped epoch's iterator had drawn it before the checkpoint; at an epoch's end just before,
    as the next epoch's iterator of a run never stopped drew it from that state."""

    random: dict | None = None  # this process's random state, to put back
    mid_epoch = False  # the checkpoint was written in the middle of an epoch, which goes on

    def _get_iterator(self):
        if self.random is not None and not self.mid_epoch:
            set_random_state(self.random)
            self.random = None
        iterator = super()._get_iterator()  # draws its workers' seed from torch's random state
        if self.random is not None:
            set_random_state(self.random)
            self.random = None
        self.mid_epoch = False
        return iterator


class ShuffledBatches(DistributedSampler):
    """The batch sampler of a training loader: this process's batches of a shuffled epoch, each a
    slice of one index tensor on the data's `device`. The epoch's order crosses to a GPU once, from
    pinned memory without waiting, where a list of indices would be built on the host and copied
    at every step.

    In one process the batches come in the order `DataLoader(shuffle=True)` draws them for the
    same seed. With several (`processes`, this one `rank`), every process draws the epoch's seed
    and takes rank 0's, so that all shuffle alike, and takes its share of the order as Lightning's
    DistributedSampler would: the order padded with its first indices to a multiple of
    `processes`, then every `processes`-th index from `rank`. A DistributedSampler by type only, so
    that Lightning leaves it in place (`ResumableLoader.sampler`).

    `seed` is the current epoch's. `resume_at(seed, start)` makes the next epoch that epoch again
    from its batch `start` (`ResumableLoader`)."""

    def __init__(
        self,
        size: int,
        batch_size: int,
        drop_last: bool,
        device: torch.device,
        processes: int = 1,
        rank: int = 0,
    ):
        # not DistributedSampler's __init__, which asks torch.distributed for what is given here
        self.size, self.batch_size, self.drop_last, self.device = size, batch_size, drop_last, device
        self.num_replicas, self.rank = processes, rank  # DistributedSampler's names
        self.share = -(-size // processes)  # images a process takes each epoch
        self.seed: int | None = None
        self._resume: tuple[int, int] | None = None

    def __len__(self) -> int:
        return self.share // self.batch_size if self.drop_last else -(-self.share // self.batch_size)

    def resume_at(self, seed: int, start: int) -> None:
        self._resume = (seed, start)

    def __iter__(self):
        start = 0
        if self._resume is None:
            seed = int(torch.empty((), dtype=torch.int64).random_().item())  # as RandomSampler draws it
            self.seed = every_process(seed)[0] if self.num_replicas > 1 else seed
        else:
            (self.seed, start), self._resume = self._resume, None
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed))
        if self.num_replicas > 1:
            padded = self.share * self.num_replicas
            order = order.repeat(-(-padded // self.size))[:padded][self.rank :: self.num_replicas]
        if self.device.type == "cuda":
            order = order.pin_memory().to(self.device, non_blocking=True)
        yield from order.split(self.batch_size)[start : len(self)]


class ResumableLoader(RandomStateAtResume, DataLoader):
    """A training loader that knows where it is in its epoch, so that a run resumed from a
    checkpoint written in the middle of an epoch goes on with the batches it had not seen yet, in
    the same order, then the next epochs, in one process or several.

    Lightning puts `state_dict()` in every checkpoint it writes during fit, and gives it to
    `load_state_dict` before a resumed epoch begins, when that epoch was not finished: the epoch's
    shuffle seed and how many of its batches the loop has taken (the same in every process). The
    random state that the rest of the epoch and the next epochs' orders draw from (augmentation,
    dropout, MixUp) is the data module's to keep, as Lightning hands a loader's state back only
    mid-epoch; the loader puts it back (`RandomStateAtResume`)."""

    def __init__(self, dataset: Dataset, batch_sampler: ShuffledBatches, **kwargs):
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        self.taken = 0  # batches of the current epoch handed to the loop

    # Under DDP Lightning puts a DistributedSampler in place of a training loader's sampler unless
    # it is one already, and rebuilds the loader around it, which drops a batch sampler like ours
    # (`_requires_distributed_sampler`, `_update_dataloader`). So with several processes the
    # sampler it sees is the batch sampler, which takes its process's share itself; in one, the
    # DataLoader's own (a SequentialSampler, which a loader with a batch sampler never reads).
    @property
    def sampler(self) -> Sampler:
        return self.batch_sampler if self.batch_sampler.num_replicas > 1 else self._sampler

    @sampler.setter
    def sampler(self, sampler: Sampler) -> None:
        self._sampler = sampler

    def __iter__(self):
        if not self.mid_epoch:
            self.taken = 0
        for batch in super().__iter__():
            self.taken += 1
            yield batch

    def state_dict(self) -> dict:
        return {"seed": self.batch_sampler.seed, "taken": self.taken}

    def load_state_dict(self, state: dict) -> None:
        # not yet begun, or finished (Lightning hands the state of a finished epoch back where
        # training is counted in steps, max_steps): the next epoch starts afresh
        if state.get("seed") is None or state["taken"] >= len(self.batch_sampler):
            return
        self.batch_sampler.resume_at(state["seed"], state["taken"])
        self.taken, self.mid_epoch = state["taken"], True
        if "random" in state and self.random is None:  # written when the loader's state held it
            self.random = state["random"]


def whole_batch(batch):
    """collate_fn for `InMemory`: the batch is already made."""
    return batch


def batches(
    dataset: InMemory,
    batch_size: int,
    shuffle: bool = False,
    num_workers: int = 0,
    processes: int = 1,
    rank: int = 0,
) -> DataLoader:
    """The loader of every data module: whole batches of an `InMemory` split. Training's is
    shuffled: its batches are slices of the epoch's order on the data's device, this process's
    share of it where there are several (`ShuffledBatches`; a last partial batch is dropped unless
    it is the only one), and a run resumed from a checkpoint goes on where it stopped
    (`ResumableLoader`), with the random state its data module kept (`InMemoryDataModule`).
    Evaluation's (validation, test, predict) goes through the split in order; with several
    processes each takes every `processes`-th image from its `rank`, so that together they score
    each image once.

    Lightning would put a DistributedSampler into an evaluation loader, which pads the split with
    its first images to a multiple of the processes: those would count twice in the figures. Here
    the processes' shares differ by an image instead, and their batches by one at most, which is
    safe in evaluation, where nothing is synchronised at each batch (DDP syncs buffers at the
    first forward alone: every process needs one batch). The sampler is a DistributedSampler by
    type, so Lightning leaves it in place (`_requires_distributed_sampler`)."""
    loader = dict(collate_fn=whole_batch, num_workers=num_workers, persistent_workers=num_workers > 0)
    if shuffle:
        share = -(-len(dataset) // processes)
        order = ShuffledBatches(
            len(dataset), batch_size, share > batch_size, dataset.images.device, processes, rank
        )
        return ResumableLoader(dataset, order, **loader)
    if processes == 1:
        return DataLoader(dataset, batch_size=batch_size, **loader)
    shares = UnrepeatedDistributedSampler(dataset, num_replicas=processes, rank=rank, shuffle=False)
    return DataLoader(dataset, batch_size=batch_size, sampler=shares, **loader)


class InMemoryDataModule(L.LightningDataModule):
    """What every data module here shares (`ImageDataModule`'s three and `TwoCircles`): splits
    held in memory, `setup` by stage, and whole-batch loaders (`batches`).

    A subclass implements `split(name)`, which makes the split on first use and keeps it in
    `splits` (name -> `InMemory`); it may change what the training loader reads
    (`training_data`). The validation, test and predict loaders read `split(name)` as it is.
    Checkpoints hold torch's random state of every process (`state_dict`), which a resumed run's
    training loader puts back (`resuming`).
    """

    def __init__(self, batch_size: int, num_workers: int):
        super().__init__()
        require(batch_size >= 1, f"batch_size={batch_size} must be at least 1")
        require(num_workers >= 0, f"num_workers={num_workers} must be >= 0")
        self.batch_size, self.num_workers = batch_size, num_workers
        self.splits: dict[str, InMemory] = {}  # name -> images and labels, made on first use
        self.random_states: list[dict] | None = None  # a resumed run's, for its training loader

    def split(self, name: str) -> InMemory:
        """Split "train", "val" or "test": float32 images in [0, 1], ready for the model."""
        raise NotImplementedError

    def training_data(self) -> InMemory:
        """What the training loader shuffles: the train split."""
        return self.split("train")

    def evidence(self, name: str) -> torch.Tensor | None:
        """Which pixels of `split(name)` carry the label, where the data knows: (N, H, W) bool, in
        the order of the split's images; None where it does not (the evidence figures of
        `vit.interpret.score` are then left out). Two circles knows its circles; `ImageFolders`
        reads optional masks."""
        return None

    def state_dict(self) -> dict:
        """What Lightning writes of the data module in every checkpoint (each process is asked;
        rank 0's is written): torch's random state in every process, which augmentation, dropout
        and MixUp draw from."""
        return {"random": every_process(random_state())}

    def load_state_dict(self, state: dict) -> None:
        """Lightning hands the data module's state back whenever a run resumes (a loader's only
        when its epoch was not finished): every process's random state, which the next training
        loader puts back (`resuming`)."""
        self.random_states = state.get("random")

    def resuming(self, loader: RandomStateAtResume) -> RandomStateAtResume:
        """The training loader `loader`, given this process's random state in the checkpoint that
        a run resumed from, if no loader has been given it yet (`RandomStateAtResume`). A run
        resumed by another number of processes than wrote the checkpoint has none to give."""
        states, self.random_states = self.random_states, None
        rank, count = rank_and_count()
        if states is not None and len(states) == count:
            loader.random = states[rank]
        elif states is not None:
            rank_zero_warn(
                f"the checkpoint was written by {len(states)} processes and the run resumed by {count}: "
                f"it goes on, but not as one never stopped would (the rest of the epoch is shared out "
                f"anew, and the random state of augmentation and dropout is not put back)"
            )
        return loader

    def setup(self, stage: str) -> None:
        wanted = {"fit": ("train", "val"), "validate": ("val",)}
        for name in wanted.get(stage, ("test",)):
            self.split(name)
        device = self.trainer.strategy.root_device if self.trainer is not None else None
        if device is not None and device.type == "cuda":
            # held on the GPU (CIFAR-10's 60,000 images are 184 MB as uint8): a batch is one
            # index there, with no copy from the host at each step
            for split in self.splits.values():
                split.images, split.labels = split.images.to(device), split.labels.to(device)

    def processes_and_rank(self) -> tuple[int, int]:
        """How many processes the trainer runs (under DDP), and which this one is; (1, 0) without
        a trainer."""
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def train_dataloader(self) -> DataLoader:
        processes, rank = self.processes_and_rank()
        loader = batches(self.training_data(), self.batch_size, True, self.num_workers, processes, rank)
        return self.resuming(loader)

    def evaluation_dataloader(self, name: str) -> DataLoader:
        """Split `name` in order, each image once across the processes (`batches`)."""
        split = self.split(name)
        processes, rank = self.processes_and_rank()
        require(
            len(split) >= processes,
            f"the {name} split has {len(split)} images for {processes} processes: each needs one",
        )
        return batches(split, self.batch_size, num_workers=self.num_workers, processes=processes, rank=rank)

    def val_dataloader(self) -> DataLoader:
        return self.evaluation_dataloader("val")

    def test_dataloader(self) -> DataLoader:
        return self.evaluation_dataloader("test")

    def predict_dataloader(self) -> DataLoader:
        return self.test_dataloader()


class ImageDataModule(InMemoryDataModule):
    """What CIFAR10, ImageFolders and FashionMNIST share: splits decoded once into uint8 tensors,
    held-out validation and batched augmentation on the device (the loaders are
    `InMemoryDataModule`'s).

    `split(name)` and the validation, test and predict loaders give float32 images in [0, 1]
    ready for the model. The training loader yields uint8 images; `on_after_batch_transfer`
    augments them and converts them to float in [0, 1] (see `augment`). Subclasses pass their
    `preparation` (from `preparation_for`, which also reads it from a checkpoint's
    hyper-parameters) to this constructor and implement `read_split`.
    """

    has_val_split = False  # True when the data has its own validation split; else it is held out

    def __init__(
        self,
        root: str,
        *,
        preparation: Preparation,
        val_size: int | float,
        batch_size: int = 128,
        seed: int = 0,  # draws the held-out validation images
        crop_padding: int = 4,  # random crops of the image padded by this many pixels; 0: none
        # the padding's pixels: zeros, or the image reflected at its border (airbench's translation)
        crop_padding_mode: Literal["constant", "reflect"] = "constant",
        # random horizontal flips; alternate: airbench's, each image mirrored in every other epoch
        flip: bool | Literal["alternate"] = True,
        policy: Literal["none", "trivial", "randaugment"] = "none",  # each image draws its own operation
        mixup_alpha: float = 0.0,  # 0: no MixUp
        cutmix_alpha: float = 0.0,  # 0: no CutMix; with both, each batch uses one of the two
        num_workers: int = 0,  # whole-batch indexing of a tensor in memory needs no workers
    ):
        super().__init__(batch_size, num_workers)
        require(crop_padding >= 0, f"crop_padding={crop_padding} must be >= 0")
        require(
            crop_padding_mode in ("constant", "reflect"),
            f"crop_padding_mode={crop_padding_mode!r} must be 'constant' or 'reflect'",
        )
        require(flip in (True, False, "alternate"), f"flip={flip!r} must be true, false or 'alternate'")
        require(
            policy in ("none", *POLICIES), f"unknown policy {policy!r}; choose none, {', '.join(POLICIES)}"
        )
        require(mixup_alpha >= 0 and cutmix_alpha >= 0, "mixup_alpha and cutmix_alpha must be >= 0")
        valid_fraction = isinstance(val_size, float) and 0 < val_size < 1
        require(
            valid_fraction or (isinstance(val_size, int) and val_size >= 1),
            f"val_size={val_size} must be a count (an integer >= 1) or a fraction in (0, 1)",
        )
        self.root = Path(root).expanduser()
        self.preparation = preparation
        self.classes = list(preparation.classes)
        self.num_classes = len(self.classes)
        height, width = preparation.size
        self.image_size = height if height == width else (height, width)
        require(
            crop_padding_mode == "constant" or crop_padding < min(height, width),
            f"crop_padding={crop_padding} must be under the image's size ({height}x{width}) to reflect it",
        )
        self.in_channels = preparation.channels
        self.val_size, self.seed = val_size, seed
        self.crop_padding, self.crop_padding_mode, self.flip = crop_padding, crop_padding_mode, flip
        self.mirrored: torch.Tensor | None = None  # alternating flips: the even epochs' (training_data)
        self.policy = POLICIES.get(policy)
        self.mixup_alpha, self.cutmix_alpha = mixup_alpha, cutmix_alpha
        # True while a captured training step augments the raw batches in its graph instead
        # (`vit.captured_step.CapturedStep.take_over`)
        self.step_augments = False

    @classmethod
    def preparation_for(cls, hparams: dict) -> Preparation:
        """How this data module prepares images, from its constructor's arguments (or a
        checkpoint's record of them), without reading any file."""
        raise NotImplementedError

    def read_split(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 images (N, C, H, W) and int64 labels (N,) of split "train", "test" (and "val"
        when `has_val_split`)."""
        raise NotImplementedError

    def split(self, name: str) -> InMemory:
        """Split "train", "val" or "test": its images come out float32 in [0, 1], ready for the
        model (`.images` holds them as uint8). Read on first use."""
        require(name in ("train", "val", "test"), f"no split {name!r}; choose one of train, val, test")
        if name not in self.splits:
            if name in ("train", "val") and not self.has_val_split:
                images, labels = self.read_split("train")
                train, val = holdout(len(labels), self.val_size, self.seed)
                self.splits["train"] = InMemory(images[train], labels[train])
                self.splits["val"] = InMemory(images[val], labels[val])
            else:
                self.splits[name] = InMemory(*self.read_split(name))
        return self.splits[name]

    def training_data(self) -> InMemory:
        """The train split as uint8 images: `on_after_batch_transfer` augments whole batches on the
        device and converts them to float there. With alternating flips, the batches carry their
        indices, and `mirrored` (on the images' device) says which images the even epochs mirror:
        drawn from `seed`, so a resumed run draws the same."""
        train = self.split("train")
        if self.flip != "alternate":
            return InMemory(train.images, train.labels, raw=True)
        draw = torch.rand(len(train), generator=torch.Generator().manual_seed(self.seed))
        self.mirrored = (draw < 0.5).to(train.images.device)
        # the epoch's parity on the device too, filled before each batch (on_after_batch_transfer):
        # a compiled step that reads it is not recompiled when the epoch changes
        self.odd_epoch = torch.zeros((), dtype=torch.bool, device=train.images.device)
        return InMemory(train.images, train.labels, raw=True, indexed=True)

    def augment(
        self, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A training batch of uint8 images (B, C, H, W), on any device -> augmented float32 images
        in [0, 1], and the labels: (B,) class indices, or (B, num_classes) probabilities when MixUp
        or CutMix is on. `indices`: the images' in the train split (alternating flips need them).

        Every random choice is made per image, on the images' device (`vit.augment`): crops and
        flips, and a policy's operation and magnitude. MixUp or CutMix then mixes the batch.
        Alternating flips (airbench94's) are drawn once an image (`mirrored`): image i is mirrored
        in the even epochs where `mirrored[i]` and in the odd ones where not, so every two epochs
        it is seen both ways."""
        flip = self.flip
        if flip == "alternate":
            require(
                indices is not None and self.mirrored is not None,
                "flip=alternate needs the training loader's batches, which carry their indices",
            )
            flip = self.mirrored[indices] ^ self.odd_epoch
        images = random_crop_flip(images, self.crop_padding, flip, self.crop_padding_mode)
        if self.policy is not None:
            images = self.policy(images)
        return mix(to_float(images), labels, self.num_classes, self.mixup_alpha, self.cutmix_alpha)

    def start_epoch(self, epoch: int) -> None:
        """The epoch whose batches `augment` augments next: alternating flips read its parity."""
        if self.mirrored is not None:
            self.odd_epoch.fill_(epoch % 2 == 1)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        if self.trainer is not None and self.trainer.training:
            if self.mirrored is not None:
                self.start_epoch(self.trainer.current_epoch)
            if not self.step_augments:
                return self.augment(*batch)
        return batch


class CIFAR10(ImageDataModule):
    """CIFAR-10: 32x32 RGB images of 10 classes, 50,000 for training and 10,000 for testing.

    `root` holds either torchvision's copy, `root/cifar-10-batches-py/` (downloaded there with
    `download: true` where there is network), or image folders `root/train/<class>/*` and
    `root/test/<class>/*` named after the 10 classes (such as a JPEG copy; decoded once and
    cached). `val_size` training images, drawn with `seed`, are held out for validation; the test
    split is used only by `test`.
    """

    def __init__(self, root: str = "data/cifar10", download: bool = False, val_size: int = 5000, **kwargs):
        super().__init__(root, preparation=self.preparation_for({}), val_size=val_size, **kwargs)
        self.save_hyperparameters()
        self.download = download
        if (self.root / "cifar-10-batches-py").is_dir() or (download and not (self.root / "train").is_dir()):
            self.layout = "torchvision"
        elif (self.root / "train").is_dir():
            self.layout = "folders"
            check_same_classes(self.root / "train", CIFAR10_CLASSES, Path("CIFAR-10"))
        else:
            raise DataNotFoundError(self.where_to_put_files())

    @classmethod
    def preparation_for(cls, hparams: dict) -> Preparation:
        return Preparation(channels=3, size=32, classes=CIFAR10_CLASSES)

    def where_to_put_files(self) -> str:
        return (
            f"CIFAR-10 not found in {self.root}: put torchvision's cifar-10-batches-py folder there "
            f"(extracted from cifar-10-python.tar.gz; download: true fetches it where there is network), "
            f"or image folders {self.root}/train/<class>/ and {self.root}/test/<class>/"
        )

    def prepare_data(self) -> None:
        if self.layout == "torchvision" and self.download:
            from torchvision.datasets import CIFAR10 as TorchvisionCIFAR10

            try:
                for train in (True, False):
                    TorchvisionCIFAR10(str(self.root), train=train, download=True)
            except (OSError, RuntimeError) as e:
                raise DataError(f"download failed ({one_line(e)}); {self.where_to_put_files()}") from e

    def read_split(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        if self.layout == "folders":
            if not (self.root / name).is_dir():
                raise DataNotFoundError(
                    f"CIFAR-10 {name} images not found: expected {self.root}/{name}/<class>/"
                )
            check_same_classes(self.root / name, CIFAR10_CLASSES, Path("CIFAR-10"))
            return read_image_folder(self.root, name, self.classes, self.preparation, on_bad_file="error")
        from torchvision.datasets import CIFAR10 as TorchvisionCIFAR10

        try:
            data = TorchvisionCIFAR10(str(self.root), train=name == "train", download=False)
        except RuntimeError as e:  # torchvision: "Dataset not found or corrupted"
            raise DataNotFoundError(f"{one_line(e)} ({self.root}); {self.where_to_put_files()}") from e
        images = torch.from_numpy(data.data).permute(0, 3, 1, 2).contiguous()  # (N, H, W, C) -> (N, C, H, W)
        return images, torch.tensor(data.targets, dtype=torch.int64)


class ImageFolders(ImageDataModule):
    """Folders of image files: `root/train/<class>/*`, and `root/val/` and/or `root/test/` with the
    same class folders. Classes are the sorted folder names, or `classes` in the order given
    (checkpoints record them, and a folder evaluated later must have the same class folders).

    Images of any size and mode (grayscale, palette, RGBA, ...) are converted to RGB, or to
    grayscale with `channels: 1`, and resized to `image_size` x `image_size` (bilinear):
    stretched to the square (`resize: stretch`, the default), or with `resize: center_crop` scaled so
    that the shorter side fits, the aspect ratio kept, and the centre square cropped (like
    torchvision's Resize then CenterCrop); the same for images given later to vit-eval's predict
    and vit-attention. Without `root/val/`, `val_size` training images (a count, or a fraction below 1) drawn
    with `seed` are held out for validation. A file that cannot be decoded stops the run with an
    error naming it (`on_bad_file: error`) or is skipped and counted (`skip`). Decoded splits are
    cached (see the module docstring).
    """

    def __init__(
        self,
        root: str,
        image_size: int = 32,
        channels: Literal[1, 3] = 3,
        val_size: int | float = 0.1,
        on_bad_file: Literal["error", "skip"] = "error",
        classes: list[str] | None = None,  # label order; default: the sorted train class folders
        resize: Literal["stretch", "center_crop"] = "stretch",
        **kwargs,
    ):
        require(image_size >= 1, f"image_size={image_size} must be at least 1")
        # the values first (a bad value is bad usage, whatever the folders hold)
        preparation = self.preparation_for({"image_size": image_size, "channels": channels, "resize": resize})
        require(on_bad_file in ("error", "skip"), f"on_bad_file={on_bad_file!r} must be 'error' or 'skip'")
        train = Path(root).expanduser() / "train"
        absent = (
            f"image folder not found: {train} (ImageFolders reads {root}/train/<class>/<images> "
            f"and {root}/val/ and/or {root}/test/ alike)"
        )
        if not train.is_dir():
            raise DataNotFoundError(absent)
        if classes is None:
            classes = class_folders(train)
        else:
            require(len(set(classes)) == len(classes), f"classes={classes} names a class twice")
            check_same_classes(train, classes, "the classes given (a checkpoint's: its model's outputs)")
        preparation = replace(preparation, classes=classes)
        super().__init__(root, preparation=preparation, val_size=val_size, **kwargs)
        self.save_hyperparameters()
        # recorded in checkpoints, so that old checkpoints (without a preparation) name their classes
        self.hparams["classes"] = self.classes
        self.on_bad_file = on_bad_file
        self.has_val_split = (self.root / "val").is_dir()
        for name in ("val", "test"):
            if (self.root / name).is_dir():
                check_same_classes(self.root / name, classes, train)

    @classmethod
    def preparation_for(cls, hparams: dict) -> Preparation:
        return Preparation(
            channels=hparams.get("channels", 3),
            size=hparams.get("image_size", 32),
            resize=hparams.get("resize", "stretch"),  # older checkpoints: stretched
            classes=hparams.get("classes") or (),  # recorded by checkpoints since they have folders
        )

    def read_split(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        if not (self.root / name).is_dir():
            raise DataNotFoundError(f"no {name} split: {self.root / name} does not exist")
        return read_image_folder(self.root, name, self.classes, self.preparation, self.on_bad_file)

    def evidence(self, name: str) -> torch.Tensor | None:
        """The masks `root/masks/<split>/<class>/<image's name>.png` of split `name` (white:
        evidence), prepared as the images are: (N, H, W) bool; None without a masks folder. A
        held-out validation split takes the masks of the training images it holds."""
        require(name in ("train", "val", "test"), f"no split {name!r}; choose one of train, val, test")
        folder = "train" if name == "val" and not self.has_val_split else name
        if not (self.root / "masks" / folder).is_dir():
            return None
        masks = read_masks(self.root, folder, self.classes, self.preparation)
        held_out = folder == "train" and not self.has_val_split  # train and val share the folder
        images = len(self.split(folder).labels) + (len(self.split("val").labels) if held_out else 0)
        if len(masks) != images:  # files skipped as unreadable (on_bad_file: skip)
            raise DataError(f"{len(masks)} masks for {images} readable images in {self.root / folder}")
        if held_out:
            train, val = holdout(len(masks), self.val_size, self.seed)
            return masks[train if name == "train" else val]
        return masks


class FashionMNIST(ImageDataModule):
    """Fashion-MNIST (Xiao et al. 2017): 28x28 grayscale images of 10 kinds of clothing, 60,000
    for training and 10,000 for testing, from the original gzip IDX files.

    `root` holds `train-images-idx3-ubyte.gz`, `train-labels-idx1-ubyte.gz`,
    `t10k-images-idx3-ubyte.gz` and `t10k-labels-idx1-ubyte.gz` (or the same names without .gz),
    directly or in torchvision's layout `root/FashionMNIST/raw/`. Debian's package
    `dataset-fashion-mnist` installs them in the default `root`. Patch sizes 4 and 7 divide 28;
    `image_size: 32` pads every image with 2 black pixels on each side, for patch size 8 or 16.
    """

    def __init__(
        self,
        root: str = "/usr/share/datasets/fashion-mnist",
        image_size: int = 28,
        val_size: int | float = 5000,
        **kwargs,
    ):
        require(
            image_size >= 28 and image_size % 2 == 0,
            f"image_size={image_size} must be 28, or an even size above it (the images are padded)",
        )
        preparation = self.preparation_for({"image_size": image_size})
        super().__init__(root, preparation=preparation, val_size=val_size, **kwargs)
        self.save_hyperparameters()
        self.files = self.find_files()
        if self.files is None:
            raise DataNotFoundError(self.where_to_put_files())

    @classmethod
    def preparation_for(cls, hparams: dict) -> Preparation:
        """28x28 pictures, in a black border up to `image_size`."""
        size = hparams.get("image_size", 28)
        return Preparation(channels=1, size=size, pad=(size - 28) // 2, classes=FASHION_MNIST_CLASSES)

    def find_files(self) -> dict[str, Path] | None:
        """The four files, gzipped or not, in `root` or torchvision's `root/FashionMNIST/raw`."""
        for folder in (self.root, self.root / "FashionMNIST" / "raw"):
            found = {}
            for name in FASHION_MNIST_NAMES:
                for path in (folder / f"{name}.gz", folder / name):
                    if path.is_file():
                        found[name] = path
                        break
            if len(found) == len(FASHION_MNIST_NAMES):
                return found
        return None

    def where_to_put_files(self) -> str:
        expected = ", ".join(name + ".gz" for name in FASHION_MNIST_NAMES)
        return (
            f"Fashion-MNIST not found: expected {expected} in {self.root} "
            f"or {self.root}/FashionMNIST/raw (Debian: apt-get install dataset-fashion-mnist puts them "
            f"in /usr/share/datasets/fashion-mnist)"
        )

    def read_split(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        image_file, label_file = (self.files[n] for n in FASHION_MNIST_FILES[name])
        images, labels = read_idx(image_file), read_idx(label_file)
        if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.shape != images.shape[:1]:
            raise DataError(
                f"{image_file} holds images of shape {tuple(images.shape)} and {label_file} labels of "
                f"shape {tuple(labels.shape)}; expected (N, 28, 28) and (N,)"
            )
        if labels.max() >= len(FASHION_MNIST_CLASSES):
            raise DataError(f"{label_file} holds label {int(labels.max())}; Fashion-MNIST has 10 classes")
        border = self.preparation.pad
        return F.pad(images[:, None], (border,) * 4), labels.long()


def spread_test_images(datamodule, n: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """`n` test images spread evenly over the test split (image folders list theirs class by
    class, so the first `n` would often be one class), their labels and their indices."""
    split = datamodule.split("test")
    size = len(split)
    if size == 0:
        raise ValueError("the data module's test split is empty; give --images")
    indices = sorted(set(torch.linspace(0, size - 1, min(n, size)).round().long().tolist()))
    images, labels = split[indices]
    return images, labels, indices


def output_indices(names: list[str], preparation: Preparation, folder: Path) -> list[int]:
    """For each class folder name, the model output it names: a class name of the model or, for
    ImageNet heads, a synset (n01440764). A name the model does not know is a UsageError."""
    if not preparation.classes:
        raise UsageError("the model has no head (it outputs features): it has no classes to evaluate")
    lookup = {name: i for i, name in enumerate(preparation.classes)}
    lookup |= {name: i for i, name in enumerate(preparation.class_ids)}
    unknown = [name for name in names if name not in lookup]
    if unknown:
        ids = " or ImageNet synsets (such as n01440764)" if preparation.class_ids else ""
        raise UsageError(
            f"the model has no class {unknown[0]!r} (a class folder of {folder}; {len(unknown)} such); "
            f"name the folders by its class names ({', '.join(preparation.classes[:3])}, ...){ids}"
        )
    return [lookup[name] for name in names]


def class_folder_split(folder: Path, preparation: Preparation) -> tuple[InMemory, list[int]]:
    """The images of `folder/<class>/*` prepared for a model, labelled with the model output each
    class folder names (`output_indices`), and those outputs, in the model's order."""
    names = class_folders(folder)
    outputs = output_indices(names, preparation, folder)
    images, labels = read_image_folder(folder.parent, folder.name, names, preparation, on_bad_file="skip")
    return InMemory(images, torch.tensor(outputs)[labels]), sorted(set(outputs))
