"""What `vit-attention score` costs, and the demo run's evidence mass while it trained.

    python benchmarks/explanations.py speed --ckpt runs/demo/train/checkpoints/best.ckpt
    python benchmarks/explanations.py speed --ckpt best.ckpt --images 100 --timm-images 2  # shorter
    python benchmarks/explanations.py training runs/demo/train/metrics.csv  # the figure in docs/

`speed`: every method with deletion and insertion on `--images` test images of a checkpoint
(default 1,000; with and without the sanity checks), then a timm `vit_small_patch16_224` with
random weights (12 layers, 6 heads, 196 patches) on `--timm-images` random images: the seconds
per image as a multiple of one forward pass (batches of 32, fused attention), beside the forward
passes the protocol needs (`passes_needed`: a gradient map or a gradient pass counted as 3
forward passes, as a backward pass costs about two).

`training`: val/acc and the relevance mass of rollout and gradient rollout on the circles'
patches (`vit.interpret.watching.EvidenceMass`, on in configs/two_circles.yaml) against the step.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path

import torch
from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: `lab` and `vit` import from the checkout

from lab.machine import cpu_name  # noqa: E402
from vit import load_pretrained  # noqa: E402
from vit.checkpoint import load_checkpoint  # noqa: E402
from vit.datamodules import spread_test_images  # noqa: E402
from vit.interpret.evidence import patch_evidence  # noqa: E402
from vit.interpret.score import METHODS, evidence_mass, removal_counts, score  # noqa: E402
from vit.interpret.watching import EvidenceMass  # noqa: E402
from vit.plot import save_figure  # noqa: E402

KEYS = ("rollout", "grad_rollout")  # EvidenceMass's metrics: val/evidence_mass_<key>
MAP_PASSES = {
    "cls": 1,
    "rollout": 1,
    "grad-rollout": 3,
    "input-gradient": 3,
    "random": 0,
    "evidence": 0,
}


def passes_needed(methods: list[str], patches: int, depth: int, sanity: bool) -> int:
    """Forward passes per image of `vit.interpret.score.score`, a gradient pass counted as 3: the
    ends of every curve (no patch and every patch replaced) once, the inner steps of deletion and
    insertion per method, the maps; with the sanity checks, each method's map per randomisation
    step (head, then each block) and for the runner-up class."""
    inner = len(removal_counts(patches)) - 2
    needed = 2 + sum(2 * inner + MAP_PASSES[m] for m in methods)
    if sanity:
        model_methods = sum(MAP_PASSES[m] for m in methods if m not in ("random", "evidence"))
        needed += (depth + 1) * model_methods + model_methods
    return needed


def forward_seconds(model, images: torch.Tensor, batch: int = 32, rounds: int = 3) -> float:
    """Seconds per image of a forward pass (fused attention, inference mode), best of `rounds`."""
    model.eval()
    best = float("inf")
    with torch.inference_mode():
        model(images[:batch])  # warm-up
        for _ in range(rounds):
            start = time.perf_counter()
            for chunk in images.split(batch):
                model(chunk)
            best = min(best, (time.perf_counter() - start) / len(images))
    return best


def speed(args: argparse.Namespace) -> None:
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    classifier, data = load_checkpoint(args.ckpt)
    model = classifier.model
    images, labels, indices = spread_test_images(data, args.images)
    evidence = data.evidence("test")[indices]
    for sanity in (False, True):
        start = time.perf_counter()
        results = score(model, images, labels, evidence, batch_size=64, sanity=sanity)
        seconds = time.perf_counter() - start
        print(f"demo model, {len(images)} test images, all {len(results['methods'])} methods, deletion and "
              f"insertion{', sanity checks' if sanity else ''}: {seconds:.1f} s")  # fmt: skip

    # what vit.interpret.watching.EvidenceMass does after each validation, on its 64 validation images
    val, val_evidence = data.split("val")[:64][0], patch_evidence(model, data.evidence("val")[:64])
    start, rounds = time.perf_counter(), 5
    for _ in range(rounds):
        evidence_mass(model, val, val_evidence, EvidenceMass().methods)
    print(f"EvidenceMass's work per validation (64 images): {(time.perf_counter() - start) / rounds:.3f} s")
    if args.timm_images < 1:
        return
    import timm

    name = "vit_small_patch16_224"
    with tempfile.TemporaryDirectory() as folder:
        weights = Path(folder) / "weights.pth"
        torch.save(timm.create_model(name, pretrained=False).state_dict(), weights)
        vit = load_pretrained(f"timm:{name}", weights=weights).eval()
    x = torch.rand(max(args.timm_images, 32), 3, 224, 224, generator=torch.Generator().manual_seed(0))
    per_forward = forward_seconds(vit, x)
    methods = [m for m in METHODS if m != "evidence"]
    patches = vit.grid_size[0] * vit.grid_size[1]
    for sanity in (False, True):
        start = time.perf_counter()
        score(vit, x[: args.timm_images], methods=methods, batch_size=args.timm_images, sanity=sanity)
        per_image = (time.perf_counter() - start) / args.timm_images
        needed = passes_needed(methods, patches, len(vit.blocks), sanity)
        print(
            f"timm {name} (random weights), {args.timm_images} images{', sanity checks' if sanity else ''}: "
            f"{per_image:.2f} s per image = {per_image / per_forward:.0f} forward passes "
            f"({per_forward * 1000:.0f} ms each); the protocol needs {needed}: "
            f"{per_image / per_forward / needed:.2f} times that"
        )


def training(args: argparse.Namespace) -> None:
    with open(args.metrics) as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/acc")]
    steps = [int(r["step"]) for r in rows]
    fig = Figure(figsize=(6.0, 3.6), layout="constrained")
    ax = fig.subplots()
    ax.plot(steps, [float(r["val/acc"]) for r in rows], "o-", color="black", label="val/acc")
    for key, colour in zip(KEYS, ("tab:orange", "tab:green"), strict=True):
        values = [float(r[f"val/evidence_mass_{key}"]) for r in rows]
        ax.plot(steps, values, "o-", color=colour, label=f"{key.replace('_', ' ')}: mass on the circles")
    ax.plot(steps, [float(r["val/evidence_share"]) for r in rows], "--", color="red",
            label="circles' share of patches (chance)")  # fmt: skip
    ax.set_xlabel("optimizer step (one validation per epoch)")
    ax.set_ylim(0, 1)
    ax.set_title("the demo run: accuracy and where its maps look, per epoch", fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, args.out)
    print(f"wrote {args.out}")
    for r in rows:
        values = [
            float(r[f"val/{key}"]) for key in ("acc", *(f"evidence_mass_{k}" for k in KEYS), "evidence_share")
        ]
        print(
            "step {}: val/acc {:.3f}, rollout {:.3f}, grad-rollout {:.3f}, chance {:.3f}".format(
                r["step"], *values
            )
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser("speed", help="the cost of scoring")
    s.add_argument("--ckpt", required=True, help="a two-circles checkpoint (make demo's best.ckpt)")
    s.add_argument("--images", type=int, default=1000, help="test images of the checkpoint's data")
    s.add_argument("--timm-images", type=int, default=8, help="random images for timm ViT-S/16; 0: none")
    t = commands.add_parser("training", help="the evidence-mass figure of a run")
    t.add_argument("metrics", type=Path, help="a run's metrics.csv (with EvidenceMass on)")
    t.add_argument("--out", type=Path, default=Path("docs/two_circles_evidence_training.png"))
    args = parser.parse_args(argv)
    {"speed": speed, "training": training}[args.command](args)


if __name__ == "__main__":
    main()
