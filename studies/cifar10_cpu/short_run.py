"""Short CIFAR-10 runs, the same loop for every model: which starts to learn faster, and which
size of model gets furthest in a few minutes?

    python -m studies.cifar10_cpu.short_run --model ours --init timm     # one epoch, timm's N(0, 0.02) start
    python -m studies.cifar10_cpu.short_run --model ours --init torch    # PyTorch's default init
    python -m studies.cifar10_cpu.short_run --model vit-pytorch          # pip install -e ".[bench]"
    python -m studies.cifar10_cpu.short_run --epochs 8 --dim 128 --depth 4 --heads 2 --mlp_ratio 2

Same for all: 4x4 patches, the `cifar` size by default (width 192, depth 6, 3 heads), a
layer-normed patch embedding (ours pools the mean of the patch tokens, vit-pytorch's ViT reads
its class token), the CIFAR10 data module (crops and flips on whole batches), AdamW (lr 1e-3,
weight decay 0.05 on every parameter), 5% of the steps warming up, then cosine to zero at the
end of the last epoch, label smoothing 0.1, bf16 autocast. Prints the validation accuracy after
each epoch and the minutes since training began (about two minutes per epoch of the `cifar` size
on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lab.peers import CONFIG, build_vit_pytorch
from vit.datamodules import CIFAR10
from vit.model import ViT, num_params

SHARED_COPY = Path(__file__).resolve().parents[3] / "shared" / "data" / "cifar10-jpeg"


def build(args: argparse.Namespace) -> torch.nn.Module:
    if args.model == "vit-pytorch":
        return build_vit_pytorch(CONFIG)  # the `cifar` size, as in the throughput benchmark
    return ViT(
        preset="cifar", num_classes=10, image_size=32, patch_size=4, patch_norm=True, pool="mean",
        init=args.init, dim=args.dim, depth=args.depth, heads=args.heads, mlp_ratio=args.mlp_ratio,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["ours", "vit-pytorch"], default="ours")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--init", choices=["timm", "torch"], default="torch", help="ours only")
    parser.add_argument("--dim", type=int, help="ours only, as are the next three")
    parser.add_argument("--depth", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--mlp_ratio", type=float)
    parser.add_argument("--root", default=str(SHARED_COPY), help="CIFAR-10 (torchvision or image folders)")
    parser.add_argument("--val_size", type=int, default=5000, help="training images held out")
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--limit", type=int, help="train on this many batches per epoch (smoke tests)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.epochs < 1 or (args.limit is not None and args.limit < 1):
        parser.error("--epochs and --limit must be at least 1")
    sized = any(v is not None for v in (args.dim, args.depth, args.heads, args.mlp_ratio))
    if args.model == "vit-pytorch" and (sized or args.init != "torch"):
        parser.error("--init and the size options apply to --model ours only")
    torch.manual_seed(args.seed)
    data = CIFAR10(root=args.root, val_size=args.val_size, batch_size=args.batch_size, seed=args.seed)
    data.setup("fit")
    model = build(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    batches = len(data.train_dataloader())
    per_epoch = min(batches, args.limit or batches)
    steps = per_epoch * args.epochs
    warmup = max(int(0.05 * steps), 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / steps))
    )
    name = args.model if args.model == "vit-pytorch" else f"ours ({num_params(model):,} parameters)"
    started = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        for step, (images, labels) in enumerate(data.train_dataloader()):
            if step == per_epoch:
                break
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
        minutes = (time.perf_counter() - started) / 60
        accuracy = correct / seen
        print(f"{name}: epoch {epoch}/{args.epochs} val/acc {accuracy:.4f} at {minutes:.1f} min", flush=True)


if __name__ == "__main__":
    main()
