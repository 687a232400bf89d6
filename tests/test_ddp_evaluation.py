"""Validation and test under DDP score every image once, as one process does: none repeated to even
out the processes' shares (Lightning's DistributedSampler pads an in-memory split to a multiple of
the processes), none dropped (litdata drops each process's last partial batch of the chunks). Two
processes against one, for an in-memory data module and for streamed chunks, with splits whose
sizes are no multiple of 2 x the batch size."""

from __future__ import annotations

import json
import os
import pickle
import socket
from collections import Counter
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import noise_folders
from seen import digest

from vit import ViTClassifier, ViTConfig
from vit.two_circles import TwoCircles

pytest.importorskip("litdata")

BATCH = 8


class Scored(L.Callback):
    """The images each validation and test scores in this process (a digest of each), and the
    images the accuracy counts over all processes (its true positives and false negatives, synced)."""

    def __init__(self):
        self.images = {"val": [], "test": []}
        self.counted: dict[str, int] = {}

    def _scored(self, stage: str, batch) -> None:
        self.images[stage] += [digest(image) for image in batch[0].cpu()]

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self._scored("val", batch)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._scored("test", batch)

    def _count(self, stage: str, metric) -> None:
        with metric.sync_context():  # every process's counts, as compute() reads them
            self.counted[stage] = int(metric.tp.sum() + metric.fn.sum())

    def on_validation_epoch_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self._count("val", pl_module.val_acc)

    def on_test_epoch_end(self, trainer, pl_module):
        self._count("test", pl_module.test_acc)


# The splits' sizes: two circles in memory, and chunks streamed (the test split fewer than two
# batches a process)
SIZES = {"in memory": {"val": 37, "test": 21}, "streamed": {"val": 39, "test": 9}}


def runs(chunks: Path) -> dict:
    """name -> (model, data module), the same each time: the two circles in memory, and the
    `chunks` streamed."""
    from vit.streaming import StreamingImages

    torch.manual_seed(0)
    vit = ViTConfig(preset="micro", patch_size=8)
    return {
        "in memory": (
            ViTClassifier(num_classes=4, image_size=32, in_channels=1, vit=vit),
            TwoCircles(num_train=32, num_val=37, num_test=21, batch_size=BATCH),
        ),
        "streamed": (
            ViTClassifier(num_classes=3, image_size=16, in_channels=3, vit=vit),
            StreamingImages(str(chunks), image_size=16, batch_size=BATCH),
        ),
    }


def evaluate(model, data, **trainer) -> dict:
    """A short fit (its validation at the end of one step), then validation and test of the
    weights it started with: the images each scored in this process and the accuracy counted,
    and the figures logged."""
    options = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False, num_sanity_val_steps=0)  # fmt: skip
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    fitted = Scored()
    L.Trainer(**options, **trainer, max_steps=1, limit_train_batches=1, callbacks=[fitted]).fit(model, data)
    model.load_state_dict(weights)
    scored = Scored()
    evaluator = L.Trainer(**options, **trainer, callbacks=[scored])
    figures = evaluator.validate(model, data, verbose=False)[0]
    figures |= evaluator.test(model, data, verbose=False)[0]
    return dict(fit=fitted.images["val"], images=scored.images, counted=scored.counted, figures=figures)


def evaluate_in_process(rank: int, port: int, runs: bytes, out: str) -> None:
    """One of two DDP processes (gloo on the CPU), set up as a launcher sets them up: `evaluate`
    on each of `runs`, written to out/<rank>.json."""
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
                   "NODE_RANK": "0", "LOCAL_RANK": str(rank), "RANK": str(rank)}  # fmt: skip
    torch.set_num_threads(1)
    results = {name: evaluate(*run, strategy="ddp", devices=2) for name, run in pickle.loads(runs).items()}
    (Path(out) / f"{rank}.json").write_text(json.dumps(results))


@pytest.mark.slow
def test_two_processes_score_every_image_once_as_one_does(tmp_path):
    from vit.chunk_writer import write_chunks

    counts = {split: SIZES["streamed"][split] // 3 for split in ("val", "test")}
    write_chunks(noise_folders(tmp_path / "folders", {"train": 8, **counts}), tmp_path / "chunks")
    one = {name: evaluate(*run, devices=1) for name, run in runs(tmp_path / "chunks").items()}
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    # each process gets its own copy of the models (the same weights) and data modules
    spawned = (port, pickle.dumps(runs(tmp_path / "chunks")), str(tmp_path))
    torch.multiprocessing.spawn(evaluate_in_process, args=spawned, nprocs=2)
    two = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    for name, alone in one.items():
        first, second = (process[name] for process in two)
        for stage, size in SIZES[name].items():
            images = Counter(alone["images"][stage])
            assert sum(images.values()) == size, (name, stage)
            shares = [Counter(process["images"][stage]) for process in (first, second)]
            assert all(shares), (name, stage)  # each process scored some
            assert shares[0] + shares[1] == images, (name, stage)  # together each image once
            assert first["counted"][stage] == second["counted"][stage] == alone["counted"][stage] == size
            assert first["figures"][f"{stage}/acc"] == alone["figures"][f"{stage}/acc"], (name, stage)
            loss = first["figures"][f"{stage}/loss"]
            assert loss == pytest.approx(alone["figures"][f"{stage}/loss"], rel=1e-6), (name, stage)
        # the validation of fit too, where the model is DDP's, whose first forward syncs buffers
        fitted = Counter(first["fit"]) + Counter(second["fit"])
        assert fitted == Counter(alone["fit"]) == Counter(alone["images"]["val"]), name


def test_each_process_evaluates_its_own_images_of_an_in_memory_split():
    """The loaders of 2 processes over 37 images in batches of 8: 19 and 18 images, none in both,
    none left out, 3 batches each; a DistributedSampler by type, which Lightning leaves in place."""
    from torch.utils.data import DistributedSampler

    from vit.datamodules import InMemory, batches

    split = InMemory(torch.zeros(37, 1, 2, 2), torch.arange(37))
    loaders = [batches(split, BATCH, processes=2, rank=rank) for rank in (0, 1)]
    assert all(isinstance(loader.sampler, DistributedSampler) for loader in loaders)
    shares = [torch.cat([labels for _, labels in loader]).tolist() for loader in loaders]
    assert [len(share) for share in shares] == [19, 18] and [len(loader) for loader in loaders] == [3, 3]
    assert sorted(shares[0] + shares[1]) == list(range(37))


def test_each_process_evaluates_its_own_images_of_streamed_chunks(tmp_path, monkeypatch):
    """The validation and test loaders of 2 processes over chunks of 39 and 9 images in batches
    of 8, as litdata sees them (WORLD_SIZE, GLOBAL_RANK: where no process group is set up): each
    image once, every process some, the 9 in batches of 4 so that each process has a batch."""
    from vit.chunk_writer import write_chunks
    from vit.streaming import StreamingImages

    write_chunks(noise_folders(tmp_path / "folders", {"train": 1, "val": 13, "test": 3}), tmp_path / "chunks")
    monkeypatch.setenv("WORLD_SIZE", "2")
    shares = []
    for rank in (0, 1):
        monkeypatch.setenv("GLOBAL_RANK", str(rank))
        data = StreamingImages(str(tmp_path / "chunks"), image_size=16, batch_size=BATCH)
        shares.append({"val": list(data.val_dataloader()), "test": list(data.test_dataloader())})
    for stage, size in SIZES["streamed"].items():
        images = [[digest(image) for images, _ in share[stage] for image in images] for share in shares]
        assert all(images) and len(set(images[0]) | set(images[1])) == len(images[0]) + len(images[1]) == size
    assert [len(images) for share in shares for images, _ in share["test"]] == [4, 4, 1]


def test_a_split_with_fewer_images_than_processes_is_one_line():
    """A process with no image to evaluate would leave the others waiting for it."""
    from types import SimpleNamespace

    from vit.errors import UsageError

    data = TwoCircles(num_train=32, num_val=3, num_test=3, batch_size=BATCH)
    data.trainer = SimpleNamespace(world_size=4, global_rank=0)
    with pytest.raises(UsageError, match="^the val split has 3 images for 4 processes: each needs one$"):
        data.val_dataloader()
