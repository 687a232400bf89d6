"""How well a classifier does on a split: probabilities, accuracy, calibration, confusion.

The maths of `vit-eval`, for notebooks and scripts as much as for the command: every function
returns tensors or a dict of plain numbers, and prints and writes nothing (`vit.commands.eval`
prints the table and saves the files; `vit.plot` draws the figures).

    probabilities, labels = collect_probabilities(model, datamodule.split("test"))
    metrics = classification_metrics(probabilities, labels, datamodule.classes)

The calibration error is the expected calibration error (ECE) of Guo et al. 2017, "On Calibration
of Modern Neural Networks", over equal-width bins of the top-1 confidence.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torchmetrics import Metric
from torchmetrics.functional.classification import (
    multiclass_accuracy,
    multiclass_calibration_error,
    multiclass_confusion_matrix,
)
from tqdm import tqdm

from vit.datamodules import InMemory
from vit.errors import require
from vit.preparation import for_the_device

N_BINS = 15  # confidence bins of the calibration error, as in Guo et al. 2017


TTA = ("none", "flip", "flip-translate")  # test-time augmentation: airbench's levels 0, 1 and 2
TTA_NAMES = {"none": "", "flip": "flip TTA", "flip-translate": "flip and translate TTA"}


def tta_level(tta: bool | str) -> str:
    """A level of `TTA` from itself or a bool (True: "flip", False: "none")."""
    level = ("flip" if tta else "none") if isinstance(tta, bool) else tta
    require(level in TTA, f"tta={tta!r} must be one of {', '.join(TTA)}")
    return level


@torch.no_grad()
def predict_probabilities(
    model: torch.nn.Module, images: torch.Tensor, tta: bool | str = False
) -> torch.Tensor:
    """Softmax probabilities (N, classes), with test-time augmentation `tta` (`tta_level`):
    "flip" (True) the mean of those of each image and of its mirror image (flipped left to right);
    "flip-translate" (airbench's level 2) half that and half the same mean of the image moved one
    pixel up and left and of it moved one pixel down and right (reflected at the border): the
    image and its mirror weigh 1/4 each, the four moved views 1/8. airbench averages the logits;
    here the probabilities are averaged, as for flips."""
    level = tta_level(tta)

    def with_mirror(x: torch.Tensor) -> torch.Tensor:
        probabilities = model(for_the_device(x, model)).float().softmax(dim=-1)
        if level == "none":
            return probabilities
        return (probabilities + model(for_the_device(x.flip(-1), model)).float().softmax(dim=-1)) / 2

    probabilities = with_mirror(images)
    if level == "flip-translate":
        height, width = images.shape[-2:]
        padded = F.pad(images, (1, 1, 1, 1), mode="reflect")
        down_right, up_left = padded[..., :height, :width], padded[..., 2:, 2:]
        probabilities = (probabilities + (with_mirror(down_right) + with_mirror(up_left)) / 2) / 2
    return probabilities


@torch.no_grad()
def collect_probabilities(
    model: torch.nn.Module,
    dataset: InMemory,
    batch_size: int = 128,
    tta: bool | str = False,
    device: str = "cpu",
    progress: bool = False,
    desc: str = "test split",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities (N, classes) and labels (N,) of every image of `dataset` (a split, whose
    images are ready for the model), in batches of `batch_size`; with `progress`, a progress bar
    named `desc` on stderr (vit-eval shows one: a large split takes minutes on a CPU)."""
    if len(dataset) == 0:
        raise ValueError(f"the {desc} holds no images")
    model = model.to(device).eval()
    probabilities, labels = None, torch.empty(len(dataset), dtype=torch.long)
    starts = range(0, len(dataset), batch_size)
    for start in tqdm(starts, desc=desc, unit="batch", disable=not progress, file=sys.stderr):
        images, targets = dataset[start : start + batch_size]
        batch = predict_probabilities(model, images.to(device), tta).cpu()
        if probabilities is None:
            # one tensor written batch by batch: a small tensor kept per batch would sit among the
            # batches' freed memory and keep the allocator from giving it back, and a streamed
            # split's evaluation would grow with the split
            probabilities = torch.empty(len(dataset), batch.shape[1])
        probabilities[start : start + len(batch)] = batch
        labels[start : start + len(batch)] = targets
    return probabilities, labels


def reliability_bins(
    probabilities: torch.Tensor, labels: torch.Tensor, n_bins: int = N_BINS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per equal-width bin of the top-1 confidence: the number of images, their mean confidence
    and their accuracy (0 in empty bins). Bin i holds confidences in [i/n, (i+1)/n), the last
    one 1 as well (torchmetrics gives exactly 1 a bin of its own, which changes the calibration
    error only when that bin and the one below it err in opposite directions)."""
    confidence, predicted = probabilities.double().max(dim=-1)
    correct = (predicted == labels).double()
    index = (confidence * n_bins).long().clamp(0, n_bins - 1)
    count = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, index, torch.ones_like(correct))
    total_confidence = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, index, confidence)
    total_correct = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, index, correct)
    return count, total_confidence / count.clamp_min(1), total_correct / count.clamp_min(1)


def expected_calibration_error(
    count: torch.Tensor, confidence: torch.Tensor, accuracy: torch.Tensor
) -> float:
    """ECE = sum over bins of (share of the images) * |accuracy - mean confidence|."""
    return float((count * (accuracy - confidence).abs()).sum() / count.sum())


def classification_metrics(probabilities: torch.Tensor, labels: torch.Tensor, classes: list[str]) -> dict:
    """Top-1 (and top-5 beyond 5 classes) accuracy, expected calibration error, negative
    log-likelihood, per-class accuracy, confusion matrix and reliability bins, as plain numbers."""
    n = len(classes)
    confusion = multiclass_confusion_matrix(probabilities, labels, n)  # (true, predicted)
    per_class = multiclass_accuracy(probabilities, labels, n, average=None)
    images = confusion.sum(dim=1)
    count, confidence, accuracy = reliability_bins(probabilities, labels)
    metrics = {
        "num_images": len(labels),
        "num_classes": n,
        "top1": float(multiclass_accuracy(probabilities, labels, n, average="micro")),
    }
    if n > 5:
        metrics["top5"] = float(multiclass_accuracy(probabilities, labels, n, top_k=5, average="micro"))
    metrics |= {
        "ece": float(multiclass_calibration_error(probabilities, labels, n, n_bins=N_BINS, norm="l1")),
        "ece_bins": N_BINS,
        # without the label smoothing of training, so lower than vit-train's test/loss
        "nll": float(F.nll_loss(probabilities.clamp_min(1e-12).log(), labels)),
        "per_class": {
            name: {"accuracy": float(a) if k > 0 else None, "images": int(k)}
            for name, a, k in zip(classes, per_class, images, strict=True)
        },
        "confusion_matrix": confusion.tolist(),
        "reliability": {
            "count": count.long().tolist(),
            "confidence": confidence.tolist(),
            "accuracy": accuracy.tolist(),
        },
    }
    return metrics


def restrict_to(metrics: dict, present: list[int], classes: list[str]) -> dict:
    """Metrics of data that holds some of the model's classes: per-class rows of those only, and a
    confusion matrix of their rows whose last column, "other", counts the predictions of any
    class outside them (wrong, like every prediction of another class)."""
    confusion = torch.tensor(metrics["confusion_matrix"])[present]
    kept = confusion[:, present]
    metrics["confusion_matrix"] = torch.cat([kept, (confusion.sum(1) - kept.sum(1))[:, None]], 1).tolist()
    metrics["confusion_columns"] = [classes[i] for i in present] + ["other"]
    metrics["per_class"] = {classes[i]: metrics["per_class"][classes[i]] for i in present}
    return metrics


def metrics_table(metrics: dict) -> str:
    """The figures of `vit-eval` (`classification_metrics`, with where the model and the data came
    from) as a table to read in a terminal."""
    overrides = ", ".join(f"{k}={v}" for k, v in metrics["data_overrides"].items())
    data = f"{metrics['data_module']}, {metrics['split']} split"
    source = ("checkpoint", metrics["checkpoint"]) if "checkpoint" in metrics else ("model", metrics["model"])
    tta = f", {TTA_NAMES[metrics['tta_level']]}" if metrics["tta"] else ""
    rows = [
        source,
        ("data", data + (f" ({overrides})" if overrides else "") + tta),
        ("images", metrics["num_images"]),
        ("top-1 accuracy", f"{metrics['top1']:.4f}"),
    ]
    if "top5" in metrics:
        rows.append(("top-5 accuracy", f"{metrics['top5']:.4f}"))
    rows += [(f"ECE ({metrics['ece_bins']} bins)", f"{metrics['ece']:.4f}"), ("NLL", f"{metrics['nll']:.4f}")]
    lines = [f"{label:<16}{value}" for label, value in rows]
    width = max(5, *(len(name) for name in metrics["per_class"]))
    lines += ["", f"{'class':<{width}}  accuracy  images"]
    for name, row in metrics["per_class"].items():
        accuracy = "-" if row["accuracy"] is None else f"{row['accuracy']:.4f}"
        lines.append(f"{name:<{width}}  {accuracy:>8}  {row['images']:>6}")
    return "\n".join(lines)


class MeanLoss(Metric):
    """The mean loss of the images of every process: the sums of losses and of images, which
    torchmetrics adds up across processes. Lightning's `sync_dist` averages the processes' image
    counts as integers, which rounds down where their shares differ (an odd split in two). Unlike
    torchmetrics' MeanMetric before 1.7, it keeps a nan (which `FiniteLoss` looks for) and does not
    look for one at each batch, which would make the host wait for a GPU."""

    def __init__(self):
        super().__init__()
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0), dist_reduce_fx="sum")

    def update(self, loss: torch.Tensor, count: int) -> None:
        self.total += loss.detach() * count
        self.count += count

    def compute(self) -> torch.Tensor:
        return self.total / self.count
