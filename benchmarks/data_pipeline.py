"""Does the data pipeline keep up with training? Training throughput fed by the CIFAR10 data module
against the same training steps on batches already in memory.

    python -m benchmarks.data_pipeline                         # the JPEG copy next to the repo
    python -m benchmarks.data_pipeline --root data/cifar10 --precision fp32 --policy none

One training step = forward, cross-entropy, backward, AdamW step (bf16 autocast by default), on
the `cifar` preset unless told otherwise. It measures, in alternating rounds after a warm-up:

(a) model only: steps on one random batch held in memory;
(b) pipeline: steps on batches from the data module's training loader, moved to the device and
    augmented there by `on_after_batch_transfer` (crop, flip, the policy, mixing), as in vit-train;

then prints the images per second of both (medians over rounds) and their ratio (goal: >= 0.90),
and times (c) the augmentation alone and the loader alone per batch. The first run on a folder of
JPEGs decodes them into the cache (about 15 s for CIFAR-10 on 2 cores); that is not timed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: `benchmarks` and `vit` import from the checkout

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.throughput import pick_device, seconds_per_call  # noqa: E402
from vit.datamodules import CIFAR10  # noqa: E402
from vit.memory import keep_freed_memory  # noqa: E402
from vit.model import ViT  # noqa: E402
from vit.optim import adamw  # noqa: E402

SHARED_COPY = ROOT.parent / "shared" / "data" / "cifar10-jpeg"  # this project's machines
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}


def make_step(model: torch.nn.Module, precision: str, device: torch.device) -> Callable:
    optimizer = adamw(model, lr=1e-3, weight_decay=0.05)
    dtype = PRECISIONS[precision]

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        autocast = torch.autocast(device.type, dtype=dtype) if dtype else nullcontext()
        with autocast:
            loss = F.cross_entropy(model(images), labels, label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def forever(data: CIFAR10) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        yield from data.train_dataloader()


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--root",
        type=Path,
        default=SHARED_COPY if SHARED_COPY.is_dir() else None,
        help=f"CIFAR-10 (either layout CIFAR10 reads); default {SHARED_COPY} if it exists",
    )
    parser.add_argument("--preset", default="cifar")
    parser.add_argument("--dim", type=int)
    parser.add_argument("--depth", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--mlp_ratio", type=float)
    parser.add_argument("--patch_dropout", type=float, default=0.0, help="share of patches dropped")
    parser.add_argument("--shifted_patches", action="store_true", help="shifted patch tokenization")
    parser.add_argument("--locality_attention", action="store_true", help="locality self-attention")
    parser.add_argument("--patch_size", type=int, default=4)
    parser.add_argument("--precision", choices=PRECISIONS, default="bf16")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--val_size", type=int, default=5000)
    parser.add_argument("--policy", choices=["none", "trivial", "randaugment"], default="trivial")
    parser.add_argument("--mixup_alpha", type=float, default=0.0)
    parser.add_argument("--cutmix_alpha", type=float, default=0.0)
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps of each kind first")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round and kind")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)  # fmt: skip
    if args.root is None:
        parser.error(f"--root is required ({SHARED_COPY} does not exist)")
    keep_freed_memory()  # as vit-train does

    device = pick_device()
    torch.manual_seed(0)
    data = CIFAR10(
        str(args.root), val_size=args.val_size, batch_size=args.batch, policy=args.policy,
        mixup_alpha=args.mixup_alpha, cutmix_alpha=args.cutmix_alpha,
    )  # fmt: skip
    data.prepare_data()
    data.setup("fit")
    model = ViT(
        preset=args.preset, num_classes=data.num_classes, image_size=data.image_size,
        in_channels=data.in_channels, patch_size=args.patch_size, dim=args.dim, depth=args.depth,
        heads=args.heads,
        mlp_ratio=args.mlp_ratio, patch_dropout=args.patch_dropout,
        shifted_patches=args.shifted_patches, locality_attention=args.locality_attention,
    ).to(device)  # fmt: skip
    model.train()
    step = make_step(model, args.precision, device)

    shape = (args.batch, data.in_channels, data.image_size, data.image_size)
    fixed_images = torch.rand(shape, device=device)
    fixed_labels = torch.randint(0, data.num_classes, (args.batch,), device=device)
    batches = forever(data)

    def model_only() -> None:
        step(fixed_images, fixed_labels)

    def pipeline() -> None:
        images, labels = next(batches)
        step(*data.augment(images.to(device), labels.to(device)))

    for _ in range(args.warmup):
        model_only()
        pipeline()
    alone, fed = [], []
    for _ in range(args.rounds):  # alternating, so that a change in machine load hits both
        alone.append(args.batch / seconds_per_call(model_only, args.steps, device))
        fed.append(args.batch / seconds_per_call(pipeline, args.steps, device))
    results = {"model_only": statistics.median(alone), "pipeline": statistics.median(fed)}
    results["ratio"] = results["pipeline"] / results["model_only"]

    uint8_images, labels = next(batches)
    uint8_images, labels = uint8_images.to(device), labels.to(device)
    results["augment_ms"] = 1000 * seconds_per_call(lambda: data.augment(uint8_images, labels), 20, device)
    results["loader_ms"] = 1000 * seconds_per_call(lambda: next(batches), 20, device)
    results["step_ms"] = args.batch / results["model_only"] * 1000

    print(
        f"device {device.type}, {torch.get_num_threads()} threads, preset {args.preset}, {args.precision}, "
        f"batch {args.batch}, policy {args.policy}, mixup {args.mixup_alpha}, cutmix {args.cutmix_alpha}; "
        f"medians of {args.rounds} rounds of {args.steps} steps"
    )
    print(f"(a) model only:      {results['model_only']:8.1f} images/s")
    print(f"(b) with pipeline:   {results['pipeline']:8.1f} images/s")
    print(f"    ratio (b)/(a):   {results['ratio']:8.3f}   (goal >= 0.90)")
    share = results["augment_ms"] / results["step_ms"]
    print(
        f"(c) augmentation:    {results['augment_ms']:8.2f} ms per batch "
        f"({share:.1%} of a model-only step of {results['step_ms']:.0f} ms)"
    )
    print(f"    loader alone:    {results['loader_ms']:8.2f} ms per batch")
    return results


if __name__ == "__main__":
    main()
