"""Training and inference speed of the CPU config's networks with their images in NCHW memory
(PyTorch's default) and in channels-last (NHWC) memory, the layout `vit.preparation.for_the_device`
gives every image batch.

    python benchmarks/memory_format.py                    # fp32, batch 128, 7 rounds: about 2 minutes
    python benchmarks/memory_format.py --precision bf16   # where the CPU has native bf16
    python benchmarks/memory_format.py --smoke            # a batch of 2, one round: seconds

The networks: configs/cifar10_cpu.yaml's ViT (its conv stem and two blocks), the same without its
blocks (`--model.vit.depth 0`), airbench94's CNN (`vit.cnn.AirbenchCNN`, the CPU peer's) and a ViT
on plain patches, no convolution (configs/two_circles.yaml's, on the same 32x32 RGB images). Each
runs three ways on the same weights and the same random batch: `nchw` (images and weights as
PyTorch makes them), `nhwc` (the images channels-last: what vit-train does for a network with
convolutions) and `nhwc+weights` (the convolutions' weights channels-last too: what the teacher
and the CPU peer do). One training
step is forward, cross-entropy, backward and an AdamW step; inference is a forward pass in eval
mode. The twelve run interleaved after a warm-up, for `--rounds` rounds; medians are reported, with
the largest difference of each layout's eval logits from NCHW's (the same maths: rounding only).

    python benchmarks/memory_format.py --precision bf16 --compile --layouts nhwc

Each network's training FLOPs per image (forward and backward, counted as throughput.py counts
them: `counted_flops`, matmuls, convolutions and attention) turn its images/s into a share of the
matrix-product rate measured in the same run (`throughput.gemm_peak`): how much of the CPU each
network turns into training.
`--compile` trains and infers through torch.compile (what configs/cifar10_cpu.yaml does);
`--layouts` times some layouts only.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: `lab` and `vit` import from the checkout

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import yaml  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.throughput import counted_flops, gemm_peak, seconds_per_call  # noqa: E402
from lab.machine import hardware  # noqa: E402
from vit.cnn import AirbenchCNN  # noqa: E402
from vit.memory import keep_freed_memory  # noqa: E402
from vit.model import ViT  # noqa: E402

CONFIG = ROOT / "configs" / "cifar10_cpu.yaml"
PLAIN = ROOT / "configs" / "two_circles.yaml"
LAYOUTS = ("nchw", "nhwc", "nhwc+weights")
CPU = torch.device("cpu")


def networks(smoke: bool) -> dict[str, Callable[[], nn.Module]]:
    """The config's ViT, its depth-0 control, airbench94's CNN and a plain-patch ViT (narrow ones
    with --smoke)."""
    images = dict(num_classes=10, image_size=32)
    vit = yaml.safe_load(CONFIG.read_text())["model"]["vit"] | images
    plain = yaml.safe_load(PLAIN.read_text())["model"]["vit"] | images
    if smoke:
        vit |= dict(preset="micro", conv_stem=[4, 8, 8, 8, 16])
        plain |= dict(preset="micro")
    return {
        "config": lambda: ViT(**vit),
        "depth0": lambda: ViT(**vit | dict(depth=0)),
        "airbench": lambda: AirbenchCNN(10, widths=(8, 16, 16) if smoke else (64, 256, 256)),
        "plain": lambda: ViT(**plain),
    }


class Run:
    """One network in one layout: its weights, optimizer and batch."""

    def __init__(
        self,
        network: nn.Module,
        layout: str,
        images: torch.Tensor,
        labels: torch.Tensor,
        dtype,
        compile=False,
    ):
        channels_last = torch.channels_last
        self.network = network.to(memory_format=channels_last) if layout == "nhwc+weights" else network
        self.flops = self.train_flops(images, labels, dtype) / len(images)  # eager: the counter sees it all
        if compile:  # in place, as vit-train compiles
            self.network.compile()
        self.images = images if layout == "nchw" else images.contiguous(memory_format=channels_last)
        self.labels, self.optimizer = labels, torch.optim.AdamW(self.network.parameters(), lr=1e-3)
        self.autocast = (
            (lambda: torch.autocast("cpu", dtype=dtype)) if dtype != torch.float32 else nullcontext
        )

    def train_step(self) -> None:
        self.network.train()
        with self.autocast():
            loss = F.cross_entropy(self.network(self.images), self.labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def train_flops(self, images: torch.Tensor, labels: torch.Tensor, dtype) -> int:
        """FLOPs of one forward and backward of the batch (the optimizer's are negligible)."""
        self.network.train()

        def forward_backward() -> None:
            with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                loss = F.cross_entropy(self.network(images), labels)
            loss.backward()

        flops = counted_flops(forward_backward)
        self.network.zero_grad(set_to_none=True)
        return flops

    @torch.inference_mode()
    def logits(self) -> torch.Tensor:
        self.network.eval()
        with self.autocast():
            return self.network(self.images).float()


def measure(
    batch: int,
    rounds: int,
    steps: int,
    dtype: torch.dtype,
    smoke: bool = False,
    compile: bool = False,
    layouts: tuple[str, ...] = LAYOUTS,
) -> dict:
    """Per network and layout: training and inference images/s (medians of `rounds` interleaved
    rounds of `steps` calls), training FLOPs per image and the largest difference of its eval
    logits from the first layout's."""
    torch.manual_seed(0)
    images, labels = torch.rand(batch, 3, 32, 32), torch.randint(10, (batch,))
    runs = {}
    for name, build in networks(smoke).items():
        torch.manual_seed(0)
        network = build()
        for layout in layouts:
            runs[name, layout] = Run(copy.deepcopy(network), layout, images, labels, dtype, compile)
    differences = {
        (name, layout): (run.logits() - runs[name, layouts[0]].logits()).abs().max().item()
        for (name, layout), run in runs.items()
    }  # before any step: the same weights
    for run in runs.values():
        run.train_step()
    train, infer = ({key: [] for key in runs} for _ in range(2))
    for _ in range(rounds):
        for key, run in runs.items():
            train[key].append(seconds_per_call(run.train_step, steps, CPU))
            infer[key].append(seconds_per_call(run.logits, steps, CPU))
    return {
        key: dict(
            train=batch / statistics.median(train[key]),
            infer=batch / statistics.median(infer[key]),
            flops=run.flops,
            difference=differences[key],
        )
        for key, run in runs.items()
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2, help="calls per network and layout per round")
    parser.add_argument("--smoke", action="store_true", help="narrow networks, a batch of 2, one round")
    parser.add_argument("--compile", action="store_true", help="every network through torch.compile")
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS), help="default: all")
    args = parser.parse_args(argv)
    if args.smoke:
        args.batch, args.rounds, args.steps = 2, 1, 1
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    keep_freed_memory()  # as vit's commands do
    peak = gemm_peak(dtype, CPU)
    layouts = tuple(args.layouts)
    results = measure(args.batch, args.rounds, args.steps, dtype, args.smoke, args.compile, layouts)
    compiled = "torch.compile" if args.compile else "eager"
    print(f"{hardware(CPU)}; {args.precision}, {compiled}, batch {args.batch}, {args.rounds} rounds")
    print(f"matrix-product rate: {peak / 1e9:.0f} GFLOP/s; training's share of it from its FLOPs per image")
    first = layouts[0]
    columns = (
        "train img/s",
        f"vs {first}",
        "infer img/s",
        f"vs {first}",
        "GFLOP/img",
        "of rate",
        "logits diff",
    )
    print(f"{'network':<9} {'layout':<13} " + " ".join(f"{c:>11}" for c in columns))
    for (name, layout), r in results.items():
        base = results[name, first]
        train, infer = r["train"] / base["train"], r["infer"] / base["infer"]
        cells = (f"{r['train']:.1f}", f"{train:.2f}x", f"{r['infer']:.1f}", f"{infer:.2f}x")
        cells += (
            f"{r['flops'] / 1e9:.3f}",
            f"{r['flops'] * r['train'] / peak:.1%}",
            f"{r['difference']:.1e}",
        )
        print(f"{name:<9} {layout:<13} " + " ".join(f"{c:>11}" for c in cells))
    return results


if __name__ == "__main__":
    main()
