"""Which tokens carry the class of a two-circles model? `vit-attention patch`'s token restoration,
summed over the circles' patches (in the clean image or its counterfactual) and over the rest.

    python studies/heads/patch_by_evidence.py --ckpt runs/relpos/version_0/checkpoints/best.ckpt

`vit-attention patch` averages each token position over the pairs, where the circles sit anywhere;
this splits each pair's tokens by where its circles are. Prints each share (the sum over the
tokens of a kind, and per token) as a ratio of means over pairs with its 95% bootstrap interval,
and the mean of ratios beside it, after each block (the class token's too, where there is one).
"""

from __future__ import annotations

import argparse

from vit.checkpoint import load_checkpoint
from vit.datamodules import spread_test_images
from vit.interpret.activation_patching import (
    MIN_GAP,
    analyse,
    ratio_figures,
    restored,
    restored_ratio_of_means,
)
from vit.interpret.evidence import patch_evidence
from vit.interpret.stats import as_text, interval


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt", required=True, help="a vit-train checkpoint of two circles")
    parser.add_argument(
        "--num-images", type=int, default=64, help="test images, each with its counterfactual"
    )
    parser.add_argument("--min-gap", type=float, default=MIN_GAP, help="as vit-attention patch's --min_gap")
    args = parser.parse_args(argv)
    classifier, data = load_checkpoint(args.ckpt)
    model, prefix = classifier.model, classifier.model.num_prefix_tokens
    images, labels, indices = spread_test_images(data, args.num_images)
    moved, moved_labels = data.counterfactuals("test")
    circles = patch_evidence(model, data.evidence("test")[indices])
    circles |= patch_evidence(model, data.counterfactual_evidence("test")[indices])
    found = analyse(
        model, images, moved[indices], classes=(labels, moved_labels[indices]), min_gap=args.min_gap
    )
    per_pair = circles.sum(1).float().mean()
    print(f"{len(images)} pairs; circle patches per pair {per_pair:.1f} of {circles.shape[1]}")
    background = ~circles
    clean, corrupted = found["per_pair"]["clean"], found["per_pair"]["corrupted"]
    print("share of the logit difference restored: ratio of means over pairs [95% interval]; mean of ratios")
    for layer, tokens in enumerate(found["per_pair"]["patched/tokens"]):  # (tokens, pairs) after each block
        gained = (tokens - corrupted).T  # (pairs, tokens): what patching each token brings back
        patches = gained[:, prefix:]
        rows = {
            "circle patches, all": (patches * circles).sum(1),
            "background patches, all": (patches * background).sum(1),
            "a circle patch, mean": (patches * circles).sum(1) / circles.sum(1),
            "a background patch, mean": (patches * background).sum(1) / background.sum(1),
            "the largest background patch": patches.masked_fill(circles, float("-inf")).max(1).values,
        }
        if prefix:
            rows["the class token"] = gained[:, 0]
        print(f"after block {layer}")
        for name, values in rows.items():
            patched = corrupted + values
            figure = ratio_figures(*restored_ratio_of_means(patched, clean, corrupted))
            each = restored(patched, clean, corrupted, args.min_gap)
            print(f"  {name:30s} {as_text(figure)}   {as_text(interval(each))}")


if __name__ == "__main__":
    main()
