"""Where the circles' own tokens look, per layer and head, in a two-circles model: the share of a
circle patch's attention on itself, on the other circle patches, on the background patches and on
the prefix tokens (class token, registers), beside the background's share of the other patches
(what attention spread evenly over them would put there).

    python studies/heads/circle_attention.py --ckpt runs/demo/train/checkpoints/best.ckpt
    python studies/heads/circle_attention.py --ckpt runs/demo/train/checkpoints/best.ckpt --head 0 0

With `--head LAYER HEAD`, also that head's mean attention by offset from the query patch (rows:
down, columns: right, both from -(grid - 1) to grid - 1), for circle and background queries, and
the entropy of its rows (a head that looks at one fixed offset has entropy near 0, one that
spreads evenly log(tokens)): a positional head shows the same peak for both kinds of query.

`vit-attention heads` gives each head's "evidence -> evidence" mass (self left out); this splits the
rest, to tell a head that looks away from the circles from one that looks everywhere alike.
Means over test images, each image's circle patches averaged first.
"""

from __future__ import annotations

import argparse

import torch

from vit.checkpoint import load_checkpoint
from vit.datamodules import spread_test_images
from vit.interpret.evidence import patch_evidence
from vit.interpret.maps import attention_weights


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt", required=True, help="a vit-train checkpoint of two circles")
    parser.add_argument("--num-images", type=int, default=1000, help="test images, spread over the split")
    parser.add_argument(
        "--head", type=int, nargs=2, metavar=("LAYER", "HEAD"), help="show one head by offset"
    )
    args = parser.parse_args(argv)
    classifier, data = load_checkpoint(args.ckpt)
    model = classifier.model.eval()
    images, _, indices = spread_test_images(data, args.num_images)
    circles = patch_evidence(model, data.evidence("test")[indices])  # (B, P)
    prefix, patches = model.num_prefix_tokens, circles.shape[1]
    weights = attention_weights(model, images, batch_size=100)[..., prefix:, :]  # (L, B, H, P queries, T)

    def over_circles(per_query: torch.Tensor) -> torch.Tensor:
        """(L, B, H, P queries) -> (L, H): the mean over each image's circle queries, then images."""
        summed = (per_query * circles[None, :, None].float()).sum(-1)
        return (summed / circles.sum(1).clamp_min(1)[None, :, None]).mean(1)

    def on_keys(keys: torch.Tensor) -> torch.Tensor:
        """Each query's attention on the patches `keys` (B, P), no prefix token: (L, B, H, P)."""
        padded = torch.nn.functional.pad(keys.float(), (prefix, 0))  # (B, T)
        return (weights * padded[None, :, None, None, :]).sum(-1)

    on_self = over_circles(weights[..., prefix:].diagonal(dim1=-2, dim2=-1))
    on_circles, on_background = over_circles(on_keys(circles)), over_circles(on_keys(~circles))
    B = len(images)
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
    if args.head is not None:
        by_offset(model, weights[args.head[0], :, args.head[1]], circles, prefix)


def by_offset(model, weights: torch.Tensor, circles: torch.Tensor, prefix: int) -> None:
    """One head's patch-to-patch attention (B, P queries, T) averaged by offset, per kind of query."""
    rows, columns = model.grid_size
    position = torch.stack(torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij"), -1)
    offset = position.view(1, -1, 2) - position.view(-1, 1, 2)  # (P queries, P keys, 2): key minus query
    index = (offset[..., 0] + rows - 1) * (2 * columns - 1) + offset[..., 1] + columns - 1
    patches = weights[..., prefix:]  # (B, P, P)
    entropy = -(weights * weights.clamp_min(1e-12).log()).sum(-1)  # (B, P)
    for name, chosen in (("circle", circles), ("background", ~circles)):
        total = torch.zeros((2 * rows - 1) * (2 * columns - 1))
        count = torch.zeros_like(total)
        picked = patches[chosen]  # (queries, P keys)
        where = index[chosen.nonzero()[:, 1]]  # (queries, P keys)
        total.index_add_(0, where.flatten(), picked.flatten())
        count.index_add_(0, where.flatten(), torch.ones(picked.numel()))
        mean = (total / count.clamp_min(1)).view(2 * rows - 1, 2 * columns - 1)
        print(f"{name} queries: mean attention by offset (rows: {1 - rows}..{rows - 1} down; "
              f"columns: {1 - columns}..{columns - 1} right); row entropy {entropy[chosen].mean():.2f} "
              f"(even: {torch.log(torch.tensor(float(weights.shape[-1]))):.2f})")  # fmt: skip
        for line in mean:
            print("  " + " ".join(f"{v:.3f}" for v in line))


if __name__ == "__main__":
    main()
