"""`EvidenceMass`, a training callback that follows where the model's maps look while it learns.
Here, beside the maps it scores, rather than in `vit.callbacks`: the core of vit imports nothing
from `vit.interpret`. Configs of earlier versions that name it `vit.callbacks.EvidenceMass` still
load (`vit.compat.MOVED_CLASSES`)."""

from __future__ import annotations

import torch
from lightning.pytorch.callbacks import Callback

from vit.interpret.evidence import patch_evidence
from vit.interpret.score import evidence_mass
from vit.model import ViT


class EvidenceMass(Callback):
    """After each validation of `fit`, the relevance mass (`vit.interpret.evidence.evidence_scores`) of
    attention rollout and gradient rollout on the first `num_images` validation images: the
    share of each map on the patches that carry the label, logged as
    `val/evidence_mass_rollout` and `val/evidence_mass_grad_rollout` (metrics.csv), beside
    `val/evidence_share` (what a map that knows nothing scores). Does the model look at the
    evidence before, while or after it learns the task? Data without evidence (its data module's
    `evidence` gives None): one line, nothing logged. On in configs/two_circles.yaml; elsewhere
    `--trainer.callbacks+=vit.interpret.callbacks.EvidenceMass`."""

    def __init__(self, num_images: int = 64, methods: tuple[str, ...] = ("rollout", "grad-rollout")):
        if num_images < 1:
            raise ValueError(f"EvidenceMass num_images={num_images} must be at least 1")
        self.num_images, self.methods = num_images, methods
        self._data = None  # (images, evidence patches), taken at the first validation
        self._off = False

    def _take_data(self, trainer, pl_module) -> None:
        datamodule, network = trainer.datamodule, getattr(pl_module, "model", None)
        evidence = getattr(datamodule, "evidence", lambda name: None)("val")
        if not isinstance(network, ViT) or evidence is None:
            why = f"{type(datamodule).__name__} has no evidence" if evidence is None else "not a ViT"
            print(f"EvidenceMass: nothing to log ({why})")
            self._off = True
            return
        images = datamodule.split("val")[: self.num_images][0]
        self._data = images, patch_evidence(network, evidence[: len(images)])

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit" or self._off:
            return
        if self._data is None:
            self._take_data(trainer, pl_module)
            if self._off:
                return
        images, evidence = self._data
        # validation runs under inference mode; gradient rollout needs gradients
        with torch.inference_mode(False), torch.enable_grad():
            masses = evidence_mass(pl_module.model, images, evidence, self.methods)
        for method, mass in masses.items():
            pl_module.log(f"val/evidence_mass_{method.replace('-', '_')}", mass.item())
        pl_module.log("val/evidence_share", evidence.float().mean().item())
