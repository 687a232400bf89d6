"""Does a config's result hold for every seed? Train it once per seed, as a user would, and report
val/acc per epoch and test top-1 on the best checkpoint for each, with min, median and max.

    python tools/demo_seeds.py --out studies/demo_seeds/demo     # the demo config, seeds 0-9
    python tools/demo_seeds.py --seeds 1 2 3 --out /tmp/probe -- --model.lr 0.002  # a probe
    python tools/demo_seeds.py --table studies/demo_seeds/demo   # print a finished run's table

Each seed is `vit-train fit --config CONFIG --seed_everything N [options after --]` in this
process, then a test of its best.ckpt (the `make demo` pair `vit-train fit` + `vit-eval`, without
two Python start-ups). `--seed_everything` seeds the initialisation and the batch order; the two
circles themselves are drawn from the data module's own seed, the same images for every seed.
Writes OUT/results.json (one record per seed, added as each run ends, so a stopped run keeps what it
finished; a rerun skips seeds already there) and OUT/table.md; the runs' logs and checkpoints go
to runs/demo_seeds/NAME, NAME being OUT's last part.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: `lab` and `vit` import from the checkout

from lab.machine import cpu_name  # noqa: E402
from vit.commands.train import run  # noqa: E402
from vit.curves import read_run  # noqa: E402


def train_and_test(config: str, seed: int, runs: Path, options: list[str]) -> dict:
    """One seed: fit, then test the best checkpoint; its figures."""
    logger = [
        "--trainer.logger.init_args.save_dir",
        str(runs.parent),
        "--trainer.logger.init_args.name",
        runs.name,
    ]
    args = ["fit", "--config", config, "--seed_everything", str(seed), *logger]
    args += ["--trainer.logger.init_args.version", f"seed_{seed}", "--trainer.enable_progress_bar", "false"]
    start = time.perf_counter()
    cli = run([*args, *options])
    seconds = time.perf_counter() - start
    (result,) = cli.trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path="best", verbose=False)
    return dict(
        seed=seed,
        val_acc=read_run(Path(cli.trainer.logger.log_dir)).series("val/acc")[1].tolist(),  # after each epoch
        test_acc=result["test/acc"],
        fit_seconds=round(seconds, 1),
    )


def summary(values: list[float]) -> str:
    return f"{min(values):.4f} / {statistics.median(values):.4f} / {max(values):.4f}"


def table(results: dict) -> str:
    runs = sorted(results["runs"], key=lambda r: r["seed"])
    tests = [r["test_acc"] for r in runs]
    options = " ".join(results["options"]) or "(none)"
    lines = [
        f"`{results['config']}`, options: `{options}`; {results['machine']}",
        "",
        "| seed | test top-1 | val/acc per epoch | fit seconds |",
        "|---|---|---|---|",
        *(
            f"| {r['seed']} | {r['test_acc']:.4f} | {', '.join(f'{a:.3f}' for a in r['val_acc'])} | "
            f"{r['fit_seconds']:.0f} |"
            for r in runs
        ),
        "",
        f"test top-1 over {len(runs)} seeds, min / median / max: **{summary(tests)}**; "
        f"{sum(t >= 0.99 for t in tests)} of {len(runs)} at >= 0.99",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="configs/two_circles.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--out", type=Path, default=Path("studies/demo_seeds/demo"))
    parser.add_argument(
        "--runs", type=Path, help="the runs' logs and checkpoints (runs/demo_seeds/NAME of OUT)"
    )
    parser.add_argument("--table", type=Path, help="print the table of a finished OUT and stop")
    parser.add_argument("options", nargs="*", help="vit-train options for every seed, after --")
    args = parser.parse_args(argv)
    if args.table is not None:
        print(table(json.loads((args.table / "results.json").read_text())), end="")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    results = dict(config=args.config, options=args.options, machine=cpu_name(), runs=[])
    if path.exists():
        results = json.loads(path.read_text())
        if (results["config"], results["options"]) != (args.config, args.options):
            raise SystemExit(f"{path} holds another config or options; choose another --out")
    done = {r["seed"] for r in results["runs"]}
    for seed in args.seeds:
        if seed in done:
            continue
        record = train_and_test(
            args.config, seed, args.runs or Path("runs/demo_seeds") / args.out.name, args.options
        )
        results["runs"].append(record)
        path.write_text(json.dumps(results, indent=1) + "\n")
        print(f"seed {seed}: test top-1 {record['test_acc']:.4f}, val/acc {record['val_acc']}", flush=True)
    (args.out / "table.md").write_text(table(results))
    print(table(results), end="")


if __name__ == "__main__":
    main()
