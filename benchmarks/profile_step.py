"""Where one training step of a system goes: torch.profiler's top operators, then the step's time
split into matmuls (attention included), GELU, LayerNorm, copies and casts, and the rest.

python benchmarks/profile_step.py --system ours --precision bf16
"""

from __future__ import annotations

import argparse

from torch.profiler import ProfilerActivity, profile

from benchmarks.throughput import BUILDERS, CONFIG, PRECISIONS, System, pick_device


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="ours", choices=list(BUILDERS))
    parser.add_argument("--precision", default="bf16", choices=list(PRECISIONS))
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=25)
    args = parser.parse_args(argv)
    device = pick_device()
    system = System(args.system, CONFIG, args.batch, PRECISIONS[args.precision], device)
    for _ in range(3):
        system.train_step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            system.train_step()
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    averages = prof.key_averages()
    print(averages.table(sort_by=sort, row_limit=args.rows))
    if device.type == "cpu":
        print(breakdown(averages, args.steps))


# Operator-name fragments per category, checked in order; self times, so nothing is counted twice.
CATEGORIES = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "scaled_dot_product"),
    "GELU": ("gelu",),
    "LayerNorm": ("layer_norm",),
    "copies and casts": ("aten::copy_", "aten::_to_copy", "aten::cat"),
}


def breakdown(averages, steps: int) -> str:
    """Milliseconds per step by category of operator (self CPU time)."""
    totals = dict.fromkeys([*CATEGORIES, "everything else"], 0.0)
    for event in averages:
        category = next(
            (c for c, parts in CATEGORIES.items() if any(p in event.key for p in parts)), "everything else"
        )
        totals[category] += event.self_cpu_time_total / 1e3 / steps
    step = sum(totals.values())
    lines = [f"{name:<18} {ms:7.1f} ms  {ms / step:6.1%}" for name, ms in totals.items()]
    return "\n".join([f"one step: {step:.1f} ms (self time of each operator on the calling thread)", *lines])


if __name__ == "__main__":
    main()
