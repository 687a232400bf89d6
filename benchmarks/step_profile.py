"""Where a training step's time goes, by kind of operator: matrix products, attention, softmax,
LayerNorm, GELU, casts and copies, the optimizer, the rest.

    python benchmarks/step_profile.py                                  # ours, the cifar model, bf16
    python benchmarks/step_profile.py --systems ours timm vit-pytorch --precision fp32
    python benchmarks/step_profile.py --smoke                          # toy size, a few seconds

Each system is `benchmarks/throughput.py`'s (the same model, optimizer and batch); `--steps`
training steps run under `torch.profiler` after `--warmup` steps, and each operator's own time
(`self_cpu_time_total`, or CUDA time on a GPU) is put in the first kind whose name it matches.
Time in kernels only: Python and the dispatcher between them are the difference between the
step's wall time and the sum, printed as "outside operators".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: `benchmarks` and `vit` import from the checkout

from benchmarks.throughput import MODELS, STEM_CONFIGS, System, hardware, pick_device  # noqa: E402

# kind -> substrings of aten operator names, tried in this order
KINDS = {
    "attention": ("scaled_dot_product", "flash", "_efficient_attention"),
    "matmul": ("mm", "matmul", "linear", "addmm", "baddbmm", "bmm", "convolution", "conv2d"),
    "softmax": ("softmax",),
    "layernorm": ("layer_norm", "native_layer_norm", "batch_norm"),
    "gelu": ("gelu",),
    "optimizer": ("_foreach", "_fused_adam", "addcdiv", "lerp", "sqrt"),
    "casts and copies": ("_to_copy", "copy_", "to", "clone", "contiguous", "cat", "transpose", "permute"),
}


def kind_of(name: str) -> str:
    op = name.removeprefix("aten::")
    for kind, parts in KINDS.items():
        if any(part in op for part in parts):
            return kind
    return "other"


def profile_system(system: System, steps: int, warmup: int) -> dict:
    """Seconds a step in all, and by kind (own time of each operator, summed)."""
    for _ in range(warmup):
        system.train_step()
    cuda = system.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            system.train_step()
        if cuda:
            torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / steps
    by_kind = dict.fromkeys([*KINDS, "other"], 0.0)
    for event in prof.key_averages():
        if not event.key.startswith("aten::"):
            continue
        own = event.self_device_time_total if cuda else event.self_cpu_time_total
        by_kind[kind_of(event.key)] += own / 1e6 / steps
    return dict(wall=wall, kinds=by_kind)


def table(results: dict[str, dict]) -> str:
    names = list(results)
    lines = ["kind (ms a step)".ljust(22) + "".join(f"{n:>18}" for n in names)]
    kinds = [*KINDS, "other"]
    for kind in kinds:
        cells = []
        for n in names:
            r = results[n]
            ms, share = r["kinds"][kind] * 1e3, r["kinds"][kind] / r["wall"]
            cells.append(f"{ms:9.1f} ({share:5.1%})")
        lines.append(kind.ljust(22) + "".join(f"{c:>18}" for c in cells))
    outside = [results[n]["wall"] - sum(results[n]["kinds"].values()) for n in names]
    lines.append("outside operators".ljust(22) + "".join(f"{o * 1e3:18.1f}" for o in outside))
    lines.append("step, wall".ljust(22) + "".join(f"{results[n]['wall'] * 1e3:18.1f}" for n in names))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, default="cifar", help="as throughput.py's")
    parser.add_argument("--systems", nargs="+", default=["ours"], help="ours, ours+stem, timm, vit-pytorch")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="a batch of 2, one step: seconds")
    args = parser.parse_args(argv)
    if args.smoke:
        args.batch, args.steps, args.warmup = 2, 1, 1
    device = pick_device()
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    cfg = MODELS[args.model]()
    results = {}
    for name in args.systems:
        system = System(name, cfg, args.batch, dtype, device, stem_config=STEM_CONFIGS.get(args.model))
        results[name] = profile_system(system, args.steps, args.warmup)
    print(f"{hardware(device)}; model {args.model}, batch {args.batch}, {args.precision}, {args.steps} steps")
    print(table(results))
    return results


if __name__ == "__main__":
    main()
