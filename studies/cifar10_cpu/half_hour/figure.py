"""The half-hour study's table and figure, from the runs committed beside this file.

Each ViT run is a folder `<variant>_seed<S>/` holding what `benchmarks/gpu_sweep.py` wrote for it
(`sweep.json`, with its test top-1, and the run's `metrics.csv`; `keep.py` lays a sweep's runs out
so); each CNN peer run is `cnn_peer_cpu_seed<S>.json` (`benchmarks/cnn_peer_cpu.py --json`). The
first table gives each run (epochs, images a second, the last full epoch's train/acc, the last val/acc, test
top-1), the second each variant's test top-1 at the end of its 30 minutes over the seeds measured
(min / median / max); the figure draws accuracy against minutes of training: each ViT run's
validation accuracy after each epoch, the CNN peer's test accuracy at the moments it reported,
and every run's final test top-1. Its title names the CPUs the runs recorded.

    python -m studies.cifar10_cpu.half_hour.figure   # writes accuracy_minutes.png, prints the tables
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from vit.curves import read_run
from vit.plot import save_figure

HERE = Path(__file__).parent
# the variants in the figure's order, with their labels
LABELS = {
    "cnn_peer": "CNN peer (airbench94's network and schedule)",
    "recipe": "ViT: configs/cifar10_cpu.yaml",
    "depth0": "configs/cifar10_cpu.yaml at depth 0",
    "depth1": "configs/cifar10_cpu.yaml with one block",
    "depth1_mlp1": "one block, its MLP as wide as the tokens",
    "depth1_dim128": "one block, 128 channels",
    "sgd_lr03": "ViT: SGD-Nesterov, lr 0.3",
    "sgd_lr1": "ViT: SGD-Nesterov, lr 1.0",
    "levers": "ViT: Muon, whitened stem",
    "levers_depth0": "the same without its blocks (depth 0)",
    "levers_trivial": "ViT: Muon, whitened stem, TrivialAugment",
    "levers_teacher": "ViT: Muon, whitened stem, CNN teacher (its 11 minutes first)",
    "airbench_cnn": "airbench94's network, the ViT's training",
    "wide_stem": "ViT: Muon, whitened stem of 64-256 channels",
    "wide_stem_depth0": "the wide stem without the blocks",
    "airbench_stem": "ViT: airbench94's first two blocks as the stem, 64 tokens",
    "airbench_stem_depth0": "airbench94's first two blocks without the ViT's",
    "airbench_cnn_stem": "ViT: airbench94's three blocks as the stem, 16 tokens",
    "airbench_cnn_stem_depth0": "airbench94's three blocks without the ViT's",
    "peer_sgd_lr03": "ViT: the peer's training (SGD lr 0.3, batches of 1,024)",
    "peer_sgd_lr08_warm20": "the same at lr 0.8, a 20% warm-up",
    "airbench_cnn_peer_lr05": "airbench94's network, the peer's SGD (lr 0.5), batches of 1,024",
    "airbench_cnn_peer_schedule": "the same, airbench's schedule, translations and flips",
    "airbench_cnn_peer_whiten": "the same, its first layer whitened and frozen",
    "recipe_airbench_schedule": "ViT: airbench's schedule, translations and flips",
}
RUN = re.compile(r"(?P<variant>.+)_seed(?P<seed>\d+)")


def last_full_epoch(steps, values) -> float | None:
    """The value logged at the end of the last epoch that ran all its steps: a value logged once an
    epoch at `steps` (a run's last epoch is often a stub of a few steps, cut by its time budget).
    An epoch is full when its steps are as many as the longest epoch's."""
    if len(steps) == 0:
        return None
    spans = [int(steps[0]) + 1] + [int(b - a) for a, b in zip(steps[:-1], steps[1:], strict=True)]
    longest = max(spans)
    full = [i for i, span in enumerate(spans) if span == longest]
    return float(values[full[-1]])


def read_runs(folder: Path) -> dict[str, dict[int, dict]]:
    """{variant: {seed: {"top1", "curve": (minutes, accuracy), "curve_of", "epochs",
    "images_per_second", "train_acc", "val_acc", "cpu"}}} of the runs in `folder` (train_acc and
    val_acc None for the peer). A ViT's curve is its validation accuracy after each epoch; the
    peer's its test top-1 at each report (of one 30-minute schedule, not of shorter schedules)."""
    runs: dict[str, dict[int, dict]] = {}
    for path in sorted(folder.glob("cnn_peer_cpu_seed*.json")):
        peer = json.loads(path.read_text())
        for run in peer["runs"]:
            reports = run["reports"]
            runs.setdefault("cnn_peer", {})[run["seed"]] = {
                "top1": reports[-1]["acc"],
                "curve": ([r["minutes"] for r in reports], [r["acc"] for r in reports]),
                "curve_of": "test",
                "epochs": run["epochs"],
                "images_per_second": run["epochs"] * peer["images"]["train"] / run["seconds"],
                "train_acc": None,
                "val_acc": None,
                "cpu": peer["hardware"].split(";")[0],
            }
    for path in sorted(p for p in folder.iterdir() if p.is_dir() and (p / "sweep.json").is_file()):
        match = RUN.fullmatch(path.name)
        if match is None:
            continue
        sweep = json.loads((path / "sweep.json").read_text())
        (variant,) = sweep["variants"].values()  # one variant a folder
        run = read_run(path)
        steps, acc = run.series("val/acc")
        runs.setdefault(match["variant"], {})[int(match["seed"])] = {
            "top1": variant["test_top1"],
            "curve": (list(run.minutes(steps)), list(acc)),
            "curve_of": "validation",
            "epochs": variant["epochs"],
            "images_per_second": variant["images_per_second"],
            "train_acc": last_full_epoch(*run.series("train/acc")),
            "val_acc": variant["val_acc"],
            "cpu": sweep["environment"]["cpu"],
        }
    return runs


def ordered(runs: dict) -> list[str]:
    """The variants of `runs` in LABELS' order, any others after them."""
    return sorted(runs, key=lambda v: list(LABELS).index(v) if v in LABELS else len(LABELS))


def runs_table(runs: dict[str, dict[int, dict]]) -> str:
    """A Markdown table of every run: its epochs, images a second, the last full epoch's train/acc
    (an augmented batch's accuracy), its last val/acc and its test top-1."""

    def cell(value, form: str) -> str:
        return "" if value is None else format(value, form)

    lines = [
        "| run | seed | epochs | images/s | train/acc | last val/acc | test top-1 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for variant in ordered(runs):
        for seed, run in sorted(runs[variant].items()):
            lines.append(
                f"| `{variant}` | {seed} | {run['epochs']:.4g} | {run['images_per_second']:,.0f} "
                f"| {cell(run['train_acc'], '.3f')} | {cell(run['val_acc'], '.4f')} | {run['top1']:.4f} |"
            )
    return "\n".join(lines)


def title_of(runs: dict[str, dict[int, dict]]) -> str:
    """The figure's title: the CPUs the runs recorded, in their order of first appearance."""
    cpus = list(dict.fromkeys(run["cpu"] for variant in ordered(runs) for run in runs[variant].values()))
    return f"CIFAR-10 in 30 minutes on {' and '.join(cpus) or 'no run'}"


def table(runs: dict[str, dict[int, dict]]) -> str:
    """A Markdown table: each variant's seeds and its test top-1 min / median / max."""
    lines = [
        "| run | seeds | test top-1 min / median / max | each seed |",
        "|---|---|---|---|",
    ]
    for variant in ordered(runs):
        by_seed = runs[variant]
        top1 = [by_seed[s]["top1"] for s in sorted(by_seed)]
        spread = f"{min(top1):.4f} / {statistics.median(top1):.4f} / {max(top1):.4f}"
        each = ", ".join(f"{s}: {by_seed[s]['top1']:.4f}" for s in sorted(by_seed))
        lines.append(f"| `{variant}` | {len(top1)} | {spread} | {each} |")
    return "\n".join(lines)


def figure(runs: dict[str, dict[int, dict]], title: str):
    """Accuracy against minutes of training: a line per run, a dot at each run's final test top-1."""
    import matplotlib
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    palette = matplotlib.colormaps["tab10"].colors
    for i, variant in enumerate(ordered(runs)):
        colour, by_seed = palette[i % len(palette)], runs[variant]
        # past ten variants the colours come round again: the line's style and the end's marker change
        style, end = (("-", "o"), ("--", "s"), (":", "^"))[i // len(palette) % 3]
        curve_of = next(iter(by_seed.values()))["curve_of"]
        label = f"{LABELS.get(variant, variant)} ({curve_of}; {len(by_seed)} seed{'s' * (len(by_seed) > 1)})"
        marker = "." if curve_of == "test" else None  # the peer's few reports
        for seed in sorted(by_seed):
            run = by_seed[seed]
            ax.plot(
                *run["curve"],
                color=colour,
                linestyle=style,
                linewidth=1.2,
                alpha=0.8,
                marker=marker,
                label=label,
            )
            label = None  # one legend entry a variant
            ax.plot([30], [run["top1"]], marker=end, color=colour, markersize=5)
    ax.set_xlabel("minutes of training (validation included)")
    ax.set_ylabel("top-1 accuracy")
    ax.set_xlim(0, 31)
    ax.set_ylim(0.5, 0.95)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right", title="dots at 30: test top-1 at the end", title_fontsize=8)
    return fig


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=HERE, help="the folder of runs; default this one")
    parser.add_argument("--out", type=Path, default=HERE / "accuracy_minutes.png", help="the figure")
    parser.add_argument("--title", help="the figure's title; default: the CPUs the runs recorded")
    args = parser.parse_args(argv)
    runs = read_runs(args.runs)
    print(runs_table(runs), table(runs), sep="\n\n")
    save_figure(figure(runs, args.title or title_of(runs)), args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
