"""Where one training step of a system goes: torch.profiler's top operators, then the step's time
split into matmuls (attention and convolutions included), GELU, LayerNorm, copies and casts, and
the rest; then the step's matmuls alone, replayed back to back, for an estimate of what the step
would take if nothing else took time.

python -m benchmarks.profile_step --system ours --precision bf16
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial

from torch.profiler import ProfilerActivity, profile

from benchmarks.throughput import (
    BUILDERS,
    CONFIG,
    MATMULS,
    PRECISIONS,
    System,
    pick_device,
    replay,
    seconds_per_call,
)


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
        totals = breakdown(averages, args.steps)
        print(format_breakdown(totals))
        print(matmul_report(system, args.batch, totals["matmul"] / sum(totals.values())))


# Operator-name fragments per category, checked in order; self times, so nothing is counted twice.
CATEGORIES = {
    "matmul": MATMULS,
    "GELU": ("gelu",),
    "LayerNorm": ("layer_norm",),
    "copies and casts": ("aten::copy_", "aten::_to_copy", "aten::cat"),
}


def breakdown(averages, steps: int) -> dict[str, float]:
    """Milliseconds per step by category of operator (self CPU time)."""
    totals = dict.fromkeys([*CATEGORIES, "everything else"], 0.0)
    for event in averages:
        category = next(
            (c for c, parts in CATEGORIES.items() if any(p in event.key for p in parts)), "everything else"
        )
        totals[category] += event.self_cpu_time_total / 1e3 / steps
    return totals


def format_breakdown(totals: dict[str, float]) -> str:
    step = sum(totals.values())
    lines = [f"{name:<18} {ms:7.1f} ms  {ms / step:6.1%}" for name, ms in totals.items()]
    return "\n".join([f"one step: {step:.1f} ms (self time of each operator on the calling thread)", *lines])


def matmuls_alone(system: System, rounds: int = 7) -> tuple[float, float, int]:
    """Seconds per training step, seconds for the same step's matmuls alone run back to back, and
    their number (medians over `rounds`). The second estimates what the step would take, with
    the same matmul kernels, if every other operator (norms, activations, softmax, casts, adds,
    the optimizer) took no time. An estimate, not a bound: inside the step a matmul may find its
    inputs in cache or not, and replayed ones too (the two differed by -11% to +4% in one run here)."""
    device = system.device
    steps = [seconds_per_call(system.train_step, 1, device) for _ in range(rounds)]
    calls = system.matmul_calls()  # the recorded inputs are taken after the steps were timed
    replay(calls)
    alone = [seconds_per_call(partial(replay, calls), 1, device) for _ in range(rounds)]
    return statistics.median(steps), statistics.median(alone), len(calls)


def page_faults_per_step(system: System, steps: int = 3) -> float:
    """Minor page faults per training step, after one step to warm up: memory the allocator takes
    fresh from the OS (every page is zeroed on first touch). Linux and macOS."""
    import resource

    system.train_step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        system.train_step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps


def matmul_report(system: System, batch: int, profiled_share: float) -> str:
    """The step unprofiled, its matmuls alone, and two estimates of everything else: the step
    minus the matmuls alone, and the step times the non-matmul share of the profile."""
    faults = page_faults_per_step(system)
    step, alone, count = matmuls_alone(system)
    return "\n".join(
        [
            f"minor page faults per step: {faults:.0f}",
            f"unprofiled step: {step * 1e3:.1f} ms = {batch / step:.1f} img/s",
            f"its {count} matmul calls alone, back to back: {alone * 1e3:.1f} ms = "
            f"{batch / alone:.1f} img/s if nothing else took time",
            f"everything else: {(step - alone) * 1e3:.1f} ms (step - matmuls alone), "
            f"{step * (1 - profiled_share) * 1e3:.1f} ms (step x the profile's non-matmul share)",
        ]
    )


if __name__ == "__main__":
    main()
