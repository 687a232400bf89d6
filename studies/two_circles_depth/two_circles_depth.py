"""Two circles: how many layers does each model need to relate two distant circles?

    python studies/two_circles_depth/two_circles_depth.py  # the default grid, about 40 minutes
    python studies/two_circles_depth/two_circles_depth.py --full  # + the MLP head, depths to 8, two seeds
    python studies/two_circles_depth/two_circles_depth.py --depths 1 2 --steps 20 --out /tmp/quick  # smoke
    python studies/two_circles_depth/two_circles_depth.py --replot  # redraw from results.json
    python studies/two_circles_depth/two_circles_depth.py --add --models "plain CNN" --depths 3 4 5 \\
        --seeds 1  # more runs

The claim the data set was made for: self-attention relates two distant patches in one layer,
while a convolution relates only what its receptive field covers, so a CNN needs depth (or
downsampling) that grows with the distance. Every model below trains at several depths L for the
same steps on the same images (one data set per seed) and is tested per bin of the *gap*: the
larger of the x and y distances between the two circles' inked edges (square receptive fields
see that one), on a wrap-around canvas (no position leak). The gap is never below the ViT's patch
size, so no patch holds both circles.

Models at depth L:
- ViT, relative positions: L transformer blocks of width 64, 4x4 patches, no position embeddings
  but a learned attention bias per head and patch offset (`rel_pos_bias`, as BEiT and Swin),
  mean pooling, the demo config's lr (3e-3);
- ViT, learned positions: the same with learned absolute position embeddings instead (the
  original ViT's), which must learn from data that the relation is the same everywhere;
- plain CNN: L 3x3 convolutions of stride 1 (receptive field 2L + 1 pixels), two 1x1 layers,
  global average pooling, a linear head; and the same with an MLP head after pooling (`--full`);
- downsampling CNN: the same with stride 2 in every other 3x3 layer (fields 3, 7, 11, 19, 27, 43,
  59, 91 pixels for L = 1..8).

A unit relates the two circles only if its field holds ink of both: field >= gap + 2 pixels.

Predictions, stated on 2026-11-25 before the first grid run, after the probes in
docs/two_circles.md (with 4-pixel patches, circles of radius 1.5 left every ViT at chance; of
radius 2.5, the relative-position ViT with L = 1 reached 0.83 in 1,500 steps and the
learned-position one stayed at chance):
1. The ViT with relative positions reaches >= 0.85 with L = 1 in every gap bin, and depth does
   not move where it succeeds.
2. The plain CNN is near chance (<= 0.4) in a gap bin while 2L + 1 < the bin's smallest gap + 2,
   and >= 0.9 once 2L + 1 >= its largest gap + 2; the MLP head does not change where.
3. The downsampling CNN follows the same rule with its own fields: it succeeds everywhere from
   L = 4 (field 19), in the smallest bin from L = 3.
4. The ViT with learned positions stays near chance at every depth within this budget: what the
   relative-position ViT has and it lacks is the relation's translation invariance, not range.
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

from vit import CNNClassifier, TwoCircles, ViTClassifier, ViTConfig
from vit.cnn import BagCNN
from vit.model import num_params
from vit.two_circles import torus_delta

# A 32x32 wrap-around canvas, circles of radius 2.5 (ink reaches 3 pixels from the centre, the
# last half pixel anti-aliased) whose centres are 10-15.5 pixels apart along the larger of x and y
# (`separation_metric="chebyshev"`, so that the gap does not depend on the class; below half the
# canvas, so the shortest way round keeps the orientation): gaps of 4 to 9.5 pixels between the
# inks, never less than the ViT's 4-pixel patch. (Circles of radius 1.5 would give gaps up to
# 11.5, but no ViT left chance on them; a 64x64 canvas would cost the CNNs 4x the time.)
DATA = dict(image_size=32, radius=2.5, separation=(10.0, 15.5), separation_metric="chebyshev")
PATCH = 4
GAP_BINS = [4.0, 6.0, 8.0, 10.0]


def model_specs(cnn_width: int, vit_lr: float = 3e-3) -> dict[str, tuple[type, dict]]:
    """Name -> (class, keyword arguments but depth)."""
    vit = dict(dim=64, heads=4, mlp_ratio=2.0, patch_size=PATCH, pool="mean", init="torch")
    train = dict(num_classes=4, image_size=DATA["image_size"], in_channels=1, lr=vit_lr)
    cnn = dict(num_classes=4, in_channels=1, width=cnn_width, lr=2e-3)
    return {
        "ViT, relative positions": (
            ViTClassifier,
            train | dict(vit=vit | dict(pos_embed="none", rel_pos_bias=True)),
        ),
        "ViT, learned positions": (ViTClassifier, train | dict(vit=vit)),
        "plain CNN": (CNNClassifier, cnn),
        "plain CNN, MLP head": (CNNClassifier, cnn | dict(mlp_head=True)),
        "downsampling CNN": (CNNClassifier, cnn | dict(downsample=True)),
    }


def build(cls: type, kwargs: dict, depth: int):
    """The model of a spec at `depth`: a ViT's depth is an option of its `vit` config."""
    if cls is ViTClassifier:
        return ViTClassifier(**kwargs | dict(vit=ViTConfig(**kwargs["vit"], depth=depth)))
    return cls(**kwargs, depth=depth)


def data_options(args: argparse.Namespace) -> dict:
    """DATA, with the circles' radius and separations of the command line (for probes)."""
    return DATA | dict(radius=args.radius, separation=tuple(args.separation))


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
    specs = model_specs(args.cnn_width, args.vit_lr)
    specs = {name: spec for name, spec in specs.items() if name in args.models}
    results: dict[str, dict] = {name: {} for name in specs}
    for seed in args.seeds:
        data = TwoCircles(**data_options(args), num_train=args.num_train, num_val=500, num_test=args.num_test,
                          seed=seed)  # fmt: skip
        for name, (cls, kwargs) in specs.items():
            for depth in args.depths:
                L.seed_everything(seed, verbose=False)
                model = build(cls, kwargs, depth)
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


def merge(record: dict, results: dict) -> None:
    """Add `results` to `record`'s: new models and depths, and a seed's run replacing the same
    seed's."""
    for name, by_depth in results.items():
        for depth, entry in by_depth.items():
            old = record["results"].setdefault(name, {}).setdefault(depth, entry | {"runs": []})
            seeds = {r["seed"] for r in entry["runs"]}
            old["runs"] = sorted([r for r in old["runs"] if r["seed"] not in seeds] + entry["runs"],
                                 key=lambda r: r["seed"])  # fmt: skip


def write_table(record: dict, path: Path) -> None:
    bins = [f"gap {lo:g}-{hi:g}" for lo, hi in zip(GAP_BINS, GAP_BINS[1:], strict=False)]
    setup = record["setup"]
    lines = [
        f"{setup['steps']} steps of 128 images, {setup['num_train']} training images; test accuracy per "
        "gap bin (pixels between the circles' inked edges, the larger of x and y; the mean over seeds) "
        "and over the whole test split (per seed); chance is 0.25. A CNN's field covers a gap g when "
        "field >= g + 2.",
        "",
        f"| model | L | parameters | field | {' | '.join(bins)} | test, per seed |",
        "|---|---|---|---|" + "---|" * len(bins) + "---|",
    ]
    for name, by_depth in record["results"].items():
        for depth in sorted(by_depth, key=int):
            entry = by_depth[depth]
            field = "-" if entry["field"] is None else str(entry["field"])
            accs = " | ".join(f"{a:.2f}" for a in mean_by_gap(entry))
            per_seed = ", ".join(f"{r['accuracy']:.3f}" for r in entry["runs"])
            lines.append(
                f"| {name} | {depth} | {entry['params'] / 1e3:.1f} k | {field} | {accs} | {per_seed} |"
            )
    path.write_text("\n".join(lines) + "\n")


def plot(results: dict, out: Path) -> None:
    """Accuracy against depth, one panel per gap bin (lines: the mean over seeds; dots: each seed's);
    dotted lines: the depth from which each CNN's field covers the bin's largest gap."""
    n = len(GAP_BINS) - 1
    fig = Figure(figsize=(3.2 * n, 3.4), layout="constrained")
    axes = fig.subplots(1, n, sharey=True)
    colors = dict(zip(model_specs(1), ("C0", "C7", "C1", "C2", "C3"), strict=True))  # one per model
    for i, ax in enumerate(axes):
        lo, hi = GAP_BINS[i], GAP_BINS[i + 1]
        for name, by_depth in results.items():
            depths = sorted(int(d) for d in by_depth)
            accs = [mean_by_gap(by_depth[str(d)])[i] for d in depths]
            ax.plot(depths, accs, marker="o", color=colors[name], label=name)
            seeds = [(d, r["by_gap"][i]) for d in depths for r in by_depth[str(d)]["runs"]]
            if len(seeds) > len(depths):  # each seed's accuracy where there are several
                ax.scatter(*zip(*seeds, strict=True), color=colors[name], s=12, alpha=0.35, linewidths=0)
            if name in ("plain CNN", "downsampling CNN"):  # the MLP head's is the plain CNN's
                ax.axvline(covering_depth(name, hi), color=colors[name], linestyle=":", alpha=0.7)
        ax.axhline(0.25, color="gray", linestyle="--", linewidth=0.8)
        ax.set(title=f"gap {lo:g}-{hi:g} px", xlabel="depth L (layers)", ylim=(0, 1.02))
        ax.set_xticks(sorted({int(d) for by_depth in results.values() for d in by_depth}))
    axes[0].set_ylabel("test accuracy")
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize=7, loc="outside lower center", ncols=5)
    fig.suptitle(
        "two circles: accuracy against depth (dotted: the depth whose field covers the gap)", fontsize=10
    )
    fig.savefig(out / "accuracy_vs_depth.png", dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--depths", type=int, nargs="+", default=[1, 2, 3, 4, 6], help="layers L of every model"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds of the data and the models")
    parser.add_argument(
        "--add", action="store_true", help="add these runs to --out/results.json (same data and steps)"
    )
    parser.add_argument(
        "--full", action="store_true", help="every model (the MLP head too), depths 1 2 3 4 6 8, two seeds"
    )
    parser.add_argument("--steps", type=int, default=2000, help="optimizer steps per run")
    parser.add_argument("--num_train", type=int, default=20000)
    parser.add_argument("--num_test", type=int, default=4000)
    parser.add_argument("--cnn_width", type=int, default=16, help="channels of the CNNs")
    parser.add_argument("--vit_lr", type=float, default=3e-3, help="learning rate of the ViTs")
    parser.add_argument("--radius", type=float, default=DATA["radius"], help="of the circles (pixels)")
    parser.add_argument(
        "--separation", type=float, nargs=2, default=DATA["separation"], metavar=("LOW", "HIGH"),
        help="of the centres, the larger of x and y (pixels); gaps outside the bins are not binned",
    )  # fmt: skip
    names = list(model_specs(1))
    parser.add_argument(
        "--models", nargs="+", choices=names, help="by name (default: all but the MLP head: --full)"
    )
    parser.add_argument("--out", type=Path, default=Path("studies/two_circles_depth"))
    parser.add_argument(
        "--replot", action="store_true", help="only redraw the figure from --out/results.json"
    )
    args = parser.parse_args(argv)
    if args.full:
        args.depths, args.seeds = [1, 2, 3, 4, 6, 8], sorted({*args.seeds, 0, 1})
    args.models = args.models or [name for name in names if args.full or "MLP head" not in name]
    if args.replot:
        record = json.loads((args.out / "results.json").read_text())
        plot(record["results"], args.out)
        print(f"redrew {args.out / 'accuracy_vs_depth.png'} from its results.json")
        return
    setup = {"data": data_options(args), "patch_size": PATCH, "gap_bins": GAP_BINS}
    setup |= {k: getattr(args, k) for k in ("steps", "num_train", "num_test", "cnn_width", "vit_lr")}
    setup = json.loads(json.dumps(setup))  # tuples as lists, as read back
    path = args.out / "results.json"
    record = {"setup": setup, "commands": [], "results": {}}
    if args.add:
        if not path.exists():
            raise SystemExit(f"error: --add needs {path}; run without --add first")
        record = json.loads(path.read_text())
        if record["setup"] != setup:
            raise SystemExit(f"error: --add needs the set-up of {path}: {record['setup']}")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = run(args)
    minutes = (time.perf_counter() - started) / 60
    merge(record, results)
    record["commands"].append({"args": vars(args) | {"out": str(args.out)}, "minutes": round(minutes, 1)})
    path.write_text(json.dumps(record, indent=1))
    write_table(record, args.out / "table.md")
    plot(record["results"], args.out)
    print((args.out / "table.md").read_text())
    print(
        f"finished in {minutes:.1f} minutes; {args.out} holds table.md, accuracy_vs_depth.png, results.json"
    )


if __name__ == "__main__":
    main()
