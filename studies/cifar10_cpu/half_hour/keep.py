"""Lay a sweep's finished runs out as the half-hour study commits them, one folder a run.

`benchmarks/gpu_sweep.py --out OUT` leaves, for each variant, its table and JSON (`OUT/sweep.md`,
`OUT/sweep.json`), its evaluation (`OUT/eval/<variant>/metrics.json`) and its log
(`OUT/runs/<variant>/version_0/metrics.csv`). This copies each finished variant's into
`<variant>_seed<S>/` beside this file (or `--into`): the sweep's table, its JSON cut to that
variant, the evaluation and the log, which `figure.py` reads. A folder that exists already is
refused, and nothing is written unless every file of every run is there.

    python -m studies.cifar10_cpu.half_hour.keep runs/half_hour_s2
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

HERE = Path(__file__).parent


def plan(out: Path, into: Path) -> tuple[dict[Path, dict[str, Path | dict]], dict[str, str]]:
    """{folder: {file name: the file to copy, or the JSON to write}} for each finished run of the
    sweep in `out`, and {variant: its status} for those not finished; SystemExit with one line when
    a run's file is missing or its folder exists."""
    if not (out / "sweep.json").is_file():
        raise SystemExit(f"{out} holds no sweep.json: give a folder benchmarks/gpu_sweep.py --out wrote")
    sweep = json.loads((out / "sweep.json").read_text())
    folders: dict[Path, dict[str, Path | dict]] = {}
    unfinished: dict[str, str] = {}
    for name, variant in sweep["variants"].items():
        if variant["status"] != "ok":
            unfinished[name] = variant["status"]
            continue
        folder = into / f"{name}_seed{sweep['seed']}"
        if folder.exists():
            raise SystemExit(f"{folder} exists already: move it away to keep {out}'s {name} there")
        files = {
            "sweep.md": out / "sweep.md",
            "metrics.json": out / "eval" / name / "metrics.json",
            "metrics.csv": out / "runs" / name / "version_0" / "metrics.csv",
        }
        for path in files.values():
            if not path.is_file():
                raise SystemExit(f"{path} is missing: {name} of {out} cannot be kept")
        folders[folder] = {**files, "sweep.json": {**sweep, "variants": {name: variant}}}
    return folders, unfinished


def keep(out: Path, into: Path = HERE) -> list[Path]:
    """Copy the finished runs of the sweep in `out` into `into`; returns their folders."""
    folders, unfinished = plan(out, into)
    for folder, files in folders.items():
        folder.mkdir(parents=True)
        for name, source in files.items():
            if isinstance(source, dict):
                (folder / name).write_text(json.dumps(source, indent=1) + "\n")
            else:
                shutil.copyfile(source, folder / name)
        print(f"kept {folder}")
    for name, status in unfinished.items():
        print(f"{name}: not kept ({status})")
    return list(folders)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder benchmarks/gpu_sweep.py --out wrote")
    parser.add_argument("--into", type=Path, default=HERE, help="where the run folders go; default here")
    args = parser.parse_args(argv)
    keep(args.out, args.into)


if __name__ == "__main__":
    main()
