"""Validation accuracy against training minutes, one line per run, from vit-train's metrics.csv.

    python tools/accuracy_vs_minutes.py --out docs/cifar10_minutes.png \\
        "time budget, seed 0=studies/cifar10_cpu/cifar10_runs/budget_seed0.csv" \\
        "38 epochs, cut at 30 min=studies/cifar10_cpu/cifar10_runs/fixed38.csv"

Each run is LABEL=PATH to a metrics.csv (its val/acc and time/minutes rows: one per validation),
or LABEL=PATH*FACTOR to draw its minutes times FACTOR: a run on a machine FACTOR times as fast as
another, drawn in that machine's minutes (studies/cifar10_cpu/README.md's AVX2 runs on a faster CPU). Prints
each run's last and best val/acc with the minute they came at.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from matplotlib.figure import Figure


def read_curve(path: Path) -> tuple[list[float], list[float]]:
    """(minutes, val/acc) of every validation in a metrics.csv."""
    with open(path) as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/acc") and r.get("time/minutes")]
    if not rows:
        raise SystemExit(f"error: {path} has no rows with both val/acc and time/minutes")
    return [float(r["time/minutes"]) for r in rows], [float(r["val/acc"]) for r in rows]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="LABEL=PATH of a metrics.csv, or LABEL=PATH*FACTOR")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--title", default="CIFAR-10: validation accuracy against training time")
    args = parser.parse_args(argv)
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.subplots()
    for run in args.runs:
        label, sep, path = run.rpartition("=")
        if not sep or not label:
            raise SystemExit(f"error: {run!r} is not LABEL=PATH")
        path, _, factor = path.partition("*")
        try:
            factor = float(factor or 1)
        except ValueError:
            raise SystemExit(f"error: {run!r}: the factor after * must be a number") from None
        minutes, acc = read_curve(Path(path))
        minutes = [m * factor for m in minutes]
        ax.plot(minutes, acc, marker="o", markersize=3, label=label)
        best = max(range(len(acc)), key=acc.__getitem__)
        last = f"last val/acc {acc[-1]:.4f} at {minutes[-1]:.1f} min"
        print(f"{label}: {last}, best {acc[best]:.4f} at {minutes[best]:.1f} min")
    ax.set(xlabel="minutes of training (validation included)", ylabel="val/acc", title=args.title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
