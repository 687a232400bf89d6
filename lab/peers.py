"""The `cifar` model size and the peers: timm's and vit-pytorch's ViTs built to a size, the
libraries ours is measured against (`pip install -e ".[bench]"`). A size is a dict of image_size,
patch_size, dim, depth, heads, mlp_ratio and num_classes, as ours takes them."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

# The `cifar` model: CIFAR-sized images, a ViT-Ti-wide model of 6 blocks.
CONFIG = dict(image_size=32, patch_size=4, dim=192, depth=6, heads=3, mlp_ratio=4.0, num_classes=10)


def build_timm(cfg: dict) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        img_size=cfg["image_size"], patch_size=cfg["patch_size"], num_classes=cfg["num_classes"],
        embed_dim=cfg["dim"], depth=cfg["depth"], num_heads=cfg["heads"], mlp_ratio=cfg["mlp_ratio"],
    )  # fmt: skip


def build_vit_pytorch(cfg: dict) -> nn.Module:
    from vit_pytorch import ViT

    return ViT(
        image_size=cfg["image_size"], patch_size=cfg["patch_size"], num_classes=cfg["num_classes"],
        dim=cfg["dim"], depth=cfg["depth"], heads=cfg["heads"], dim_head=cfg["dim"] // cfg["heads"],
        mlp_dim=int(cfg["dim"] * cfg["mlp_ratio"]),
    )  # fmt: skip


PEERS: dict[str, Callable[[dict], nn.Module]] = {"timm": build_timm, "vit-pytorch": build_vit_pytorch}
MODULES = {"timm": "timm", "vit-pytorch": "vit_pytorch"}  # what each peer imports
