"""`vit-eval curves`: the loss and accuracy of training runs in one figure, and a table of them.

    vit-eval curves runs/two_circles                           # each version_N under it
    vit-eval curves runs/a/version_0 runs/b/version_2 --out compare
    vit-eval curves "bf16=runs/a/version_0" "fp32, in the faster machine's minutes=runs/b.csv*0.72"

A RUN is a folder vit-train wrote (its metrics.csv or TensorBoard events), a folder above such
folders (each one under it is a run), or a metrics CSV file; `LABEL=` names it in the figure
(default: its path from the folder that holds all the runs) and `*FACTOR` scales its minutes. The
reading and drawing are `vit.curves`; this command finds the runs, prints the table and writes
curves.png and runs.json. A folder with no metrics is left out with a line on stderr; without any
run the command stops with one line `error: ...` and writes nothing.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from vit.commands.base import Command, check_out_folder, option, out_option, write_outputs
from vit.errors import DataNotFoundError, UsageError


@dataclass
class CurvesOptions:
    """The options of vit-eval curves: the runs, where the figure and table go, its title."""

    runs: list[str] | None = option(
        None,
        "a run folder of vit-train, a folder above run folders, or a metrics CSV file; as LABEL=RUN to "
        "name it, RUN*FACTOR to draw its minutes times FACTOR (a run of a machine FACTOR times as fast)",
        positional=True,
        nargs="+",
        metavar="RUN",
    )
    out: str = out_option("curves", "curves.png and runs.json")
    title: str = option("training curves", "the figure's title", metavar="TEXT")


def parse_run(spec: str) -> tuple[str | None, Path, float]:
    """A RUN argument as (label, path, minutes factor): LABEL=PATH*FACTOR, label and factor
    optional; an argument that names an existing path is that path, whatever it holds."""
    label, path, factor = None, spec, "1"
    if not Path(path).exists() and "=" in path:
        label, _, path = path.partition("=")
    if not Path(path).exists() and "*" in path:
        path, _, factor = path.rpartition("*")
    try:
        factor = float(factor)
    except ValueError:
        raise UsageError(f"{spec!r}: the factor after * must be a number") from None
    if factor <= 0:
        raise UsageError(f"{spec!r}: the factor after * must be above 0")
    return label or None, Path(path), factor


def curves(options: CurvesOptions) -> list[dict]:
    """Read the runs of `options.runs`, print their table, write curves.png and runs.json into
    `options.out`; returns the runs' summaries (runs.json)."""
    from vit.curves import config_changes, curves_figure, find_runs, read_run, runs_table, short_labels

    if not options.runs:
        raise UsageError("give at least one run folder")
    check_out_folder(options.out)
    chosen = []  # (path, label, minutes factor) of each run
    for spec in options.runs:
        label, path, factor = parse_run(spec)
        found = find_runs(path)
        if not found:
            print(f"{path}: no metrics.csv or TensorBoard events; left out", file=sys.stderr)
        for run in found:
            named = label if label is None or len(found) == 1 else f"{label}/{run.relative_to(path)}"
            chosen.append((run, named, factor))
    if not chosen:
        raise DataNotFoundError("no run to draw: no metrics.csv or TensorBoard events in the folders given")
    labels = short_labels([path for path, _, _ in chosen])
    runs = [
        read_run(path, named or short, factor)
        for (path, named, factor), short in zip(chosen, labels, strict=True)
    ]
    summaries = []
    for run, changes, (_, _, factor) in zip(runs, config_changes(runs), chosen, strict=True):
        summaries.append(run.summary() | {"minutes_factor": factor, "config_changes": changes})
    print(runs_table(summaries))
    print()
    files = {
        "curves.png": curves_figure(runs, options.title),
        "runs.json": json.dumps(summaries, indent=2, default=str) + "\n",
    }
    write_outputs(options.out, files)
    return summaries


COMMAND = Command(
    prog="vit-eval curves",
    description=(
        "Compare training runs of vit-train in one figure: loss and accuracy against optimizer steps, "
        "epochs and training minutes, one colour per run, read from each run's metrics.csv or "
        "TensorBoard events. Prints a table (best and last val/acc, last val/loss, epochs, minutes, "
        "each run's config differences from the first run's) and writes curves.png and runs.json."
    ),
    options=CurvesOptions,
    function=curves,
)
