"""Two circles: how many layers does each model need to relate two distant circles?

    python benchmarks/two_circles_depth.py                    # the default grid, about 30 minutes
    python benchmarks/two_circles_depth.py --full             # depths 1 2 3 4 6 8, two seeds
    python benchmarks/two_circles_depth.py --depths 1 2 --steps 20 --out /tmp/quick  # a smoke run
    python benchmarks/two_circles_depth.py --replot           # redraw from results.json
    python benchmarks/two_circles_depth.py --models ViT "downsampling CNN" --depths 1 4 --steps 2400

The claim the data set was made for: self-attention relates two distant patches in one layer,
while a convolution relates only what its receptive field covers, so a CNN needs depth (or
downsampling) that grows with the distance. Every model below trains at several depths L for the
same steps on the same images (one data set per seed) and is tested per bin of the *gap*: the
larger of the x and y distances between the two circles' inked edges (square receptive fields
see that one), on a wrap-around canvas (no position leak). The gap is never below the ViT's patch
size, so no patch holds both circles.

Models at depth L:
- ViT: L transformer blocks of width 64, 4x4 patches, learned positions, mean pooling, the demo
  config's lr (3e-3): in the demo's probes this left chance sooner than a class token, periodic
  positions or a layer-normed patch embedding;
- plain CNN: L 3x3 convolutions of stride 1 (receptive field 2L + 1 pixels), two 1x1 layers,
  global average pooling, a linear head; and the same with an MLP head after pooling;
- downsampling CNN: the same with stride 2 in every other 3x3 layer (fields 3, 7, 11, 19, 27, 43,
  59, 91 pixels for L = 1..8).

A unit relates the two circles only if its field holds ink of both: field >= gap + 2 pixels.

Predictions, stated before the first run (docs/two_circles.md has what happened):
1. The ViT reaches high accuracy with L = 1 at every gap.
2. The plain CNN is at chance on a gap bin until 2L + 1 covers the bin's gaps (L >= (gap + 1) / 2),
   then succeeds; the MLP head does not change where.
3. The downsampling CNN succeeds from about log2(gap) layers on (the first L whose field covers
   the gap).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import lightning as L
import torch
from matplotlib.figure import Figure

from vit import CNNClassifier, TwoCircles, ViTClassifier
from vit.cnn import BagCNN
from vit.model import num_params
from vit.two_circles import torus_delta

# A 32x32 wrap-around canvas, circles of radius 1.5 (ink reaches 2 pixels from the centre, the
# last half pixel anti-aliased) whose centres are 12-15.5 pixels apart (below half the canvas, so
# the shortest way round keeps the orientation): gaps of 4.5 to 11.5 pixels between the inks, more
# than the ViT's 4-pixel patch. (A 64x64 canvas with wider gaps would cost the CNNs 4x the time.)
DATA = dict(image_size=32, radius=1.5, separation=(12.0, 15.5))
PATCH = 4
GAP_BINS = [4.0, 6.0, 8.0, 10.0, 12.0]


def model_specs(cnn_width: int) -> dict[str, tuple[type, dict]]:
    """Name -> (class, keyword arguments but depth)."""
    vit = dict(
        num_classes=4, image_size=DATA["image_size"], in_channels=1, dim=64, heads=4, mlp_ratio=2.0,
        patch_size=PATCH, pool="mean", init="torch", lr=3e-3,
    )  # fmt: skip
    cnn = dict(num_classes=4, in_channels=1, width=cnn_width, lr=2e-3)
    return {
        "ViT": (ViTClassifier, vit),
        "plain CNN": (CNNClassifier, cnn),
        "plain CNN, MLP head": (CNNClassifier, cnn | dict(mlp_head=True)),
        "downsampling CNN": (CNNClassifier, cnn | dict(downsample=True)),
    }


def covering_depth(name: str, gap: float) -> int:
    """The fewest 3x3 layers whose receptive field holds ink of both circles `gap` pixels apart
    (field >= gap + 2), for the plain or the downsampling CNN."""
    depth = 1
    while BagCNN(4, width=1, depth=depth, downsample="downsampling" in name).receptive_field < gap + 2:
        depth += 1
    return depth


def gaps(data: TwoCircles, split: str) -> torch.Tensor:
    """Per image: the gap between the circles' inks (which reach radius + 0.5 from the centres),
    along the larger of x and y."""
    centres = data.circle_centres(split)
    delta = torus_delta(centres[:, 0], centres[:, 1], float(data.hparams.image_size)).abs()
    return delta.amax(dim=-1) - 2 * data.hparams.radius - 1


@torch.no_grad()
def accuracy_by_gap(model, data: TwoCircles, split: str, bins: list[float]) -> tuple[float, list[float]]:
    model.eval()
    images, labels = data.split(split)[:]
    correct = torch.cat([model(x).argmax(-1) for x in images.split(512)]) == labels
    gap = gaps(data, split)
    per_bin = [
        correct[(gap >= lo) & (gap < hi)].float().mean().item()
        for lo, hi in zip(bins, bins[1:], strict=False)
    ]
    return correct.float().mean().item(), per_bin


def run(args: argparse.Namespace) -> dict:
    specs = {name: spec for name, spec in model_specs(args.cnn_width).items() if name in args.models}
    results: dict[str, dict] = {name: {} for name in specs}
    for seed in range(args.seeds):
        data = TwoCircles(**DATA, num_train=args.num_train, num_val=500, num_test=args.num_test, seed=seed)
        for name, (cls, kwargs) in specs.items():
            for depth in args.depths:
                L.seed_everything(seed, verbose=False)
                model = cls(**kwargs, depth=depth)
                trainer = L.Trainer(
                    max_steps=args.steps, logger=False, enable_checkpointing=False, limit_val_batches=0,
                    enable_model_summary=False, enable_progress_bar=False, num_sanity_val_steps=0,
                )  # fmt: skip
                started = time.perf_counter()
                trainer.fit(model, data)
                seconds = time.perf_counter() - started
                accuracy, per_bin = accuracy_by_gap(model, data, "test", GAP_BINS)
                entry = results[name].setdefault(
                    str(depth),
                    {
                        "params": num_params(model),
                        "field": getattr(model.model, "receptive_field", None),
                        "runs": [],
                    },
                )
                entry["runs"].append(
                    {
                        "seed": seed,
                        "train_seconds": round(seconds, 1),
                        "accuracy": accuracy,
                        "by_gap": per_bin,
                    }
                )
                bins = " ".join(f"{a:.2f}" for a in per_bin)
                print(
                    f"seed {seed} {name}, L={depth}: test {accuracy:.3f}, by gap {bins} ({seconds:.0f} s)",
                    flush=True,
                )
    return results


def mean_by_gap(entry: dict) -> list[float]:
    return [statistics.mean(r["by_gap"][i] for r in entry["runs"]) for i in range(len(GAP_BINS) - 1)]


def write_table(results: dict, path: Path, args: argparse.Namespace) -> None:
    bins = [f"gap {lo:g}-{hi:g}" for lo, hi in zip(GAP_BINS, GAP_BINS[1:], strict=False)]
    lines = [
        f"{args.steps} steps of 128 images, {args.num_train} training images, {args.seeds} seed(s) (mean); "
        "test accuracy per gap bin (pixels between the circles' inked edges, the larger of x and y); "
        "chance is 0.25. A CNN's field covers a gap g when field >= g + 2.",
        "",
        f"| model | L | parameters | field | {' | '.join(bins)} |",
        "|---|---|---|---|" + "---|" * len(bins),
    ]
    for name, by_depth in results.items():
        for depth, entry in by_depth.items():
            field = "-" if entry["field"] is None else str(entry["field"])
            accs = " | ".join(f"{a:.2f}" for a in mean_by_gap(entry))
            lines.append(f"| {name} | {depth} | {entry['params'] / 1e3:.1f} k | {field} | {accs} |")
    path.write_text("\n".join(lines) + "\n")


def plot(results: dict, out: Path) -> None:
    """Accuracy against depth, one panel per gap bin; dotted lines: the depth from which each CNN's
    field covers the bin's largest gap."""
    n = len(GAP_BINS) - 1
    fig = Figure(figsize=(3.2 * n, 3.4), layout="constrained")
    axes = fig.subplots(1, n, sharey=True)
    colors = dict(zip(results, ("C0", "C1", "C2", "C3"), strict=False))
    for i, ax in enumerate(axes):
        lo, hi = GAP_BINS[i], GAP_BINS[i + 1]
        for name, by_depth in results.items():
            depths = sorted(int(d) for d in by_depth)
            accs = [mean_by_gap(by_depth[str(d)])[i] for d in depths]
            ax.plot(depths, accs, marker="o", color=colors[name], label=name)
            if name in ("plain CNN", "downsampling CNN"):  # the MLP head's is the plain CNN's
                ax.axvline(covering_depth(name, hi), color=colors[name], linestyle=":", alpha=0.7)
        ax.axhline(0.25, color="gray", linestyle="--", linewidth=0.8)
        ax.set(title=f"gap {lo:g}-{hi:g} px", xlabel="depth L (layers)", ylim=(0, 1.02))
        ax.set_xticks(sorted({int(d) for by_depth in results.values() for d in by_depth}))
    axes[0].set_ylabel("test accuracy")
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.suptitle(
        "two circles: accuracy against depth (dotted: the depth whose field covers the gap)", fontsize=10
    )
    fig.savefig(out / "accuracy_vs_depth.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--depths", type=int, nargs="+", default=[1, 2, 3, 4, 6], help="layers L of every model"
    )
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--full", action="store_true", help="depths 1 2 3 4 6 8 and two seeds")
    parser.add_argument("--steps", type=int, default=800, help="optimizer steps per run")
    parser.add_argument("--num_train", type=int, default=20000)
    parser.add_argument("--num_test", type=int, default=4000)
    parser.add_argument("--cnn_width", type=int, default=16, help="channels of the CNNs")
    parser.add_argument("--models", nargs="+", default=list(model_specs(1)), choices=list(model_specs(1)))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/two_circles_depth"))
    parser.add_argument(
        "--replot", action="store_true", help="only redraw the figure from --out/results.json"
    )
    args = parser.parse_args()
    if args.full:
        args.depths, args.seeds = [1, 2, 3, 4, 6, 8], max(args.seeds, 2)
    if args.replot:
        record = json.loads((args.out / "results.json").read_text())
        plot(record["results"], args.out)
        print(f"redrew {args.out / 'accuracy_vs_depth.png'} from its results.json")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = run(args)
    minutes = (time.perf_counter() - started) / 60
    record = {
        "args": vars(args) | {"out": str(args.out)},
        "data": DATA,
        "patch_size": PATCH,
        "gap_bins": GAP_BINS,
    }
    record |= {"minutes": round(minutes, 1), "results": results}
    (args.out / "results.json").write_text(json.dumps(record, indent=1))
    write_table(results, args.out / "table.md", args)
    plot(results, args.out)
    print((args.out / "table.md").read_text())
    print(
        f"finished in {minutes:.1f} minutes; {args.out} holds table.md, accuracy_vs_depth.png, results.json"
    )


if __name__ == "__main__":
    main()
