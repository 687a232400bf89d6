"""Does a head need its attention pattern, or only its values? Each head's attention weights
replaced by even ones (every query spreads 1/tokens over every token; its values and the output
projection untouched), one head at a time, on two-circles test images: the change in top-1
accuracy against the intact model, per layer and head, with a 95% bootstrap interval over images.

    python studies/heads/even_attention.py --ckpt runs/demo/train/checkpoints/best.ckpt

Beside `vit-attention heads`' mean ablation (the head's whole output replaced by its mean): a head
that costs much there and little here carries what matters in its values, not in where it looks.
"""

from __future__ import annotations

import argparse

import torch

from vit.checkpoint import load_checkpoint
from vit.datamodules import spread_test_images
from vit.interpret.hooks import explicit_attention, hooks
from vit.interpret.stats import as_text, interval


def predictions(
    model, images: torch.Tensor, layer: int | None = None, head: int | None = None
) -> torch.Tensor:
    """The predicted classes, with head `head` of block `layer` attending evenly (None: intact)."""
    if layer is None:
        with torch.no_grad():
            return torch.cat([model(x).argmax(-1) for x in images.split(250)])
    attn = model.blocks[layer].attn

    def even(module, args, weights):
        weights = weights.clone()
        weights[:, head] = 1.0 / weights.shape[-1]
        return weights

    with explicit_attention(model, [layer]), hooks((attn.attend.register_forward_hook, even)):
        return predictions(model, images)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt", required=True, help="a vit-train checkpoint of two circles")
    parser.add_argument("--num-images", type=int, default=1000, help="test images, spread over the split")
    args = parser.parse_args(argv)
    classifier, data = load_checkpoint(args.ckpt)
    model = classifier.model.eval()
    images, labels, _ = spread_test_images(data, args.num_images)
    intact = (predictions(model, images) == labels).float()
    print(f"{len(images)} test images; intact top-1 {intact.mean():.4f}")
    print("layer head   even attention: change in accuracy")
    for layer, block in enumerate(model.blocks):
        for head in range(block.attn.heads):
            correct = (predictions(model, images, layer, head) == labels).float()
            print(f"{layer:<5d} {head:<6d} {as_text(interval(correct - intact))}")


if __name__ == "__main__":
    main()
