"""Where one training step of a system goes: torch.profiler's table of the top operators.

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
    print(prof.key_averages().table(sort_by=sort, row_limit=args.rows))


if __name__ == "__main__":
    main()
