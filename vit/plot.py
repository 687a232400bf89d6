"""Attention overlays drawn with matplotlib (no pyplot state: figures are made and saved)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure


def to_display(image: torch.Tensor) -> torch.Tensor:
    """(C, H, W) tensor -> (H, W) or (H, W, 3) in [0, 1] for imshow."""
    image = image.detach().float().cpu()
    lo, hi = image.min(), image.max()
    image = (image - lo) / (hi - lo).clamp_min(1e-8)
    return image[0] if image.shape[0] == 1 else image.permute(1, 2, 0)


def overlay(
    ax, image: torch.Tensor, patch_map: torch.Tensor, alpha: float = 0.6, cmap: str = "inferno"
) -> None:
    """Draw `image` (C, H, W) with `patch_map` (grid_h, grid_w) upsampled over it."""
    height, width = image.shape[-2:]
    upsampled = F.interpolate(patch_map[None, None].float().cpu(), size=(height, width), mode="nearest")[0, 0]
    ax.imshow(to_display(image), cmap="gray", vmin=0, vmax=1)
    ax.imshow(upsampled, cmap=cmap, alpha=alpha)
    ax.set_xticks([])
    ax.set_yticks([])


def save_overlay_grid(
    images: torch.Tensor,
    maps: torch.Tensor,
    path: str | Path,
    row_titles: list[str] | None = None,
    col_titles: list[str] | None = None,
    alpha: float = 0.6,
) -> Path:
    """One row per image: the image, then one overlay per map. `maps` is (images, maps, gh, gw)."""
    n, k = maps.shape[:2]
    fig = Figure(figsize=(1.6 * (k + 1), 1.6 * n), layout="constrained")
    axes = fig.subplots(n, k + 1, squeeze=False)
    for i in range(n):
        axes[i, 0].imshow(to_display(images[i]), cmap="gray", vmin=0, vmax=1)
        axes[i, 0].set_xticks([])
        axes[i, 0].set_yticks([])
        if row_titles:
            axes[i, 0].set_ylabel(row_titles[i], fontsize=8)
        for j in range(k):
            overlay(axes[i, j + 1], images[i], maps[i, j], alpha=alpha)
    for j, title in enumerate(["image", *(col_titles or [])]):
        axes[0, j].set_title(title, fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
