"""Where a training step's time goes, by kind of operator: matrix products, attention, softmax,
LayerNorm, GELU, casts and copies, the optimizer, the rest; and what the step would take if its
matmuls alone took time.

    python benchmarks/profile_step.py                                  # ours, the cifar model, bf16
    python benchmarks/profile_step.py --systems ours timm vit-pytorch --precision fp32
    python benchmarks/profile_step.py --top 25          # and torch.profiler's 25 costliest operators
    python benchmarks/profile_step.py --matmuls-alone   # and the step's matmuls replayed alone
    python benchmarks/profile_step.py --smoke                          # toy size, a few seconds

Each system is `benchmarks/throughput.py`'s (the same model, optimizer and batch); `--steps`
training steps run under `torch.profiler` after `--warmup` steps, and each operator's own time
(`self_cpu_time_total`, or CUDA time on a GPU) is put in the first kind whose name it matches.
Time in kernels only: Python and the dispatcher between them are the difference between the
step's wall time and the sum, printed as "outside operators".

`--matmuls-alone` then times each system's step unprofiled, records its matmul calls (forward and
backward: `mm`, `addmm`, `bmm`, SDPA, convolutions) with copies of their inputs in the same sizes
and strides, and replays them back to back: an estimate of what the step would take, with the same
matmul kernels, if nothing else (norms, activations, casts, adds, the optimizer) took time. The
rest is given two ways: the step minus the matmuls alone, and the step times the profile's
non-matmul share. The table ends with the minor page faults a step: memory the allocator took
fresh from the system, every page zeroed on first touch (none, after the first steps, unless
`--system-malloc` leaves glibc's thresholds as they are: vit/memory.py).

    python benchmarks/profile_step.py --compile    # the step through torch.compile (inductor)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: `benchmarks`, `lab` and `vit` import from the checkout

from benchmarks.throughput import (  # noqa: E402
    BUILDERS,
    COMPILE_MODES,
    MODELS,
    PRECISIONS,
    STEM_CONFIGS,
    System,
    add_malloc_option,
    pick_device,
    replay,
    seconds_per_call,
    set_allocator,
)
from lab.machine import hardware  # noqa: E402

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
MATMUL_KINDS = ("attention", "matmul")  # what the replay of --matmuls-alone runs


def kind_of(name: str) -> str:
    op = name.removeprefix("aten::")
    for kind, parts in KINDS.items():
        if any(part in op for part in parts):
            return kind
    return "other"


def profile_system(system: System, steps: int, warmup: int, top: int = 0) -> dict:
    """Seconds a step in all, and by kind (own time of each operator, summed); with `top`, prints
    torch.profiler's table of that many operators, the costliest first."""
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
    averages = prof.key_averages()
    if top:
        sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        print(f"{system.name}:\n{averages.table(sort_by=sort, row_limit=top)}")
    by_kind = dict.fromkeys([*KINDS, "other"], 0.0)
    for event in averages:  # aten's operators, and the kernels inductor wrote for a compiled step
        if not event.key.startswith("aten::") and "cpp_fused" not in event.key:
            continue
        own = event.self_device_time_total if cuda else event.self_cpu_time_total
        by_kind[kind_of(event.key)] += own / 1e6 / steps
    return dict(wall=wall, kinds=by_kind)


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


def page_faults_per_step(system: System, steps: int = 3, warmup: int = 3) -> float:
    """Minor page faults per training step, after `warmup` steps (the first makes the optimizer's
    state, the second still grows the heap): memory the allocator takes fresh from the OS (every
    page is zeroed on first touch). Linux and macOS."""
    import resource

    for _ in range(warmup):
        system.train_step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        system.train_step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps


def matmul_report(system: System, profiled: dict) -> dict:
    """The step unprofiled, its matmuls alone, and two estimates of everything else: the step
    minus the matmuls alone, and the step times the non-matmul share of the profile."""
    step, alone, count = matmuls_alone(system)
    share = sum(profiled["kinds"][kind] for kind in MATMUL_KINDS) / profiled["wall"]
    return dict(step=step, alone=alone, calls=count, rest_by_share=step * (1 - share))


def format_report(name: str, batch: int, report: dict) -> str:
    step, alone = report["step"], report["alone"]
    return "\n".join(
        [
            f"{name}: unprofiled step: {step * 1e3:.1f} ms = {batch / step:.1f} img/s",
            f"  its {report['calls']} matmul calls alone, back to back: {alone * 1e3:.1f} ms = "
            f"{batch / alone:.1f} img/s if nothing else took time",
            f"  everything else: {(step - alone) * 1e3:.1f} ms (step - matmuls alone), "
            f"{report['rest_by_share'] * 1e3:.1f} ms (step x the profile's non-matmul share)",
        ]
    )


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
    lines.append("page faults a step".ljust(22) + "".join(f"{results[n]['faults']:18.0f}" for n in names))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, default="cifar", help="as throughput.py's")
    parser.add_argument("--systems", nargs="+", default=["ours"], choices=list(BUILDERS))
    parser.add_argument("--precision", choices=list(PRECISIONS), default="bf16")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--top", type=int, default=0, metavar="N", help="print the N costliest operators")
    parser.add_argument("--matmuls-alone", action="store_true", help="time the step's matmuls replayed alone")
    parser.add_argument(
        "--compile", nargs="?", const="default", metavar="MODE", choices=COMPILE_MODES,
        help="profile the step through torch.compile, in this mode; inductor's fused C++ kernels are "
        "put in the first kind their name contains (cpp_fused_gelu_gelu_backward: gelu)",
    )  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="a batch of 2, one step: seconds")
    add_malloc_option(parser)
    args = parser.parse_args(argv)
    if args.compile and args.matmuls_alone:
        parser.error("--matmuls-alone replays eager matmuls; a compiled step runs other kernels")
    allocator = set_allocator(args.system_malloc)
    if args.compile:  # name each fused kernel in the profile (else its time is its graph's)
        torch._inductor.config.cpp.enable_kernel_profile = True
    if args.smoke:
        args.batch, args.steps, args.warmup = 2, 1, 1
    device = pick_device()
    cfg = MODELS[args.model]()
    results = {}
    for name in args.systems:
        system = System(name, cfg, args.batch, PRECISIONS[args.precision], device, args.compile,
                        stem_config=STEM_CONFIGS.get(args.model))  # fmt: skip
        faults = page_faults_per_step(system)  # before the profiler, whose own memory would count
        results[name] = dict(faults=faults, **profile_system(system, args.steps, args.warmup, args.top))
        if args.matmuls_alone:  # after the profile: the recorded copies would weigh on it
            results[name]["matmuls_alone"] = matmul_report(system, results[name])
    compiled = f"torch.compile mode {args.compile}" if args.compile else "eager"
    print(f"{hardware(device)}; model {args.model}, batch {args.batch}, {args.precision}, {args.steps} steps")
    print(f"{compiled}; allocator: {allocator}")
    print(table(results))
    for name, result in results.items():
        if "matmuls_alone" in result:
            print(format_report(name, args.batch, result["matmuls_alone"]))
    return results


if __name__ == "__main__":
    main()
