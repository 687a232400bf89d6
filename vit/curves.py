"""Training curves of vit-train runs: each run's metrics read as series of (step, value), and the
loss and accuracy of several runs drawn against steps, epochs and training minutes in one figure
(`vit-eval curves`).

A run is what vit-train writes, `runs/<name>/version_N/`: Lightning's CSVLogger's `metrics.csv`
(sparse rows, each holding the values logged at its step) or TensorBoard's
`events.out.tfevents.*`, beside the resolved `config.yaml`. Lightning logs at step s from the
(s + 1)-th optimizer step, so a run from the start has done no step at s = -1.

matplotlib and tensorboard are imported inside the functions that need them.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml

from vit.errors import DataError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

EVENTS = "events.out.tfevents.*"
# config keys that differ between runs without changing the training: where each run was written
# (its path says that) and the checkpoint a resumed run started from
IGNORED = re.compile(r"trainer\.logger(\.\d+)?\.init_args\.(save_dir|name|version)|ckpt_path")
# the two rows of the figure: each metric drawn and its line style
ROWS = {
    "loss": {"train/loss": dict(linewidth=0.8, alpha=0.35), "val/loss": dict(linewidth=1.6, marker="o")},
    "accuracy": {
        "val/acc": dict(linewidth=1.6, marker="o"),
        "train/acc": dict(linewidth=1.2, linestyle="--"),
    },
}
STYLES = {"loss": "faint: train, dots: validation", "accuracy": "dots: validation, dashed: train"}
Series = tuple[np.ndarray, np.ndarray]  # (steps, values), in the order logged


@dataclass
class Run:
    """A training run's metrics, each a series of (step, value), and its config."""

    path: Path  # the run's folder, or its CSV file
    label: str  # its name in the figure and the table
    metrics: dict[str, Series]
    config: dict | None  # config.yaml flattened to dotted keys (`flatten`); None where there is none

    def series(self, name: str) -> Series:
        """The metric `name`; empty where the run did not log it."""
        return self.metrics.get(name, (np.array([], dtype=int), np.array([])))

    @property
    def from_start(self) -> bool:
        """Whether the metrics begin in the first epoch (a resumed run's may begin later)."""
        return 0 in self.series("epoch")[1]

    def epochs(self, steps) -> np.ndarray:
        """Fractional epochs at `steps`: epoch e ends at its last logged step (epoch e + 1 there);
        the last epoch logged, which may be under way, goes on at the pace of those before."""
        ends: dict[int, int] = {}
        for step, epoch in zip(*self.series("epoch"), strict=True):
            ends[int(epoch)] = max(ends.get(int(epoch), step), step)
        done = sorted(ends)[:-1] or sorted(ends)
        known = {-1: 0} if self.from_start else {}
        return along(steps, known | {ends[e]: e + 1 for e in done})

    def minutes(self, steps) -> np.ndarray:
        """Training minutes at `steps`, validation included: `time/minutes`, logged at each
        validation (or made from TensorBoard's wall times), linear between them."""
        known = {-1: 0.0} if self.from_start else {}
        return along(steps, known | dict(zip(*self.series("time/minutes"), strict=True)))

    def summary(self) -> dict:
        """The run's figures for runs.json and the table: its best and last val/acc, last
        val/loss, steps, epochs and minutes (None where not logged)."""
        acc_steps, acc = self.series("val/acc")
        last = max((int(steps.max()) for steps, _ in self.metrics.values() if len(steps)), default=-1)
        best = None
        if len(acc):
            i = int(np.argmax(acc))  # the first of equals
            best = {
                "value": float(acc[i]),
                "step": int(acc_steps[i]),
                "epoch": rounded_epoch(self.epochs(acc_steps[i])),
            }
        return {
            "label": self.label,
            "path": str(self.path),
            "best_val_acc": best,
            "last_val_acc": last_value(self.series("val/acc")),
            "last_val_loss": last_value(self.series("val/loss")),
            "steps": last + 1,
            "epochs": rounded_epoch(self.epochs(last)) if last >= 0 else None,
            "minutes": last_value(self.series("time/minutes")),
        }


def last_value(series: Series) -> float | None:
    return float(series[1][-1]) if len(series[1]) else None


def rounded_epoch(value: np.ndarray) -> float | None:
    """A fractional epoch for runs.json, to 3 places; None where the run logged no epochs (NaN)."""
    return round(float(value), 3) if np.isfinite(value) else None


def along(x, known: dict) -> np.ndarray:
    """The values at `x` of the points `known` ({x: y}), linear between them and beyond them at
    the pace of the two nearest; NaN (not drawn) where no point is known."""
    x = np.asarray(x, dtype=float)
    if not known:
        return np.full(x.shape, np.nan)
    xs, ys = np.array(sorted(known), dtype=float), np.array([known[k] for k in sorted(known)], dtype=float)
    y = np.interp(x, xs, ys)
    if len(xs) > 1:
        y = np.where(x < xs[0], ys[0] + (x - xs[0]) * (ys[1] - ys[0]) / (xs[1] - xs[0]), y)
        y = np.where(x > xs[-1], ys[-1] + (x - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), y)
    return y


# ---- reading ----


def natural(path: Path) -> list:
    """A sort key that puts version_2 before version_10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def find_runs(path: Path) -> list[Path]:
    """The runs at `path`: a CSV file (a metrics.csv stands for its folder), a folder holding
    metrics.csv or TensorBoard event files, or each such folder under it, in natural order."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    if path.is_file():
        return [path.parent if path.name == "metrics.csv" else path]
    found = {p.parent for p in [*path.rglob("metrics.csv"), *path.rglob(EVENTS)]}
    return sorted(found, key=natural)


def read_run(path: Path, label: str | None = None, minutes_factor: float = 1.0) -> Run:
    """The run at `path` (a folder of `find_runs`, or a CSV file): its metrics.csv, else its
    TensorBoard events, and its config.yaml where there is one. `minutes_factor` scales its
    minutes: a run of a machine that many times as fast as another, in that machine's minutes."""
    path = Path(path)
    if path.is_file():
        metrics = read_csv(path)
    elif (path / "metrics.csv").is_file():
        metrics = read_csv(path / "metrics.csv")
    elif any(path.glob(EVENTS)):
        metrics = read_events(path)
    else:
        raise DataError(f"{path}: no metrics.csv or TensorBoard events")
    if "time/minutes" in metrics:
        steps, minutes = metrics["time/minutes"]
        metrics["time/minutes"] = (steps, minutes * minutes_factor)
    config = path / "config.yaml" if path.is_dir() else None
    return Run(path, label or path.name, metrics, read_config(config))


def read_csv(path: Path) -> dict[str, Series]:
    """The series of a CSVLogger's metrics.csv, as far as it is written: a last line without its
    line end and a row with fewer fields than the header (a run still writing) are left out, and
    so are rows of a test after training (only test/ figures), whose epoch is one past the last."""
    text = path.read_text()
    text = text[: text.rfind("\n") + 1]  # whole lines only
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return {}
    header = rows[0]
    if "step" not in header:
        raise DataError(f"{path} has no step column: it is not a metrics.csv of Lightning's CSVLogger")
    points: dict[str, list] = {}
    for line, row in enumerate(rows[1:], start=2):
        cells = dict(zip(header, row, strict=False))
        if len(row) != len(header) or not cells["step"]:
            continue
        step = int(number(cells.pop("step"), path, line))
        logged = {name for name, cell in cells.items() if cell and name != "epoch"}
        if logged and all(name.startswith("test/") for name in logged):
            continue  # a test after fit (vit-train test, trainer.test): not a point of training
        for name, cell in cells.items():
            if cell:
                points.setdefault(name, []).append((step, number(cell, path, line)))
    return {name: (np.array([s for s, _ in p]), np.array([v for _, v in p])) for name, p in points.items()}


def number(cell: str, path: Path, line: int) -> float:
    try:
        return float(cell)
    except ValueError:
        raise DataError(f"{path}, line {line}: {cell!r} is not a number") from None


def read_events(folder: Path) -> dict[str, Series]:
    """The scalar series of the TensorBoard event files in `folder`. Without `time/minutes`,
    minutes come from the events' wall times, from the first event."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        needs = 'reading them needs tensorboard (pip install -e ".[tensorboard]")'
        raise DataError(f"{folder} holds TensorBoard events: {needs}") from None
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: every event, not a sample
    events.Reload()
    metrics, wall_times = {}, {}
    for tag in events.Tags()["scalars"]:
        scalars = events.Scalars(tag)
        metrics[tag] = (np.array([e.step for e in scalars]), np.array([e.value for e in scalars]))
        for e in scalars:
            wall_times[e.step] = max(wall_times.get(e.step, e.wall_time), e.wall_time)
    if "time/minutes" not in metrics and wall_times:
        steps = sorted(wall_times)
        start = min(wall_times.values())
        metrics["time/minutes"] = (np.array(steps), np.array([(wall_times[s] - start) / 60 for s in steps]))
    return metrics


def read_config(path: Path | None) -> dict | None:
    """A run's config.yaml flattened to dotted keys; None where there is none."""
    if path is None or not path.is_file():
        return None
    try:
        return flatten(yaml.safe_load(path.read_text()) or {})
    except yaml.YAMLError as e:
        raise DataError(f"{path} is not YAML: {e}") from None


def flatten(config, prefix: str = "") -> dict:
    """{"model": {"init_args": {"lr": 0.003}}} -> {"model.init_args.lr": 0.003}; a list of
    dicts or lists by index (trainer.callbacks.0.class_path), a list of values whole."""
    if isinstance(config, dict) and config:
        items = config.items()
    elif isinstance(config, list) and any(isinstance(item, dict | list) for item in config):
        items = enumerate(config)
    else:
        return {prefix: config}
    flat = {}
    for key, value in items:
        flat |= flatten(value, f"{prefix}.{key}" if prefix else str(key))
    return flat


def config_changes(runs: list[Run]) -> list[dict | None]:
    """Each run's config keys whose values differ from the first run's that has a config, as
    {key: [first's, this run's]}; the keys of IGNORED left out; None for a run without config."""
    first = next((run.config for run in runs if run.config is not None), {})
    changes = []
    for run in runs:
        config = run.config
        if config is None:
            changes.append(None)
            continue
        keys = sorted(k for k in set(first) | set(config) if not IGNORED.fullmatch(k))
        changes.append({k: [first.get(k), config.get(k)] for k in keys if first.get(k) != config.get(k)})
    return changes


def short_labels(paths: list[Path]) -> list[str]:
    """Each path relative to the folder that holds them all (without .csv): short, and unique
    where the paths are."""
    resolved = [Path(p).resolve() for p in paths]
    common = Path(os.path.commonpath(resolved))
    if common in resolved:  # one run, or a run holding another
        common = common.parent
    return [str(p.relative_to(common)).removesuffix(".csv") for p in resolved]


# ---- the table and the figure ----


def runs_table(summaries: list[dict]) -> str:
    """The runs' figures (`Run.summary`, with `config_changes`) as a table to read in a terminal,
    then each run's config differences from the first run's that has a config."""

    def cell(value, places: int = 4) -> str:
        return "-" if value is None else f"{value:.{places}f}"

    def shown(value) -> str:
        return json.dumps(value, default=str)  # null, "cosine", [0.9, 0.999]: strings told from numbers

    width = max(3, *(len(s["label"]) for s in summaries)) + 2
    columns = ("best val/acc (epoch)", "last val/acc", "last val/loss", "epochs", "minutes")
    lines = ["run".ljust(width) + "".join(c.rjust(22 if i == 0 else 15) for i, c in enumerate(columns))]
    for s in summaries:
        best = s["best_val_acc"]
        if best is not None:
            best = f"{best['value']:.4f}" + ("" if best["epoch"] is None else f" ({best['epoch']:.2f})")
        figures = [s["last_val_acc"], s["last_val_loss"]]
        lines.append(
            s["label"].ljust(width)
            + (best or "-").rjust(22)
            + "".join(cell(f).rjust(15) for f in figures)
            + cell(s["epochs"], 2).rjust(15)
            + cell(s["minutes"], 2).rjust(15)
        )
    reference = next((s for s in summaries if s["config_changes"] is not None), None)
    if reference is not None and len(summaries) > 1:
        lines += ["", f"config differences from {reference['label']}:"]
        for s in (s for s in summaries if s is not reference):
            changes = s["config_changes"]
            if changes is None:
                text = "no config.yaml"
            elif not changes:
                text = "the same config"
            else:
                text = ", ".join(f"{k} {shown(a)} -> {shown(b)}" for k, (a, b) in changes.items())
            lines.append(f"  {s['label']}: {text}")
    return "\n".join(line.rstrip() for line in lines)


def curves_figure(runs: list[Run], title: str = "training curves") -> Figure:
    """Loss (top row) and accuracy (bottom row) of `runs` against optimizer steps, fractional
    epochs and training minutes, one colour per run: train/loss faint, val/loss and val/acc with
    a dot at each validation, train/acc dashed. A metric a run did not log is left out."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    palette = matplotlib.colormaps["tab10" if len(runs) <= 10 else "tab20"].colors
    colours = [palette[i % len(palette)] for i in range(len(runs))]
    fig = Figure(figsize=(15, 8.5), layout="constrained")
    axes = fig.subplots(2, 3, sharex="col", sharey="row")
    for run, colour in zip(runs, colours, strict=True):
        for row, metrics in zip(axes, ROWS.values(), strict=True):
            for name, style in metrics.items():
                steps, values = run.series(name)
                for ax, x in zip(row, (steps, run.epochs(steps), run.minutes(steps)), strict=True):
                    ax.plot(x, values, color=colour, markersize=3, **style)
    for ax, what in zip(axes[0], ("optimizer steps", "epochs", "training minutes"), strict=True):
        ax.set_title(f"against {what}", fontsize=10)
    for row, (what, styles) in zip(axes, STYLES.items(), strict=True):
        row[0].set_ylabel(f"{what}\n({styles})")
    xlabels = ("optimizer step", "epoch", "minutes of training (validation included)")
    for ax, label in zip(axes[1], xlabels, strict=True):
        ax.set_xlabel(label)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    handles = [
        Line2D([], [], color=c, linewidth=2, label=run.label) for run, c in zip(runs, colours, strict=True)
    ]
    longest = max(len(run.label) for run in runs)
    columns = max(1, min(len(runs), 200 // (longest + 8)))  # as many as fit across the figure
    fig.legend(handles=handles, loc="outside lower center", ncols=columns, fontsize=9, frameon=False)
    fig.suptitle(title)
    return fig
