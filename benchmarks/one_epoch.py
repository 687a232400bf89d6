"""One CIFAR-10 epoch, the same for every model: how fast does each start to learn?

    python benchmarks/one_epoch.py --model ours --init timm     # our ViT, timm's N(0, 0.02) start
    python benchmarks/one_epoch.py --model ours --init torch    # PyTorch's default init
    python benchmarks/one_epoch.py --model vit-pytorch          # pip install -e ".[bench]"

Same for all: the `cifar` size (width 192, depth 6, 3 heads, 4x4 patches) with a layer-normed
patch embedding, the CIFAR10 data module (crops and flips on whole batches), AdamW (lr 1e-3,
weight decay 0.05 on every parameter), 18 warm-up steps then cosine to zero over one epoch,
label smoothing 0.1, bf16 autocast. Prints the validation accuracy after the epoch (about two
minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vit.images import CIFAR10
from vit.model import build_vit

SHARED_COPY = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10-jpeg"


def build(name: str, init: str) -> torch.nn.Module:
    if name == "vit-pytorch":
        from vit_pytorch import ViT

        return ViT(
            image_size=32, patch_size=4, num_classes=10, dim=192, depth=6, heads=3, mlp_dim=768, dim_head=64
        )
    return build_vit(
        "cifar", num_classes=10, image_size=32, patch_size=4, patch_norm=True, pool="mean", init=init
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["ours", "vit-pytorch"], default="ours")
    parser.add_argument("--init", choices=["timm", "torch"], default="torch", help="ours only")
    parser.add_argument("--root", default=str(SHARED_COPY), help="CIFAR-10 (torchvision or image folders)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    data = CIFAR10(root=args.root, seed=args.seed)
    data.setup("fit")
    model = build(args.model, args.init)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    steps = len(data.train_dataloader())
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 18) * 0.5 * (1 + math.cos(math.pi * s / steps))
    )
    started = time.perf_counter()
    model.train()
    for images, labels in data.train_dataloader():
        images, labels = data.augment(images, labels)
        with torch.autocast("cpu", torch.bfloat16):
            loss = F.cross_entropy(model(images), labels, label_smoothing=0.1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    correct = seen = 0
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        for images, labels in data.val_dataloader():
            correct += (model(images).argmax(-1) == labels).sum().item()
            seen += len(labels)
    name = args.model if args.model == "vit-pytorch" else f"ours, init {args.init}"
    print(f"{name}: val/acc {correct / seen:.4f} after one epoch ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
