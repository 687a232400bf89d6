"""A sweep of recipe variants on one GPU: each trained for a fixed number of epochs, several at once.

    python benchmarks/gpu_sweep.py --data .gpu/cifar10-jpeg.pack --out /tmp/sweep --deadline 540
    python benchmarks/gpu_sweep.py --smoke --out runs/gpu_sweep   # any CPU, under a minute: toy sizes
    python benchmarks/gpu_sweep.py --proxy --data ../shared/data/cifar10-jpeg --parallel 1 --out runs/proxy

`--variants` (default benchmarks/gpu_sweep.yaml) maps a name to `vit-train fit` overrides; `--only`
runs some of them (a study keeps all its variants in one file). Each variant trains `--config`
(configs/cifar10_gpu.yaml) for `--epochs` epochs with no time budget, so that its schedule spans
the epochs, eagerly (not compiled), validating after each epoch; then vit-eval measures its last
checkpoint on the test split. `--parallel` variants run at once, each its own process on the same
GPU (so their speeds share it); the rest queue. At `--deadline` seconds from the start, running
variants are stopped (SIGTERM, then SIGKILL after 10 s) and reported with what their metrics.csv
holds so far; those not started are listed as such. Writes `sweep.md` (one row a variant, then
val/acc by epoch) and `sweep.json` (everything, with the commands and the machine) into `--out`,
also on Ctrl-C; each variant's output goes to `--out/logs/<variant>.log`.

`--proxy` ranks the variants on a CPU before a GPU call spends minutes on them: the recipe's
network at a quarter of its width (`PROXY`), on a fifth of each epoch's batches, 5 epochs by
default, on the real data. A variant that loses there may still win at the GPU's 50-100 epochs
(regularisation pays late), so the ranking orders the GPU's queue; it decides nothing.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: `benchmarks` and `vit` import from the checkout

from benchmarks.gpu_check import (  # noqa: E402
    SMOKE_DATA,
    batch_size,
    command_env,
    environment,
    prepare_data,
    python,
    smoke_for,
)

# the CPU proxy: the recipe's network at a quarter of its width and half its depth, batch 128, a
# fifth of each epoch's batches (9,000 images), validated on all 5,000
PROXY = [
    "--model.vit.dim", "96", "--model.vit.heads", "3", "--model.vit.depth", "3",
    "--model.vit.conv_stem", "[24, 48, 96]", "--data.init_args.batch_size", "128",
    "--trainer.limit_train_batches", "0.2",
]  # fmt: skip
# validation after every epoch: val/acc by epoch, whatever interval the config validates at
EVERY_EPOCH = ["--trainer.val_check_interval", "1.0", "--trainer.check_val_every_n_epoch", "1"]
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a variant's name names its files


def read_variants(path: Path) -> dict[str, list[str]]:
    import yaml

    if not path.is_file():
        raise SystemExit(f"error: --variants {path}: no such file")
    try:
        variants = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SystemExit(f"error: --variants {path} is not YAML: {' '.join(str(e).split())}") from e
    if not isinstance(variants, dict) or not variants:
        raise SystemExit(f"error: --variants {path} must map each variant's name to a list of overrides")
    for name, overrides in variants.items():
        if not (isinstance(name, str) and NAME.fullmatch(name)):
            raise SystemExit(f"error: --variants {path}: the name {name!r} must be letters, digits, . _ -")
        if not (isinstance(overrides, list) and all(isinstance(a, str) for a in overrides)):
            raise SystemExit(f"error: --variants {path}: {name}: give a list of strings (quote numbers)")
    return variants


def read_run(run_dir: Path) -> dict:
    """What a run's metrics.csv holds so far: val/acc by epoch, steps, epochs, training seconds (and,
    once training has ended, the seconds of validation and checkpoints among them)."""
    if not (run_dir / "metrics.csv").is_file():
        return {}
    rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
    val = {int(r["epoch"]): float(r["val/acc"]) for r in rows if r.get("val/acc") and r.get("epoch")}
    minutes = [float(r["time/minutes"]) for r in rows if r.get("time/minutes")]
    stepped = [int(r["step"]) + 1 for r in rows if r.get("epoch") and r.get("step")]  # logged after a step
    return dict(
        val_acc_by_epoch=val,
        val_acc=val[max(val)] if val else None,
        steps=max(stepped, default=0),
        epochs=max((int(r["epoch"]) + 1 for r in rows if r.get("epoch")), default=0),
        train_seconds=minutes[-1] * 60 if minutes else None,  # the clock at the last validation
        paused_seconds=next(
            (float(r["time/paused_seconds"]) for r in rows if r.get("time/paused_seconds")), None
        ),
    )


def threads(parallel: int) -> int:
    """Each variant's share of the host's cores, unless OMP_NUM_THREADS says: oversubscribed,
    torch's threads spin (on 2 cores, two toy runs of 4 steps took 10 s each with 2 threads, 0.1 s
    with 1)."""
    return int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // parallel))


class Variant:
    """One variant's commands, run one after the other in a process group of their own."""

    def __init__(self, name: str, overrides: list[str], base: list[str], out: Path, parallel: int,
                 last: list[str]):  # fmt: skip
        """`last` follows the variant's overrides: the smoke's toy data sizes, which must win."""
        self.name, self.parallel, self.log = name, parallel, out / "logs" / f"{name}.log"
        self.run_dir, self.eval_dir = out / "runs" / name / "version_0", out / "eval" / name
        where = ["--trainer.logger.init_args.save_dir", str(out / "runs"), "--trainer.logger.init_args.name",
                 name, "--trainer.logger.init_args.version", "version_0"]  # fmt: skip
        self.commands = [python("-m", "vit.commands.train", "fit", *base, *where, *overrides, *last)]
        self.result = dict(overrides=overrides, status="not started", why=None)
        self.process, self.started = None, None

    def start(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)  # a run of an earlier sweep in the same --out
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.write_text("")
        self.started = time.perf_counter()
        self.result.update(status="running", why=None)
        self._next(self.commands[0])

    def _next(self, command: list[str]) -> None:
        env = dict(command_env(), OMP_NUM_THREADS=str(threads(self.parallel)))
        with open(self.log, "a") as f:
            f.write(f"$ {shlex.join(command)}\n")
            f.flush()
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=f,
                                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    def poll(self) -> bool:
        """Whether the variant is done, its next command started when the last one succeeded."""
        if (code := self.process.poll()) is None:
            return False
        if code != 0:
            what = self.process.args[2].split(".")[-1]  # train or eval
            lines = self.log.read_text().strip().splitlines() or [""]
            last = next((s for s in reversed(lines) if re.search(r"error|Error|Exception", s)), lines[-1])
            return self.finish("failed", f"{what} exited {code}: {last.strip()[:300]}")
        if len(self.commands) == 1:  # training done: measure the last checkpoint on the test split
            written = [self.run_dir / "checkpoints" / f for f in ("last.ckpt", "best.ckpt")]
            if not (ckpt := next((f for f in written if f.is_file()), None)):
                return self.finish("failed", "training wrote no checkpoint")
            self.result["checkpoint"] = str(ckpt)
            self.commands.append(
                python("-m", "vit.commands.eval", "--ckpt", str(ckpt), "--out", str(self.eval_dir))
            )
            self._next(self.commands[-1])
            return False
        self.result["test_top1"] = json.loads((self.eval_dir / "metrics.json").read_text())["top1"]
        return self.finish("ok", None)

    def finish(self, status: str, why: str | None) -> bool:
        r = self.result
        r.update(status=status, why=why)
        r["wall_seconds"] = time.perf_counter() - self.started
        r.update(read_run(self.run_dir), batch_size=batch_size(self.run_dir), log=str(self.log))
        if r.get("steps") and r.get("train_seconds") and r["batch_size"]:
            r["images_per_second"] = r["steps"] * r["batch_size"] / r["train_seconds"]
        return True


def stop(jobs: list[Variant], why: str) -> None:
    """SIGTERM to each running variant's process group, SIGKILL to those still there 10 s later."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        end = time.perf_counter() + wait
        for job in jobs:
            try:
                if job.process.poll() is None:
                    os.killpg(job.process.pid, sig)
                job.process.wait(timeout=max(end - time.perf_counter(), 0.01))
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
    for job in jobs:
        job.finish("stopped", why)


def fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(report: dict) -> str:
    env, variants, n = report["environment"], report["variants"], report["parallel"]
    device = env.get("gpu", "CPU: " + env["cpu"])
    at_once = "one at a time" if n == 1 else f"up to {n} at once"
    shared = "" if n == 1 else ": their speeds share the device"
    n_epochs = report["epochs"]
    length = f"{n_epochs} epoch{'s' * (n_epochs != 1)}"
    if report.get("minutes"):
        length = f"{report['minutes']:g} minutes of training"
    about = (
        f"{len(variants)} variants, {length} each (seed "
        f"{report['seed']}), **{at_once} on one {device}**, {report['threads']} "
        f"CPU threads each{shared}. `{report['command']}`; {report['seconds']:.0f} s in all."
    )
    about += " Smoke: toy sizes and made-up data, no figure to quote." if report["smoke"] else ""
    if report.get("proxy"):
        about += " CPU proxy (`PROXY`): a quarter-width network on a fifth of each epoch."
    lines = [f"# Sweep of {report['config']}, {env['date']}", "", about, "",
             "| variant | status | last val/acc | test top-1 | steps | epochs | training s | images/s "
             "| wall s |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in variants.items():
        status = r["status"] if r["why"] is None else f"{r['status']}: {r['why']}"
        cells = [name, status, fmt(r.get("val_acc"), ".4f"), fmt(r.get("test_top1"), ".4f"),
                 r.get("steps", "-"), r.get("epochs", "-"), fmt(r.get("train_seconds"), ".1f"),
                 fmt(r.get("images_per_second"), ",.0f"), fmt(r.get("wall_seconds"), ".0f")]  # fmt: skip
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    epochs = sorted({e for r in variants.values() for e in r.get("val_acc_by_epoch", {})})
    if len(epochs) > 12:  # about ten columns, and the last epoch
        epochs = sorted(set(epochs[:: -(-len(epochs) // 10)] + epochs[-1:]))
    if not epochs:
        return "\n".join([*lines, "", "No variant validated yet."]) + "\n"
    lines += ["", "val/acc after each epoch (from 0):", ""]
    lines += ["| variant | " + " | ".join(str(e) for e in epochs) + " |", "|---|" + "---|" * len(epochs)]
    for name, r in variants.items():
        by_epoch = r.get("val_acc_by_epoch", {})
        lines.append(f"| {name} | " + " | ".join(fmt(by_epoch.get(e)) for e in epochs) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    # fmt: off
    add("--variants", metavar="FILE", help="YAML: name -> vit-train fit overrides; default gpu_sweep.yaml")
    add("--only", nargs="+", metavar="NAME", help="run these of its variants, in this order; default all")
    add("--config", default="configs/cifar10_gpu.yaml", help="the recipe to vary; default %(default)s")
    add("--data", metavar="PATH", help="CIFAR-10: image folders, or a pack (lab/cifar10_pack.py)")
    add("--out", metavar="DIR", default="runs/gpu_sweep", help="runs, logs, tables; default %(default)s")
    add("--epochs", type=int, metavar="E", help="epochs a variant; default 30 (1 with --smoke)")
    add("--minutes", type=float, metavar="M", help="instead of --epochs: each variant's time budget")
    add("--seed", type=int, metavar="S", default=0, help="every variant's --seed_everything; default 0")
    add("--parallel", type=int, metavar="N", default=2, help="variants at once (processes); default 2")
    add("--deadline", type=float, metavar="SECONDS",
        help="for the whole sweep: running variants are stopped, others not started")
    add("--smoke", action="store_true", help="made-up data, toy model, 1 epoch: any CPU, under a minute")
    add("--proxy", action="store_true", help="quarter width, a fifth of each epoch, 5 epochs: for a CPU")
    # fmt: on
    args = parser.parse_args(argv)
    start = time.perf_counter()
    path = Path(args.variants or Path(__file__).with_suffix(".yaml"))
    variants = read_variants(path)
    if args.only:
        if missing := [name for name in args.only if name not in variants]:
            have = ", ".join(variants)
            raise SystemExit(f"error: --only {' '.join(missing)}: not in {path} (it has {have})")
        variants = {name: variants[name] for name in dict.fromkeys(args.only)}
    if args.parallel < 1:
        raise SystemExit(f"error: --parallel {args.parallel} must be at least 1")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = prepare_data(args.data, out, args.smoke).resolve()  # the runs start in the checkout
    config = str(Path(args.config).resolve()) if Path(args.config).is_file() else args.config
    epochs = args.epochs or (1 if args.smoke else 5 if args.proxy else 30)
    # eager: compiling costs each process about half a minute of a GPU window and no accuracy
    limit = ["--trainer.max_epochs", str(epochs), "--trainer.max_time", "null"]
    if args.minutes is not None:  # the config's schedule spans the budget (vit.callbacks.TimeBudget)
        if args.minutes <= 0:
            raise SystemExit(f"error: --minutes {args.minutes} must be positive")
        seconds = round(args.minutes * 60)
        budget = f"00:{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        limit = ["--trainer.max_epochs", "-1", "--trainer.max_time", budget]
    base = ["--config", config, *limit, "--model.compile", "false", *EVERY_EPOCH,
            "--data.init_args.root", str(data), "--data.init_args.download", "false",
            "--seed_everything", str(args.seed), *(smoke_for(config) if args.smoke else []),
            *(PROXY if args.proxy else [])]  # fmt: skip
    command = " ".join(["python benchmarks/gpu_sweep.py", *(argv if argv is not None else sys.argv[1:])])
    report = dict(command=command, config=args.config, epochs=epochs, minutes=args.minutes, seed=args.seed,
                  parallel=args.parallel, proxy=args.proxy, threads=threads(args.parallel), smoke=args.smoke,
                  environment=environment())  # fmt: skip
    # a variant's own batch or held-out count (1,024; 1,000) would not fit the smoke's 80 images
    last = SMOKE_DATA if args.smoke else []
    jobs = [Variant(name, overrides, base, out, args.parallel, last) for name, overrides in variants.items()]
    queue, running, why = list(jobs), [], None  # why: why the sweep ended before its variants
    try:
        while queue or running:
            if args.deadline is not None and time.perf_counter() - start >= args.deadline:
                why = f"at the {args.deadline:.0f} s deadline"
                break
            while queue and len(running) < args.parallel:
                running.append(job := queue.pop(0))
                print(f"== {job.name}: started", flush=True)
                job.start()
            for job in [j for j in running if j.poll()]:
                running.remove(job)
                print(f"== {job.name}: {job.result['status']} {job.result['why'] or ''}", flush=True)
            time.sleep(0.2)
    except KeyboardInterrupt:
        why = "by Ctrl-C"
    finally:
        stop([job for job in running if job.process is not None], why or "the sweep failed")
        report["variants"] = {
            job.name: {**job.result, "commands": [shlex.join(c) for c in job.commands]} for job in jobs
        }
        report["seconds"] = time.perf_counter() - start
        (out / "sweep.json").write_text(json.dumps(report, indent=1))
        (out / "sweep.md").write_text(markdown(report))
    print(markdown(report))
    if why == "by Ctrl-C":
        raise SystemExit(130)
    return report


def exit_status(report: dict) -> int:
    """1 when a variant failed; a sweep whose deadline stopped variants or left them unstarted did
    what it was asked to."""
    return int(any(r["status"] == "failed" for r in report["variants"].values()))


if __name__ == "__main__":
    sys.exit(exit_status(main()))
