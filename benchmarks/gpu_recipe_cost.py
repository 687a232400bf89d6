"""What the GPU recipe costs, measured where there is no GPU: FLOPs per image by part of the model,
this machine's training steps per second, and what a time budget buys on a GPU at a stated share
of its bf16 matrix-product rate.

    python benchmarks/gpu_recipe_cost.py                       # configs/cifar10_gpu.yaml, 3 steps
    python benchmarks/gpu_recipe_cost.py --peak 800e12 --shares 0.2 0.3 0.4 --budgets 120 20

FLOPs come from `torch.utils.flop_counter` (matmuls and convolutions, attention spelled out as
matmuls), split into the convolutional stem, the patch embedding, the blocks' attention (Q, K, V
projections, QK^T and AV, the output projection), their MLPs, and the head. A training step counts the
forward and backward passes. The GPU projection is arithmetic, not a measurement: epochs of
45,000 training images that `share` x `peak` FLOP/s would train in each budget (the default peak is
an H100's bf16 dense matrix-product rate as measured on this project's lent H100, 798 TFLOP/s on
8192^3 products; `make gpu-check` measures both on the GPU itself).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from vit.config import ViTConfig
from vit.model import ViT
from vit.optim import adamw, cpu_has_native_bf16

ROOT = Path(__file__).resolve().parents[1]
TRAIN_IMAGES = 45_000  # CIFAR-10's 50,000 less the 5,000 held out for validation


def build(config_path: Path) -> tuple[ViT, dict]:
    config = yaml.safe_load(config_path.read_text())
    vit = ViTConfig.from_dict({**config["model"]["vit"], "image_size": 32, "num_classes": 10})
    return ViT(vit), config


def parts(model: ViT) -> dict[str, list[str]]:
    """The model's parts by the names the FLOP counter gives their modules."""
    blocks = range(len(model.blocks))
    return {
        "stem": ["ViT.stem"],
        "patch embedding": ["ViT.patch_embed"],
        "attention": [f"ViT.blocks.{i}.attn" for i in blocks],
        "MLP": [f"ViT.blocks.{i}.mlp" for i in blocks],
        "head": ["ViT.head"],
    }


def flops_by_part(model: ViT, batch: torch.Tensor, train: bool) -> dict[str, float]:
    """FLOPs per image of each part (each module's count holds everything inside it), forward only
    or forward and backward."""
    model.train(train)
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        if train:
            F.cross_entropy(model(batch), torch.zeros(len(batch), dtype=torch.long)).backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                model(batch)
    counts = counter.get_flop_counts()
    per_image = {
        part: sum(sum(counts.get(name, {}).values()) for name in names) / len(batch)
        for part, names in parts(model).items()
    }
    return {**per_image, "total": counter.get_total_flops() / len(batch)}


def steps_per_second(model: ViT, batch_size: int, steps: int, bf16: bool) -> float:
    model.train()
    optimizer = adamw(model, lr=1e-3, weight_decay=0.05)
    x, y = torch.rand(batch_size, 3, 32, 32), torch.randint(10, (batch_size,))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1 / statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "cifar10_gpu.yaml")
    parser.add_argument("--steps", type=int, default=3, help="timed training steps on this machine (0: none)")
    parser.add_argument("--batch", type=int, default=None, help="default: the config's batch size")
    parser.add_argument(
        "--peak", type=float, default=798e12, help="the GPU's bf16 FLOP/s (default: an H100's)"
    )
    parser.add_argument("--shares", type=float, nargs="+", default=[0.2, 0.3, 0.4], help="shares of the peak")
    parser.add_argument("--budgets", type=float, nargs="+", default=[120, 20], help="seconds of training")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model, config = build(args.config)
    batch_size = args.batch or config["data"]["init_args"]["batch_size"]
    probe = torch.rand(2, 3, 32, 32)
    forward, train = flops_by_part(model, probe, False), flops_by_part(model, probe, True)
    grid = model.grid_size
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"{args.config.name}: {grid[0]}x{grid[1]} tokens into {len(model.blocks)} blocks of width "
          f"{model.config.dim}; {millions:.2f} M parameters")  # fmt: skip
    print(f"{'part':<16} {'forward MFLOP/img':>18} {'share':>6} {'training MFLOP/img':>19}")
    for part in ("stem", "patch embedding", "attention", "MLP", "head", "total"):
        if part in forward:
            print(f"{part:<16} {forward[part] / 1e6:>18.1f} {forward[part] / forward['total']:>6.1%} "
                  f"{train.get(part, 0) / 1e6:>19.1f}")  # fmt: skip
    if args.steps:
        bf16 = cpu_has_native_bf16()
        rate = steps_per_second(model, batch_size, args.steps, bf16)
        images = rate * batch_size
        kind = f"{torch.get_num_threads()} threads, {'bf16' if bf16 else 'fp32'}"
        print(f"this CPU ({kind}), batch {batch_size}: {rate:.3f} steps/s, {images:.0f} images/s, "
              f"{images * train['total'] / 1e12:.2f} TFLOP/s")  # fmt: skip
    epoch = TRAIN_IMAGES * train["total"]
    print(f"a training epoch ({TRAIN_IMAGES} images): {epoch / 1e15:.3f} PFLOP")
    print(f"on a GPU of {args.peak / 1e12:.0f} TFLOP/s bf16:")
    for share in args.shares:
        per_epoch = epoch / (share * args.peak)
        budgets = ", ".join(f"{b:.0f} s: {b / per_epoch:.1f} epochs" for b in args.budgets)
        line = f"  at {share:.0%} of peak: {per_epoch:.2f} s an epoch; {budgets}"
        if args.steps:
            hours = max(args.budgets) * share * args.peak / (images * train["total"]) / 3600
            line += f"; this CPU would need {hours:.1f} h for the {max(args.budgets):.0f} s run's work"
        print(line)


if __name__ == "__main__":
    main()
