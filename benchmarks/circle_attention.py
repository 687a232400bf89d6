"""Where the circles' own tokens look, per layer and head, in a two-circles model: the share of a
circle patch's attention on itself, on the other circle patches, on the background patches and on
the prefix tokens (class token, registers), beside the background's share of the other patches
(what attention spread evenly over them would put there).

    python benchmarks/circle_attention.py --ckpt runs/demo/train/checkpoints/best.ckpt

`vit-attention heads` gives each head's "evidence -> evidence" mass (self left out); this splits the
rest, to tell a head that looks away from the circles from one that looks everywhere alike.
Means over test images, each image's circle patches averaged first.
"""

from __future__ import annotations

import argparse

import torch

from vit.attention_maps import attention_weights
from vit.checkpoint import load_checkpoint
from vit.commands.inputs import spread_test_images
from vit.faithfulness import patch_evidence


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt", required=True, help="a vit-train checkpoint of two circles")
    parser.add_argument("--num-images", type=int, default=1000, help="test images, spread over the split")
    args = parser.parse_args(argv)
    classifier, data = load_checkpoint(args.ckpt)
    model = classifier.model.eval()
    images, _, indices = spread_test_images(data, args.num_images)
    circles = patch_evidence(model, data.evidence("test")[indices])  # (B, P)
    prefix, patches = model.num_prefix_tokens, circles.shape[1]
    weights = attention_weights(model, images, batch_size=100)[..., prefix:, :]  # (L, B, H, P queries, T)
    queries = circles.float()[None, :, None, :, None]

    B = len(images)
    on_self = ((weights[..., :, prefix:] * torch.eye(patches)) * queries).sum((-1, -2))
    on_self = (on_self / queries.sum((-1, -2)).clamp_min(1)).mean(1)
    padded = lambda m: torch.cat([torch.zeros(B, prefix), m.float()], 1)[None, :, None, None, :]  # noqa: E731
    on_circles = (
        (weights * padded(circles) * queries).sum((-1, -2)) / queries.sum((-1, -2)).clamp_min(1)
    ).mean(1)
    on_background = (
        (weights * padded(~circles) * queries).sum((-1, -2)) / queries.sum((-1, -2)).clamp_min(1)
    ).mean(1)
    even = ((patches - circles.sum(1)) / (patches - 1)).float().mean().item()
    print(f"{B} test images; circle patches per image {circles.sum(1).float().mean():.1f} of {patches}; "
          f"attention spread evenly over the other patches puts {even:.3f} on the background")  # fmt: skip
    print("layer head   itself   other circle patches   background   prefix tokens")
    for layer in range(weights.shape[0]):
        for head in range(weights.shape[2]):
            own, other = on_self[layer, head], on_circles[layer, head] - on_self[layer, head]
            rest = 1 - on_circles[layer, head] - on_background[layer, head]
            print(f"{layer:<5d} {head:<6d} {own:.3f}    {other:.3f}                  "
                  f"{on_background[layer, head]:.3f}        {rest:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
