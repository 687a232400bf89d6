"""A CNN teacher for the ViT's distillation token: DeiT's hard-label distillation (Touvron et al.
2021, "Training data-efficient image transformers & distillation through attention").

The ViT's class head learns the labels and its distillation head the teacher's answers (its
argmax) on the same augmented images, half the loss each (`ViTClassifier(teacher=...)`). The
teacher is the network of a classifier checkpoint written by vit-train (`load_teacher`), or an
`AirbenchCNN` trained with airbench94's recipe when training starts (`train_airbench`).
"""

from __future__ import annotations

import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from vit.cnn import AirbenchCNN
from vit.errors import UsageError

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


def load_teacher(path: str | Path, num_classes: int) -> Teacher:
    """The network of a classifier checkpoint written by vit-train (a `CNNClassifier`'s, say),
    frozen. A missing file, or a network of another class count than `num_classes`, is one line."""
    from vit.checkpoint import build_model, read_checkpoint  # here: vit.checkpoint imports vit.classifier

    if not Path(path).is_file():
        raise FileNotFoundError(f"teacher {path}: no such checkpoint (give a vit-train .ckpt or 'airbench')")
    classifier = build_model(read_checkpoint(path), path)
    classes = classifier.hparams.num_classes
    if classes != num_classes:
        raise UsageError(f"teacher {path} tells {classes} classes apart, the data has {num_classes}")
    return Teacher(classifier.model)


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
    return torch.optim.SGD(groups, momentum=hp["momentum"], nesterov=True)


def train_airbench(trainer: L.Trainer, num_classes: int, in_channels: int, epochs: int) -> Teacher:
    """An `AirbenchCNN` trained with airbench94's recipe (`AIRBENCH`, `airbench_optimizer`,
    `airbench_lr`) for `epochs` epochs of the batches the trainer's data module gives for training
    (its training loader, augmented by its `on_after_batch_transfer`), on the trainer's device and
    in its precision; the stem is whitened on the first batch (airbench: on 5,000 training images,
    not augmented) and its bias learns for 3 epochs. Then its accuracy on the validation split;
    both are printed and logged (`teacher/acc`, `time/teacher_seconds`). Left out: airbench's
    Lookahead. With several processes, each trains its own."""
    start = time.perf_counter()
    datamodule, device, hp = trainer.datamodule, trainer.strategy.root_device, AIRBENCH
    network = AirbenchCNN(num_classes, in_channels).to(device)
    if device.type == "cuda":  # cuDNN's faster NHWC kernels
        network = network.to(memory_format=torch.channels_last)
    loader = datamodule.train_dataloader()

    def batches():  # an epoch of training batches, as the ViT sees them
        for batch in loader:
            yield datamodule.on_after_batch_transfer([t.to(device) for t in batch], 0)

    network.whiten(next(batches())[0])
    optimizer = airbench_optimizer(network, datamodule.batch_size)
    steps = max(epochs * len(loader), 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: airbench_lr(step / steps))
    network.train()
    for epoch in range(epochs):
        network.stem.bias.requires_grad_(epoch < hp["whiten_bias_epochs"])
        for images, labels in batches():
            with trainer.precision_plugin.forward_context():
                logits = network(images).float()
            # summed over the batch: airbench's learning rate is per image
            loss = F.cross_entropy(logits, labels, label_smoothing=hp["label_smoothing"], reduction="sum")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
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
