"""vit-train's callbacks beside Lightning's: a progress bar and a model summary that say true
things (the epoch under a time budget, the learning rate, the FLOPs of the network), `EMA`, a
moving average of the weights, and `EvidenceMass`, which follows where the model's maps look
while it learns."""

from __future__ import annotations

import itertools

import torch
from lightning.pytorch.callbacks import Callback, RichModelSummary, RichProgressBar, WeightAveraging
from lightning.pytorch.utilities.model_summary import get_human_readable_count
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from vit.classifier import training_timer


class ProgressBar(RichProgressBar):
    """Lightning's bar, with an epoch count that means something: `Epoch 3/5` with an epoch
    limit, `Epoch 17` without one (Lightning printed `Epoch 17/-2` for `max_epochs: -1`), and the
    minutes left of a time budget at the epoch's start; the learning rate in scientific notation
    (3 decimals showed 3e-05 as 0.000) and no `v_num` (the run's version, cut to its last 4
    characters: `rain` for a run named `train`)."""

    def _get_train_description(self, current_epoch: int) -> str:
        description = f"Epoch {current_epoch}"
        if (self.trainer.max_epochs or -1) > 0:
            description += f"/{self.trainer.max_epochs - 1}"
        timer = training_timer(self.trainer)
        if timer is not None and (left := timer.time_remaining()) is not None:
            description += f", {left / 60:.1f} min left"
        # as wide as "Validation", so that the bar does not jump between the two
        return f"{description:{len(self.validation_description)}}"

    def get_metrics(self, trainer, pl_module) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return {k: f"{v:.2e}" if k.endswith("/lr") else v for k, v in metrics.items()}


def forward_flops(network: torch.nn.Module, images: torch.Tensor) -> int:
    """FLOPs of one forward pass of `images` in eval mode, counted as benchmarks/throughput.py
    counts them: `torch.utils.flop_counter` with attention spelled out as matmuls (the counter
    does not see the CPU's fused attention kernel). `.forward` runs a compiled network eagerly."""
    training = network.training
    network.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
            network.forward(images)
    finally:
        network.train(training)
    return counter.get_total_flops()


class ModelSummary(RichModelSummary):
    """Lightning's summary with the real FLOPs of the network: Lightning counts them only for a
    module with an `example_input_array`, and printed `Total FLOPs: 0` for every model here."""

    def on_fit_start(self, trainer, pl_module) -> None:
        hparams = pl_module.hparams
        size = hparams.get("image_size")
        self._flops = None
        if size is not None and hparams.get("in_channels") is not None:
            height, width = (size, size) if isinstance(size, int) else size
            image = torch.zeros(1, hparams.in_channels, height, width, device=pl_module.device)
            self._flops = forward_flops(pl_module.model, image)
        super().on_fit_start(trainer, pl_module)

    def summarize(self, summary_data, *args, total_flops: int, **kwargs) -> None:
        if self._flops is None:  # a module of someone else's: Lightning's summary as it is
            return super().summarize(summary_data, *args, total_flops=total_flops, **kwargs)
        columns = dict(summary_data)
        flops = [
            get_human_readable_count(self._flops) if name == "model" else "0" for name in columns["Name"]
        ]
        summary_data = [(name, flops if name == "FLOPs" else values) for name, values in summary_data]
        super().summarize(summary_data, *args, total_flops=self._flops, **kwargs)
        print("FLOPs: one image's forward pass (a training step costs about 3 times that per image)")


class EMA(WeightAveraging):
    """An exponential moving average of the weights and buffers (BatchNorm's statistics), kept in
    fp32 beside the network: validation, the checkpoints (so best.ckpt and vit-eval) and the
    network after training are the average; training goes on from its own weights (Lightning's
    `WeightAveraging` swaps them). The decay warms up as timm's `ModelEmaV3` does,
    min(decay, (1 + t) / (10 + t)) after optimizer step t, so that a short run keeps little of
    its random start. One multi-tensor lerp a step and nothing read back from the device: torch's
    `AveragedModel.update_parameters` reads its step counter from the GPU at every step, a
    synchronisation that would stall a fast GPU loop. Use it with `--trainer.callbacks+=vit.callbacks.EMA`."""

    def __init__(self, decay: float = 0.999):
        if not 0 < decay < 1:
            raise ValueError(f"EMA decay={decay} must lie in (0, 1)")
        super().__init__(use_buffers=True)
        self.decay = decay

    @torch.no_grad()
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step  # optimizer steps so far; the same while gradients accumulate
        if step <= self._latest_update_step:
            return
        self._latest_update_step = step
        weight = 1 - min(self.decay, (1 + step) / (10 + step))  # of the network's current values
        module = self._average_model.module
        pairs = zip(
            itertools.chain(module.parameters(), module.buffers()),
            itertools.chain(pl_module.parameters(), pl_module.buffers()),
            strict=True,
        )
        averages, currents = [], []
        for average, current in pairs:
            if average.is_floating_point():
                averages.append(average)
                currents.append(current.detach())
            else:  # counters (BatchNorm's num_batches_tracked) follow the network
                average.copy_(current)
        torch._foreach_lerp_(averages, currents, weight)


class EvidenceMass(Callback):
    """After each validation of `fit`, the relevance mass (`vit.faithfulness.evidence_scores`) of
    attention rollout and gradient rollout on the first `num_images` validation images: the
    share of each map on the patches that carry the label, logged as
    `val/evidence_mass_rollout` and `val/evidence_mass_grad_rollout` (metrics.csv), beside
    `val/evidence_share` (what a map that knows nothing scores). Does the model look at the
    evidence before, while or after it learns the task? Data without evidence (its data module's
    `evidence` gives None): one line, nothing logged. On in configs/two_circles.yaml; elsewhere
    `--trainer.callbacks+=vit.callbacks.EvidenceMass`."""

    def __init__(self, num_images: int = 64, methods: tuple[str, ...] = ("rollout", "grad-rollout")):
        if num_images < 1:
            raise ValueError(f"EvidenceMass num_images={num_images} must be at least 1")
        self.num_images, self.methods = num_images, methods
        self._data = None  # (images, evidence patches), taken at the first validation
        self._off = False

    def _take_data(self, trainer, pl_module) -> None:
        from vit.faithfulness import patch_evidence
        from vit.model import ViT

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
        from vit.faithfulness import evidence_mass

        images, evidence = self._data
        # validation runs under inference mode; gradient rollout needs gradients
        with torch.inference_mode(False), torch.enable_grad():
            masses = evidence_mass(pl_module.model, images, evidence, self.methods)
        for method, mass in masses.items():
            pl_module.log(f"val/evidence_mass_{method.replace('-', '_')}", mass.item())
        pl_module.log("val/evidence_share", evidence.float().mean().item())
