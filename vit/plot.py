"""Evaluation plots (confusion matrix, reliability diagram) and the pieces every figure shares,
drawn with matplotlib: images for display, and saving figures with nothing half-written.

No pyplot state: every function makes a `matplotlib.figure.Figure` (which a notebook shows) and
`save_figure` writes it as PNG. The looking-inside figures are `vit.interpret.figures`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure


def to_display(image: torch.Tensor) -> torch.Tensor:
    """(C, H, W) tensor -> (H, W) or (H, W, 3) in [0, 1] for imshow."""
    image = image.detach().float().cpu()
    lo, hi = image.min(), image.max()
    image = (image - lo) / (hi - lo).clamp_min(1e-8)
    return image[0] if image.shape[0] == 1 else image.permute(1, 2, 0)


def save_figure(fig: Figure, path: str | Path, dpi: int = 100) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, pil_kwargs={"compress_level": 1})  # PNG is lossless at any level
    return path


def save_all(out: Path, files: dict[str, str | Figure]) -> list[Path]:
    """Write texts and figures into `out`; if one fails, remove those already written."""
    existed, written = out.exists(), []
    try:
        for name, content in files.items():
            path = out / name
            if isinstance(content, str):
                out.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
            else:
                save_figure(content, path)
            written.append(path)
    except BaseException:
        for path in written:  # leave nothing half-written
            path.unlink(missing_ok=True)
        if not existed and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise
    return written


def confusion_figure(
    counts: torch.Tensor,
    classes: list[str],
    title: str = "confusion matrix",
    columns: list[str] | None = None,
) -> Figure:
    """The confusion matrix `counts` (true class rows, predicted class columns: `classes`, or
    `columns` when they differ, such as the classes plus "other"), each row divided by its number
    of images so that the diagonal reads as per-class accuracy. With at most 20 classes every
    cell shows its percentage and count; rows without images stay blank."""
    counts = counts.detach().cpu().double()
    columns = classes if columns is None else columns
    n = len(columns)
    rows = counts.sum(dim=1, keepdim=True)
    shares = (counts / rows).numpy()  # nan in a row without images
    side = min(max(3.5, 0.55 * n + 2.0), 16.0)
    fig = Figure(figsize=(side + 1.0, side), layout="constrained")
    ax = fig.subplots()
    shown = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    fontsize = 8 if n <= 10 else 6
    ax.set_xticks(range(n), columns, rotation=45 if n > 4 else 0, ha="right" if n > 4 else "center")
    ax.set_yticks(range(len(classes)), classes)
    ax.tick_params(labelsize=fontsize)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title, fontsize=9)
    if n <= 20:
        for i in np.nonzero(rows[:, 0].numpy())[0]:  # rows with images
            for j in range(n):
                colour = "white" if shares[i, j] > 0.5 else "black"
                text = f"{100 * shares[i, j]:.0f}%\n{int(counts[i, j])}"
                ax.text(j, i, text, ha="center", va="center", color=colour, fontsize=fontsize - 1)
    fig.colorbar(shown, ax=ax, shrink=0.8, label="share of the true class's images")
    return fig


def reliability_figure(
    count: torch.Tensor, confidence: torch.Tensor, accuracy: torch.Tensor, ece: float, title: str = ""
) -> Figure:
    """A reliability diagram (Guo et al. 2017) over equal-width confidence bins: the accuracy in
    each bin against the diagonal of perfect calibration, the gap to the bin's mean confidence
    hatched in red; below it, the share of images in each bin. `count`, `confidence` (mean) and
    `accuracy` are per bin; empty bins are left out."""
    n_bins = len(count)
    edges = np.linspace(0, 1, n_bins + 1)
    left, width = edges[:-1], 1 / n_bins
    full = (count > 0).numpy()
    acc, conf = accuracy.numpy()[full], confidence.numpy()[full]
    fig = Figure(figsize=(4.2, 5.2), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    top.bar(left[full], acc, width=width, align="edge", color="tab:blue", edgecolor="black", label="accuracy")
    gap = dict(fill=False, edgecolor="tab:red", hatch="///", linewidth=0.8)  # readable over the blue
    top.bar(left[full], conf - acc, bottom=acc, width=width, align="edge", label="gap to confidence", **gap)
    top.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.set_ylabel("accuracy")
    top.legend(fontsize=7, loc="upper left")
    top.set_title(f"{title}ECE = {ece:.4f} ({n_bins} bins)", fontsize=9)
    share = (count / count.sum().clamp_min(1)).numpy()
    bottom.bar(left, share, width=width, align="edge", color="grey", edgecolor="black")
    bottom.set_xlabel("confidence (highest probability)")
    bottom.set_ylabel("share of images")
    return fig
