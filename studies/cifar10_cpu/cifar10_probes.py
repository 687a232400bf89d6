"""Probes of configs/cifar10_cpu.yaml at the steps each variant would get in a CPU's half hour.

A half hour of the config of 2026-11-25 (`BEFORE`: 4 blocks on a three-convolution stem) trains
5,700 steps on the 2-core AVX2-only EPYC (Zen 3) in fp32 (studies/cifar10_cpu/README.md). A variant that costs
more or less per step gets proportionally fewer or more. Step counts, not minutes, make a probe's
result independent of where it runs, so a GPU can run many probes at once and in minutes, in
fp32 (no TF32), with the same schedule (warm-up and cosine over the steps) and data pipeline.

    python -m studies.cifar10_cpu.cifar10_probes cost --out costs.json       # this CPU: ms per step
    python -m studies.cifar10_cpu.cifar10_probes run --costs costs.json --root ../shared/data/cifar10-jpeg \\
        --out runs/probes --seeds 0 1 --jobs 12                     # any device: train, summarise

`cost` times each variant's training step here (crop and flip of a uint8 batch, forward,
backward, AdamW; fp32, per 128 images) and writes milliseconds per step; `run` trains each
variant for `--steps` x cost(before) / cost(variant) steps (a variant of training settings alone
gets `--steps`) and writes `summary.md` (last and best val/acc, mean over seeds) and
`summary.json`. studies/cifar10_cpu/README.md has the probes of 2026-11-26 and their `costs.json`.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "cifar10_cpu.yaml"


def stem(channels: str, strides: str | None = None) -> list[str]:
    """Overrides of the convolutional stem: channels and strides as YAML lists ("[64,128,256]")."""
    return ["--model.vit.conv_stem", channels, "--model.vit.conv_stem_strides", strides or "null"]


def depth(blocks: int) -> list[str]:
    return ["--model.vit.depth", str(blocks)]


# The probes of 2026-11-26 changed the config they started from (4 blocks on a three-convolution
# stem); these overrides turn today's config back into it, and each variant changes that.
BEFORE = depth(4) + stem("[64,128,256]")
EMA = "--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging"
# name -> vit-train overrides of the config before (after BEFORE)
VARIANTS: dict[str, list[str]] = {
    "before": [],
    "lr2e-3": ["--model.lr", "0.002"],
    "smooth0.2": ["--model.label_smoothing", "0.2"],
    "wd0.1": ["--model.weight_decay", "0.1"],
    "batch256-lr2e-3": ["--data.init_args.batch_size", "256", "--model.lr", "0.002"],
    "batch64": ["--data.init_args.batch_size", "64"],
    "depth3": depth(3),
    "depth6": depth(6),
    "mlp4": ["--model.vit.mlp_ratio", "4"],
    "dim256": ["--model.vit.dim", "256", "--model.vit.heads", "4"],
    "stem-stride1-first": stem("[32,64,128,256]", "[1,2,2,2]"),
    "stem-extra-8x8": stem("[64,128,128,256]", "[2,2,1,2]"),
    "stem32": stem("[32,64,128]"),
    "no-lsa": ["--model.vit.locality_attention", "false"],
    "pad2": ["--data.init_args.crop_padding", "2"],
    "warmup0.02-min0": ["--model.warmup_fraction", "0.02", "--model.min_lr_fraction", "0.0"],
    "lr3e-3": ["--model.lr", "0.003"],
    "ema0.999": [EMA, "--trainer.callbacks.decay", "0.999"],
    # the second wave: the first one's gains together
    "stem-extra-8x8+depth3": stem("[64,128,128,256]", "[2,2,1,2]") + depth(3),
    "stem-extra-8x8+depth2": stem("[64,128,128,256]", "[2,2,1,2]") + depth(2),
    "stem5+depth3": stem("[32,64,128,128,256]", "[1,2,2,1,2]") + depth(3),
    "stem-extra-16x16+depth3": stem("[64,64,128,256]", "[2,1,2,2]") + depth(3),
    "stem5+depth2": stem("[32,64,128,128,256]", "[1,2,2,1,2]") + depth(2),  # the config since
}


def changes_the_step(variant: list[str]) -> bool:
    """Whether the variant changes what a step costs: the model's architecture or the batch size
    (the others get the config's cost, not a noisy copy of it)."""
    return any(k.startswith("--model.vit.") or k == "--data.init_args.batch_size" for k, _ in pairs(variant))


def batch_of(variant: list[str]) -> int:
    """The variant's batch size (the config's, 128, unless it says otherwise)."""
    return overrides_of(variant, "--data.init_args.").get("batch_size", 128)


def overrides_of(args: list[str], prefix: str) -> dict:
    """The values of the `--prefix.NAME VALUE` pairs in `args`, parsed as YAML."""
    return {k[len(prefix) :]: yaml.safe_load(v) for k, v in pairs(args) if k.startswith(prefix)}


def pairs(args: list[str]) -> list[tuple[str, str | None]]:
    """(option, value) of each override; `--option=value` and `--option+=value` stand alone."""
    out, rest = [], list(args)
    while rest:
        key = rest.pop(0)
        out.append((key, None) if "=" in key else (key, rest.pop(0)))
    return out


def step_cost(variant: list[str], steps: int, warmup: int, compile: bool = False) -> float:
    """Median seconds of one training step of the variant on this machine's CPU, in fp32."""
    from vit.augment import random_crop_flip
    from vit.model import ViT
    from vit.optim import adamw
    from vit.preparation import to_float

    config = yaml.safe_load(CONFIG.read_text())
    vit = {**config["model"]["vit"], **overrides_of(BEFORE + variant, "--model.vit.")}
    batch = batch_of(variant)
    torch.manual_seed(0)
    model = ViT(**vit)
    if compile:  # as the config's `compile: true` does (in place; the first steps compile)
        model.compile()
    optimizer = adamw(model, lr=1e-3, weight_decay=0.05)
    images = torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8)
    labels = torch.randint(0, 10, (batch,))
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        x = to_float(random_crop_flip(images, 4, True))
        F.cross_entropy(model(x), labels, label_smoothing=0.1).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times) / batch * 128  # per 128 images: comparable across batch sizes


def cost(args) -> None:
    print(f"{platform.processor() or platform.machine()}; torch {torch.__version__}; "
          f"{torch.get_num_threads()} threads; {torch.backends.cpu.get_cpu_capability()}")  # fmt: skip
    names = args.variants or list(VARIANTS)
    rounds = {name: [] for name in names}
    for _ in range(args.rounds):  # interleaved: drift hits every variant alike
        for name in names:
            rounds[name].append(step_cost(VARIANTS[name], args.steps, args.warmup, args.compile))
    costs = {name: statistics.median(values) * 1000 for name, values in rounds.items()}
    for name, ms in costs.items():
        print(f"{name:<24} {ms:7.1f} ms per 128 images  {costs['before'] / ms:5.2f}x the steps of `before`")
    Path(args.out).write_text(json.dumps(costs, indent=1))


def train(variant: str, seed: int, steps: int, args) -> dict:
    """Trains the variant for `steps` optimizer steps (of its own batch size) in a subprocess."""
    name = f"{variant}_seed{seed}"
    command = [
        sys.executable, "-c",
        "import sys, torch; torch.backends.cudnn.allow_tf32 = False; "  # fp32 as on a CPU
        "torch.backends.cuda.matmul.allow_tf32 = False; "
        "from vit.commands.train import main; sys.argv[0] = 'vit-train'; main()",
        "fit", "--config", str(CONFIG),
        "--data.init_args.root", args.root, "--data.init_args.download", "false",
        "--trainer.max_time", "null", "--trainer.max_steps", str(steps),
        "--trainer.precision", "32-true", "--trainer.enable_progress_bar", "false",
        "--trainer.logger.init_args.save_dir", args.out, "--trainer.logger.init_args.name", name,
        "--seed_everything", str(seed), *BEFORE, *VARIANTS[variant],
    ]  # fmt: skip
    start = time.time()
    log = Path(args.out) / f"{name}.log"
    with open(log, "w") as f:
        rc = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT).returncode
    seconds = time.time() - start
    result = dict(variant=variant, seed=seed, steps=steps, rc=rc, seconds=seconds)
    metrics = sorted((Path(args.out) / name).glob("version_*/metrics.csv"))
    if metrics:
        rows = [r for r in csv.DictReader(open(metrics[-1])) if r.get("val/acc")]
        if rows:
            accuracy = [float(r["val/acc"]) for r in rows]
            result.update(val_last=accuracy[-1], val_best=max(accuracy))
            result["curve"] = [(int(r["step"]), float(r["val/acc"])) for r in rows]
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}), flush=True)
    return result


def run(args) -> None:
    costs = json.loads(Path(args.costs).read_text())
    names = args.variants or list(VARIANTS)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.jobs > 1:  # processes share the CPU cores: one thread each
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    cost = {n: costs[n if changes_the_step(VARIANTS[n]) else "before"] for n in names}
    # the images of `--steps` batches of 128 times the cost ratio, in batches of the variant's size
    steps = {n: round(args.steps * costs["before"] / cost[n] * 128 / batch_of(VARIANTS[n])) for n in names}
    jobs = [(n, s, steps[n]) for s in args.seeds for n in names]  # every variant once first
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda job: train(*job, args), jobs))
    Path(args.out, "summary.json").write_text(json.dumps(results))
    lines = ["| variant | steps | val/acc last (seeds) | mean | best (mean) |", "|---|---|---|---|---|"]
    for n in names:
        rs = [r for r in results if r["variant"] == n and "val_last" in r]
        if not rs:
            lines.append(f"| {n} | failed | | | |")
            continue
        last = [r["val_last"] for r in rs]
        seeds = ", ".join(f"{v:.4f}" for v in last)
        best = statistics.mean(r["val_best"] for r in rs)
        lines.append(f"| {n} | {rs[0]['steps']:,} | {seeds} | {statistics.mean(last):.4f} | {best:.4f} |")
    Path(args.out, "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("cost", help="time each variant's training step on this CPU")
    c.add_argument("--out", default="costs.json")
    c.add_argument("--steps", type=int, default=8)
    c.add_argument("--warmup", type=int, default=3)
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--variants", nargs="*", choices=list(VARIANTS))
    c.add_argument("--compile", action="store_true", help="time the compiled models (torch.compile)")
    r = sub.add_parser("run", help="train each variant for the steps it gets")
    r.add_argument("--costs", required=True, help="the JSON file of `cost`")
    r.add_argument("--root", required=True, help="CIFAR-10's folder (--data.init_args.root)")
    r.add_argument("--out", default="runs/probes")
    r.add_argument("--steps", type=int, default=5700, help="the config's steps in the budget")
    r.add_argument("--seeds", type=int, nargs="+", default=[0])
    r.add_argument("--jobs", type=int, default=4, help="runs at a time")
    r.add_argument("--variants", nargs="*", choices=list(VARIANTS))
    args = parser.parse_args(argv)
    cost(args) if args.command == "cost" else run(args)


if __name__ == "__main__":
    main()
