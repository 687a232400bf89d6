"""What each training process is given: a callback for tests that train in other processes too
(vit-train under torchrun names it `--trainer.callbacks+=seen.SeenImages`, with tests/ on
PYTHONPATH)."""

import hashlib
import json
from pathlib import Path

import lightning as L
import torch


def digest(image: torch.Tensor) -> str:
    return hashlib.sha1(image.numpy().tobytes()).hexdigest()


class SeenImages(L.Callback):
    """Records the images of each training batch (a digest each), as the step receives them; with
    `folder`, each process writes `folder/rank<N>.json` when training ends: its batches, and the
    node and local rank Lightning gave it."""

    def __init__(self, folder: str | None = None):
        self.batches: list[list[str]] = []
        self.folder = folder

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append([digest(image) for image in batch[0]])

    def on_train_end(self, trainer, pl_module):
        if self.folder is not None:
            seen = {"node": trainer.node_rank, "local_rank": trainer.local_rank, "batches": self.batches}
            (Path(self.folder) / f"rank{trainer.global_rank}.json").write_text(json.dumps(seen))
