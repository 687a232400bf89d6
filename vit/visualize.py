"""`vit-attention`: draw where a trained ViT's class token looks, over test images.

vit-attention --ckpt runs/two_circles/version_0/checkpoints/best.ckpt --out attention
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from jsonargparse import auto_cli

from vit.attention import attention_weights, cls_attention_maps
from vit.checkpoint import load_checkpoint
from vit.plot import save_overlay_grid


def first_test_images(datamodule, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    datamodule.setup("test")
    images, labels = [], []
    for x, y in datamodule.test_dataloader():
        images.append(x)
        labels.append(y)
        if sum(len(b) for b in images) >= n:
            break
    return torch.cat(images)[:n], torch.cat(labels)[:n]


def attention(
    *, ckpt: Path, out: Path = Path("attention"), num_images: int = 8, layer: int = -1
) -> list[Path]:
    """Draw a trained ViT's class-token attention over test images.

    For one layer: the mean over heads, then each head, over the first test images of the
    checkpoint's data set; one PNG is written into `out`.

    Args:
        ckpt: checkpoint written by vit-train (loaded without unpickling code).
        out: folder for the PNG files.
        num_images: how many test images to draw, one per row.
        layer: which block, counted from 0; negative counts from the last.
    """
    model, datamodule = load_checkpoint(ckpt)
    if datamodule is None:
        raise ValueError(f"{ckpt} names no data module to take test images from")
    depth = len(model.model.blocks)
    if not -depth <= layer < depth:
        raise ValueError(f"layer={layer} is out of range for a model with {depth} blocks")
    if num_images < 1:
        raise ValueError(f"num_images={num_images} must be at least 1")
    layer = layer % depth
    images, labels = first_test_images(datamodule, num_images)
    weights = attention_weights(model.model, images)[layer]  # (B, heads, T, T)
    with torch.no_grad():
        predicted = model(images).argmax(-1)
    maps = cls_attention_maps(model.model, weights)  # (B, heads, gh, gw)
    maps = torch.cat((maps.mean(1, keepdim=True), maps), dim=1)
    names = getattr(datamodule, "classes", None) or [str(i) for i in range(model.hparams.num_classes)]
    rows = [
        f"true {names[t]}\npred {names[p]}" for t, p in zip(labels.tolist(), predicted.tolist(), strict=True)
    ]
    cols = ["mean of heads", *(f"head {h}" for h in range(weights.shape[1]))]
    path = save_overlay_grid(images, maps, Path(out) / f"cls_attention_layer{layer}.png", rows, cols)
    print(f"wrote {path}: class-token attention of layer {layer} for {len(images)} test images")
    return [path]


def main(args: list[str] | None = None) -> None:
    try:
        auto_cli(attention, args=args)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
