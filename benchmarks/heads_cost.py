"""The cost of `vit-attention heads` (`vit.interpret.head_analysis.analyse`): its time on a
checkpoint's test images, and the forward passes it makes per image against those its protocol
needs.

    python benchmarks/heads_cost.py --ckpt runs/demo/train/checkpoints/best.ckpt   # after make demo
    python benchmarks/heads_cost.py --ckpt best.ckpt --timm vit_small_patch16_224 --timm-images 2

The protocol needs, per image, one intact pass and one pass per head and kind of ablation (mean,
zero): 1 + 2 x heads. `analyse` runs each layer's heads, both kinds, in one batch beside an intact
copy of the images (so that every change is measured against a pass of the same batch), 1 +
layers x (2 x heads per layer + 1) in all. Targets on 2 cores: the demo model on 1,000 test images in at most
about 30 s; passes within about 1.2x of the protocol's for a ViT-S/16 (12 layers, 6 heads). The
timm model is built with random weights (nothing downloaded) and run on random images.
"""

from __future__ import annotations

import argparse
import time

import torch

from vit.interpret.head_analysis import ABLATIONS, analyse


def passes_per_image(model, images: torch.Tensor, batch_size: int) -> float:
    """Images through the model during `analyse`, per image analysed."""
    seen = []
    handle = model.register_forward_pre_hook(lambda module, args: seen.append(len(args[0])))
    try:
        analyse(model, images, batch_size=batch_size)
    finally:
        handle.remove()
    return sum(seen) / len(images)


def needed(model) -> int:
    return 1 + len(ABLATIONS) * len(model.blocks) * model.config.heads


def report(name: str, model, images: torch.Tensor, batch_size: int) -> None:
    start = time.perf_counter()
    made = passes_per_image(model, images, batch_size)
    seconds = time.perf_counter() - start
    print(
        f"{name}: {len(model.blocks)} layers x {model.config.heads} heads, {len(images)} images in "
        f"{seconds:.1f} s; forward passes per image {made:.0f}, the protocol's {needed(model)} "
        f"({made / needed(model):.2f}x)"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt", help="a vit-train checkpoint: its test images")
    parser.add_argument("--num-images", type=int, default=1000, help="its test images")
    parser.add_argument("--timm", default=None, help="a timm ViT name, built with random weights")
    parser.add_argument("--timm-images", type=int, default=2, help="random images for the timm model")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if args.ckpt:
        from vit.checkpoint import load_checkpoint
        from vit.datamodules import spread_test_images

        classifier, data = load_checkpoint(args.ckpt)
        data.setup("test")
        images, _, _ = spread_test_images(data, args.num_images)
        report(f"checkpoint {args.ckpt}", classifier.model, images, args.batch_size)
    if args.timm:
        import timm

        from vit.pretrained import _from_timm

        model = _from_timm(timm.create_model(args.timm, pretrained=False), args.timm).eval()
        size = model.image_size
        images = torch.rand(
            args.timm_images, model.in_channels, *size, generator=torch.Generator().manual_seed(0)
        )
        report(f"timm {args.timm} (random weights)", model, images, args.batch_size)


if __name__ == "__main__":
    main()
