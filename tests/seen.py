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
    """Records each training batch as the step receives it (augmented): a digest of each image
    (`batches`) and, for `make_folders`' flat images, which file each is (`files`: its label and
    its brightest level, which crops with black padding keep); and the weights when training ends.
    With `folder`, each process writes `folder/rank<N>.json` when training ends: its batches and
    files, and the node and local rank Lightning gave it; and its weights to `folder/rank<N>.pt`
    (`of_processes` reads both back)."""

    def __init__(self, folder: str | None = None):
        self.batches: list[list[str]] = []
        self.files: list[list[tuple[int, int]]] = []
        self.folder = folder

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        images, labels = batch[:2]
        self.batches.append([digest(image) for image in images])
        levels = (images.flatten(1).amax(1) * 255).round().int()
        self.files.append(list(zip(labels.tolist(), levels.tolist(), strict=True)))

    def on_train_end(self, trainer, pl_module):
        self.weights = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        if self.folder is not None:
            seen = {"node": trainer.node_rank, "local_rank": trainer.local_rank, "batches": self.batches,
                    "files": self.files}  # fmt: skip
            (Path(self.folder) / f"rank{trainer.global_rank}.json").write_text(json.dumps(seen))
            torch.save(self.weights, Path(self.folder) / f"rank{trainer.global_rank}.pt")

    @staticmethod
    def of_processes(folder: Path, count: int) -> list[dict]:
        """What each of `count` processes saw (`batches`, `files`) and the `weights` it ended with."""
        seen = [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(count)]
        for rank, process in enumerate(seen):
            process["weights"] = torch.load(folder / f"rank{rank}.pt", weights_only=True)
        return seen
