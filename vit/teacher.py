"""A CNN teacher for the ViT's distillation token: DeiT's hard-label distillation (Touvron et al.
2021, "Training data-efficient image transformers & distillation through attention").

The ViT's class head learns the labels and its distillation head the teacher's answers (its
argmax) on the same augmented images, half the loss each (`ViTClassifier(teacher=...)`). The
teacher is the network of a classifier checkpoint written by vit-train (`load_teacher`), or an
`AirbenchCNN` trained with airbench94's recipe when training starts (`train_airbench`). The recipe
itself, a step at a time (`AirbenchTraining`), also trains the CNN peer of the CPU figures
(benchmarks/cnn_peer_cpu.py), on a time budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from vit.cnn import AirbenchCNN
from vit.errors import UsageError
from vit.model import ViT
from vit.optim import sgd
from vit.preparation import for_the_device
from vit.safe_load import build_model, read_checkpoint

# airbench94's hyper-parameters (github.com/KellerJordan/cifar10-airbench, legacy/airbench94.py,
# `hyp`) in its decoupled form: lr and weight_decay per 1024 images, the step size independent of
# the momentum, the decay of the learning rate
AIRBENCH = dict(
    lr=11.5, momentum=0.85, weight_decay=0.0153, bias_scaler=64.0, label_smoothing=0.2, whiten_bias_epochs=3
)


class Teacher:
    """A frozen network in eval mode whose argmax is the distillation head's target. Not an
    nn.Module: a classifier that holds one does not register it, so it stays out of the
    classifier's state_dict (its checkpoints), optimizer, weight average and device moves (`to`
    moves it)."""

    def __init__(self, network: nn.Module):
        self.network = network.eval().requires_grad_(False)

    def to(self, device: torch.device | str) -> Teacher:
        self.network.to(device)
        return self

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return self.network(images).argmax(dim=-1)


def load_teacher(
    path: str | Path, num_classes: int, models: Mapping[str, type[L.LightningModule]]
) -> Teacher:
    """The network of a classifier checkpoint written by vit-train (a `CNNClassifier`'s, say),
    frozen; `models` are the classes it may name (`vit.classifier.MODELS`, which imports this
    module). A missing file, or a network of another class count than `num_classes`, is one line."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"teacher {path}: no such checkpoint (give a vit-train .ckpt or 'airbench')")
    classifier = build_model(read_checkpoint(path), path, models)
    classes = classifier.hparams.num_classes
    if classes != num_classes:
        raise UsageError(f"teacher {path} tells {classes} classes apart, the data has {num_classes}")
    return Teacher(classifier.model)


def distillation_loss(
    student: ViT, teacher: Teacher, x: torch.Tensor, y: torch.Tensor, label_smoothing: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeiT's hard distillation for a distilled `student` on images `x`: its logits, both heads'
    mean (as in eval), and its loss, half the class head's cross-entropy against `y` (with
    `label_smoothing`) and half the distillation head's against the teacher's argmax."""
    x = for_the_device(x, student)
    logits, distilled = student.forward_heads(student.forward_features(x))
    labels = F.cross_entropy(logits, y, label_smoothing=label_smoothing)
    answers = F.cross_entropy(distilled, teacher(x))
    return (logits + distilled) / 2, (labels + answers) / 2


def airbench_lr(progress: float) -> float:
    """airbench94's learning-rate factor at `progress` (0 to 1) of training: from 0.2 up to 1 over
    the first 23% of the steps, then down to 0.07, linearly."""
    if progress < 0.23:
        return 0.2 + 0.8 * progress / 0.23
    return 1.0 - 0.93 * (progress - 0.23) / 0.77


def airbench_optimizer(network: AirbenchCNN, batch_size: int) -> torch.optim.SGD:
    """airbench94's SGD with Nesterov momentum, its decoupled hyper-parameters in PyTorch's form
    (for a loss summed over the batch); BatchNorm's biases at 64 times the learning rate."""
    hp = AIRBENCH
    kilostep = 1024 * (1 + 1 / (1 - hp["momentum"]))  # the steps momentum adds up, per 1024 images
    lr, decay = hp["lr"] / kilostep, hp["weight_decay"] * batch_size / kilostep
    biases = [m.bias for m in network.modules() if isinstance(m, nn.BatchNorm2d)]
    others = [p for p in network.parameters() if p.requires_grad and all(p is not b for b in biases)]
    groups = [dict(params=biases, lr=lr * hp["bias_scaler"]), dict(params=others, lr=lr)]
    for group in groups:
        group["weight_decay"] = decay / group["lr"]  # the decay a step: lr * weight_decay
    return sgd(groups, hp["momentum"])


class AirbenchTraining:
    """airbench94's training of an `AirbenchCNN`, a step at a time, for any loop: its optimizer
    (`airbench_optimizer`), its learning rate at the schedule's progress (`airbench_lr`), the
    stem's bias learning for the first `whiten_bias_epochs` epochs only, and its loss (label
    smoothing 0.2, summed over the batch: airbench's learning rate is per image). The loop decides
    what progress means: steps of an epoch count (`train_airbench`) or time of a budget
    (benchmarks/cnn_peer_cpu.py); it whitens the stem before the first step (`AirbenchCNN.whiten`).
    `autocast` makes the context of the forward pass (a trainer's precision, bf16 autocast)."""

    def __init__(
        self,
        network: AirbenchCNN,
        batch_size: int,
        autocast: Callable[[], AbstractContextManager] = nullcontext,
    ):
        self.network, self.autocast = network, autocast
        self.optimizer = airbench_optimizer(network, batch_size)
        self.peak_lr = [group["lr"] for group in self.optimizer.param_groups]

    def start_epoch(self, epoch: int) -> None:
        """Training mode, and the whitened stem frozen, its bias from epoch `whiten_bias_epochs` on."""
        self.network.train()
        self.network.freeze_stem(epoch, AIRBENCH["whiten_bias_epochs"])

    def step(self, images: torch.Tensor, labels: torch.Tensor, progress: float) -> torch.Tensor:
        """One optimizer step on a batch, at `progress` (0 to 1) of the schedule; the batch's
        summed loss (detached)."""
        factor = airbench_lr(progress)
        for group, peak in zip(self.optimizer.param_groups, self.peak_lr, strict=True):
            group["lr"] = peak * factor  # the weight decay a step follows: lr * weight_decay
        with self.autocast():
            logits = self.network(images).float()
        loss = F.cross_entropy(logits, labels, label_smoothing=AIRBENCH["label_smoothing"], reduction="sum")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.detach()


def train_airbench(trainer: L.Trainer, num_classes: int, in_channels: int, epochs: int) -> Teacher:
    """An `AirbenchCNN` trained with airbench94's recipe (`AirbenchTraining`) for `epochs` epochs
    of the batches the trainer's data module gives for training (its training loader, augmented by
    its `augment` for each epoch, as a captured step would), the schedule by steps, on the
    trainer's device and in its precision; the stem is whitened on the first batch (airbench: on
    5,000 training images, not augmented) and its bias learns for 3 epochs. Then its accuracy on
    the validation split; both are printed and logged (`teacher/acc`, `time/teacher_seconds`).
    Left out: airbench's Lookahead. With several processes, each trains its own, on its share of
    each epoch."""
    start = time.perf_counter()
    datamodule, device = trainer.datamodule, trainer.strategy.root_device
    # channels-last: cuDNN's and oneDNN's faster NHWC kernels (`vit.preparation.for_the_device`)
    network = AirbenchCNN(num_classes, in_channels).to(device, memory_format=torch.channels_last)
    loader = datamodule.train_dataloader()

    def batches(epoch: int):  # an epoch of training batches, augmented as the ViT's are
        augment = getattr(datamodule, "augment", None)  # the raw batches' augmentation
        if augment is not None:
            datamodule.start_epoch(epoch)  # not the trainer's: it has not started its first yet
        for batch in loader:
            batch = [t.to(device) for t in datamodule.on_before_batch_transfer(batch, 0)]
            yield augment(*batch) if augment is not None else datamodule.on_after_batch_transfer(batch, 0)

    network.whiten(next(batches(0))[0])
    training = AirbenchTraining(network, datamodule.batch_size, trainer.precision_plugin.forward_context)
    steps, step = max(epochs * len(loader), 1), 0
    bar = tqdm(  # before the ViT's bar starts: minutes of training otherwise silent
        total=steps, desc=f"teacher: airbench, {epochs} epochs", unit="step", leave=False,
        disable=trainer.progress_bar_callback is None or not trainer.is_global_zero,
    )  # fmt: skip
    for epoch in range(epochs):
        training.start_epoch(epoch)
        for images, labels in batches(epoch):
            training.step(images, labels, step / steps)
            step += 1
            bar.update()
    bar.close()
    network.eval()
    correct, count = torch.zeros((), device=device), 0
    with torch.inference_mode(), trainer.precision_plugin.forward_context():
        for images, labels in datamodule.val_dataloader():
            correct += (network(images.to(device)).argmax(dim=-1) == labels.to(device)).sum()
            count += len(labels)
    accuracy, seconds = correct.item() / max(count, 1), time.perf_counter() - start
    print(f"teacher: airbench trained for {epochs} epochs in {seconds:.1f} s, val acc {accuracy:.4f}")
    for logger in trainer.loggers:
        logger.log_metrics({"teacher/acc": accuracy, "time/teacher_seconds": seconds}, step=0)
    return Teacher(network)
