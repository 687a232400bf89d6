"""The GPU check: what this toolkit does with a GPU's minutes, measured in one command.

    make gpu-check                                  # on a machine with a GPU: about 8 minutes on an H100
    python benchmarks/gpu_check.py --smoke          # any CPU, under a minute: the same steps at toy sizes

Steps, each in its own process (a failing step is reported and the next one runs):

1. tests: `pytest -m gpu` (fused against explicit attention, a training step, vit-eval, the
   attention maps, the page and vit-attention score on the GPU against the CPU);
2. demo: `configs/two_circles.yaml` trained, then vit-eval (test top-1, seconds);
3. throughput: `benchmarks/throughput.py` in bf16, ours against timm and vit-pytorch, for the GPU
   recipe's transformer at 32x32 and for ViT-S/16 at 224 (batch 256), each a share of the GPU's
   bf16 matrix-product rate measured in the same run;
4. speedrun: `configs/cifar10_gpu.yaml` for each budget (2 minutes and 20 s; `-captured`: with the
   whole training step as one graph, `--model.capture_step true`; `-levers`: that and `LEVERS`),
   then vit-eval with and without flip TTA: test top-1, optimizer steps, epochs, training
   seconds, the seconds of validation and checkpoints, the loop's images a second (against
   throughput.py's compiled rate), the compilation before the clock and the whole command's wall
   time;
5. sweep: `benchmarks/gpu_sweep.py`, the variants of benchmarks/gpu_sweep.yaml for a few epochs
   each, several processes sharing the GPU, within the time left;
6. cnn_peer: airbench's 94% schedule on the same CIFAR-10 copy and GPU (`benchmarks/cnn_peer.py`).

It writes `gpu_report.md` and `gpu_report.json` into `--out`, and each step's output into
`--out/logs/`. CIFAR-10 comes from `--data`: image folders, torchvision's copy, or a pack made
by `lab/cifar10_pack.py` (unpacked first). `--smoke` runs every step on made-up data at
toy sizes, on whatever device there is, so that the check is tested where no GPU is.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: `benchmarks`, `lab` and `vit` import from the checkout

SWEEP_MARGIN = 35  # seconds of the sweep step left after the sweep's own deadline
STEPS = ("tests", "demo", "throughput", "speedrun", "sweep", "cnn_peer")
# the speedrun's runs: a time budget and overrides of the config
# with the whole step as one graph, and 20 of its steps profiled (vit.callbacks.Profile: the host's
# time a step against the GPU's kernels', and the costliest operators, in the run's profile.txt)
CAPTURED = [
    "--model.capture_step", "true", "--trainer.callbacks+=vit.callbacks.Profile",
    "--trainer.callbacks.start", "200", "--trainer.callbacks.steps", "20",
]  # fmt: skip
# the levers that the CPU proxy ranked first (docs/gpu/2026-11-28-cpu-proxy.md): Muon, the whitened
# stem, no augmentation policy
LEVERS = ["--model.optimizer", "muon", "--model.whiten_stem", "true", "--data.init_args.policy", "none"]
BUDGETS = {
    "120s": ("00:00:02:00", []),
    "20s": ("00:00:00:20", []),
    "120s-captured": ("00:00:02:00", CAPTURED),
    "20s-captured": ("00:00:00:20", CAPTURED),
    "120s-levers": ("00:00:02:00", [*CAPTURED, *LEVERS]),
    "20s-levers": ("00:00:00:20", [*CAPTURED, *LEVERS]),
}
SMOKE_BUDGETS = {"5s": ("00:00:00:05", [])}
# toy sizes for --smoke: the same configs and code paths, small enough for a CPU
SMOKE_DEMO = [
    "--model.vit.preset", "micro", "--data.init_args.num_train", "256", "--data.init_args.num_val", "64",
    "--data.init_args.num_test", "64", "--trainer.max_epochs", "1",
]  # fmt: skip
SMOKE_DATA = ["--data.init_args.batch_size", "16", "--data.init_args.val_size", "16"]  # of 80 made-up images
SMOKE_SPEEDRUN = [
    "--model.vit.dim", "32", "--model.vit.depth", "1", "--model.vit.heads", "2",
    "--model.vit.conv_stem", "[8, 16, 32]", "--model.compile", "false", *SMOKE_DATA,
]  # fmt: skip


def smoke_for(config: str | Path) -> list[str]:
    """SMOKE_SPEEDRUN's toy sizes for the config file `config`: where it has a convolutional stem,
    as many convolutions as it has (of 8 to 32 channels), so that its own `conv_stem_strides` and
    patch size still fit. A config that is no file, or has no stem, gets SMOKE_SPEEDRUN's 3."""
    import yaml

    path, smoke = Path(config), list(SMOKE_SPEEDRUN)
    model = (yaml.safe_load(path.read_text()) or {}).get("model") if path.is_file() else None
    stem = ((model or {}).get("vit") or {}).get("conv_stem")
    if stem:
        smoke[smoke.index("--model.vit.conv_stem") + 1] = str([min(8 * 2**i, 32) for i in range(len(stem))])
    return smoke


# benchmarks/throughput.py's runs: the GPU recipe's transformer against its peers; the recipe's
# network itself (ours with its stem, not a peer) eager, compiled as the speedrun compiles it, and
# compiled with CUDA graphs; ViT-S/16 at 224
RECIPE = ["--model", "cifar10_gpu", "--systems", "ours+stem", "--batch", "512"]
THROUGHPUT = {
    "cifar10_gpu": ["--model", "cifar10_gpu", "--systems", "ours", "timm", "vit-pytorch", "--batch", "512"],
    "recipe": RECIPE,
    "recipe-compiled": [*RECIPE, "--compile"],
    "recipe-cudagraphs": [*RECIPE, "--compile", "reduce-overhead"],
    "vit-s16": ["--model", "vit-s16", "--batch", "256"],
}
# the sweep of benchmarks/gpu_sweep.yaml's variants after the speedrun: about 10 epochs each fit in
# the two minutes or so a 9-minute call has left, four processes sharing the GPU
SWEEP = ["--epochs", "10", "--parallel", "4"]
SMOKE_THROUGHPUT = ["--systems", "ours", "--batch", "2", "--warmup", "1", "--rounds", "1", "--steps", "1"]


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def command_env() -> dict:
    """The environment of every step: the checkout importable without an install."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def run(commands: list[list[str]], log: Path, timeout: float) -> dict:
    """Run `commands` one after the other (stopping at the first failure), their output appended
    to `log`: {ok, seconds, why}."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "a") as f:
        for command in commands:
            f.write(f"$ {' '.join(command)}\n")
            f.flush()
            try:
                done = subprocess.run(
                    command, cwd=ROOT, env=command_env(), stdout=f, stderr=subprocess.STDOUT,
                    timeout=max(timeout - (time.perf_counter() - start), 1),
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                return dict(
                    ok=False, seconds=time.perf_counter() - start, why=f"timed out after {timeout:.0f} s"
                )
            if done.returncode != 0:
                tail = log.read_text().strip().splitlines()[-40:] or [""]
                what = command[2] if command[1:2] == ["-m"] else Path(command[min(1, len(command) - 1)]).name
                why = f"{what} exited {done.returncode}: {tail[-1][:300]}"
                return dict(ok=False, seconds=time.perf_counter() - start, why=why, log_tail=tail)
    return dict(ok=True, seconds=time.perf_counter() - start, why=None)


def environment() -> dict:
    import torch

    from lab.machine import cpu_name

    about = dict(
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        device="cuda" if torch.cuda.is_available() else "cpu",
    )
    if torch.cuda.is_available():
        about["gpu"] = torch.cuda.get_device_name(0)
        try:
            query = ["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"]
            about["driver"] = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            about["driver"] = None
    about["cpu"] = cpu_name()
    about["cpu_cores"] = os.cpu_count()
    return about


def prepare_data(data: str | None, out: Path, smoke: bool) -> Path:
    """The CIFAR-10 folder the runs read: made up (--smoke), unpacked from a pack, or as given."""
    from lab.cifar10_pack import fake_cifar10, unpack

    if smoke:
        return fake_cifar10(out / "data" / "cifar10-fake", per_class=8)
    if data is None:
        raise SystemExit(
            "error: --data is needed without --smoke: CIFAR-10 folders, torchvision's copy or a pack"
        )
    path = Path(data)
    if path.is_file():
        folder = out / "data" / path.stem
        if not (folder / "train").is_dir():
            print(f"unpacking {path} into {folder}", flush=True)
            unpack(path, folder)
        return folder
    if not path.is_dir():
        raise SystemExit(f"error: --data {data}: no such folder or pack file")
    return path


def read_metrics(run_dir: Path) -> dict:
    """Figures of a vit-train run from its metrics.csv: the last val/acc, the steps and epochs,
    the minutes of training and the compilation before the clock."""
    rows = list(csv.DictReader(open(run_dir / "metrics.csv")))

    def last(key):
        values = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
        return values[-1] if values else None

    return dict(
        val_acc=last("val/acc"),
        steps=int(max(float(r["step"]) for r in rows if r.get("step"))) + 1,
        epochs=int(last("epoch") or 0) + 1,
        train_minutes=last("time/minutes"),
        compile_seconds=last("time/compile_seconds"),
        capture_seconds=last("time/capture_seconds"),
        profile={k: last(f"profile/{k}") for k in ("host_seconds", "device_seconds", "wall_seconds")},
        clock_seconds=last("time/seconds"),
        paused_seconds=last("time/paused_seconds"),
    )


def batch_size(run_dir: Path) -> int | None:
    """The training batch a vit-train run recorded (its hparams.yaml), or None without one."""
    import yaml

    hparams = run_dir / "hparams.yaml"
    return yaml.safe_load(hparams.read_text()).get("batch_size") if hparams.is_file() else None


def loop_rate(run: dict) -> float | None:
    """Images a second of the training loop alone: steps x batch over the clock's seconds less the
    pauses for validation and checkpoints."""
    if None in (run.get("clock_seconds"), run.get("paused_seconds"), run.get("batch_size")):
        return None
    return run["steps"] * run["batch_size"] / max(run["clock_seconds"] - run["paused_seconds"], 1e-9)


def run_name(run: dict) -> str:
    """A speedrun's label (`--budgets`); reports written before runs had labels name the budget."""
    return run.get("label", run["budget"])


def eval_top1(out: Path) -> float:
    return json.loads((out / "metrics.json").read_text())["top1"]


def train_and_eval(name: str, config: str, extra: list[str], out: Path, timeout: float, tta: bool) -> dict:
    """Train `config` and evaluate its best checkpoint (with flip TTA too), within `timeout`
    seconds for the whole: evaluation gets what training left."""
    runs = out / "runs"
    run_dir = runs / name / "version_0"
    ckpt = run_dir / "checkpoints" / "best.ckpt"
    log = out / "logs" / f"{name}.log"
    logger = [f"--trainer.logger.init_args.{key}" for key in ("save_dir", "name", "version")]
    where = [logger[0], str(runs), logger[1], name, logger[2], "version_0"]
    train = python("-m", "vit.commands.train", "fit", "--config", config, *extra, *where)
    start = time.perf_counter()
    result = run([train], log, timeout)
    result["train_wall_seconds"] = time.perf_counter() - start
    if not result["ok"]:
        return result
    result.update(read_metrics(run_dir), batch_size=batch_size(run_dir))
    evals = [python("-m", "vit.commands.eval", "--ckpt", str(ckpt), "--out", str(out / "eval" / name))]
    if tta:
        evals.append(evals[0][:-1] + [str(out / "eval" / f"{name}-tta"), "--tta"])
    left = max(timeout - (time.perf_counter() - start), 1)
    result.update({k: v for k, v in run(evals, log, left).items() if k != "seconds"})
    if result["ok"]:
        result["test_top1"] = eval_top1(out / "eval" / name)
        if tta:
            result["test_top1_tta"] = eval_top1(out / "eval" / f"{name}-tta")
    return result


def step_tests(args, out: Path, data: Path) -> dict:
    log = out / "logs" / "tests.log"
    result = run(
        [python("-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests/test_gpu.py")],
        log,
        args.timeout,
    )
    summary = re.findall(r"(\d+) (passed|failed|skipped|error)", log.read_text())
    result["counts"] = {kind: int(n) for n, kind in summary}
    if not result["ok"] and not result["counts"].get("failed") and result["counts"].get("skipped"):
        result.update(ok=True, why=None)  # pytest exits 0 when all skip; kept for older pytests
    return result


def step_demo(args, out: Path, data: Path) -> dict:
    extra = SMOKE_DEMO if args.smoke else []
    return train_and_eval("demo", "configs/two_circles.yaml", extra, out, args.timeout, tta=False)


def step_throughput(args, out: Path, data: Path) -> dict:
    log = out / "logs" / "throughput.log"
    shapes = {name: THROUGHPUT[name] for name in args.throughput}
    timed = ["--precisions", "bf16", "--rounds", "3"]
    if args.smoke:
        shapes, timed = {"cifar": ["--model", "cifar", *SMOKE_THROUGHPUT]}, ["--precisions", "fp32"]
    commands = [
        python("benchmarks/throughput.py", *extra, "--json", str(out / f"throughput-{name}.json"), *timed)
        for name, extra in shapes.items()
    ]
    result = run(commands, log, args.timeout)
    result["results"] = {
        name: json.loads((out / f"throughput-{name}.json").read_text())
        for name in shapes
        if (out / f"throughput-{name}.json").is_file()
    }
    return result


def step_speedrun(args, out: Path, data: Path) -> dict:
    import torch

    from benchmarks import gpu_recipe_cost

    base = ["--data.init_args.root", str(data), "--data.init_args.download", "false"]
    base += SMOKE_SPEEDRUN if args.smoke else []
    budgets = SMOKE_BUDGETS if args.smoke else {label: BUDGETS[label] for label in args.budgets}
    runs, start = {}, time.perf_counter()
    for label, (budget, overrides) in budgets.items():
        extra = [*base, "--trainer.max_time", budget, *overrides]
        left = max(args.timeout - (time.perf_counter() - start), 1)  # the step's limit, shared
        runs[label] = train_and_eval(
            f"speedrun-{label}", "configs/cifar10_gpu.yaml", extra, out, left, tta=True
        )
        runs[label].update(budget=budget, label=label)
        if runs[label]["ok"]:
            runs[label]["loop_images_per_second"] = loop_rate(runs[label])
    # the model stays one to look inside: its token grid, and where its forward FLOPs go
    model, _ = gpu_recipe_cost.build(ROOT / "configs" / "cifar10_gpu.yaml")
    flops = gpu_recipe_cost.flops_by_part(model, torch.rand(2, 3, 32, 32), train=False)
    about = dict(grid=list(model.grid_size), forward_flops=flops)
    return dict(ok=all(r["ok"] for r in runs.values()), why=None, runs=runs, model=about,
                seconds=sum(r["seconds"] for r in runs.values()))  # fmt: skip


def step_sweep(args, out: Path, data: Path) -> dict:
    log = out / "logs" / "sweep.log"
    where = ["--data", str(data), *SWEEP]
    if args.smoke:  # the queue's first two (each variant's own smoke: gpu_sweep.py --smoke)
        import yaml

        first = dict(list(yaml.safe_load((ROOT / "benchmarks" / "gpu_sweep.yaml").read_text()).items())[:2])
        (out / "smoke_variants.yaml").write_text(yaml.safe_dump(first))
        where = ["--smoke", "--variants", str(out / "smoke_variants.yaml")]
    # its own deadline, before this step's: it stops its variants and writes its table itself. The
    # margin covers what its clock does not see: Python's start and exit, and stopping the variants
    # (on a fresh H100 machine the step took 14 s beyond the sweep's own 91 s)
    deadline = ["--deadline", str(max(args.timeout - SWEEP_MARGIN, 10))]
    result = run(
        [python("benchmarks/gpu_sweep.py", "--out", str(out / "sweep"), *where, *deadline)], log, args.timeout
    )
    if (out / "sweep" / "sweep.json").is_file():
        result["results"] = json.loads((out / "sweep" / "sweep.json").read_text())
        result["table"] = (out / "sweep" / "sweep.md").read_text()
    return result


def step_cnn_peer(args, out: Path, data: Path) -> dict:
    import torch

    if not torch.cuda.is_available():
        return dict(
            ok=True, skipped=True, seconds=0.0, why="airbench trains on CUDA only: skipped on this machine"
        )
    log = out / "logs" / "cnn_peer.log"
    command = python(
        "benchmarks/cnn_peer.py", "--data", str(data), "--runs", "2", "--json", str(out / "cnn_peer.json")
    )
    result = run([command], log, args.timeout)
    if result["ok"]:
        result["results"] = json.loads((out / "cnn_peer.json").read_text())
    return result


STEP_FUNCTIONS = {
    "tests": step_tests,
    "demo": step_demo,
    "throughput": step_throughput,
    "speedrun": step_speedrun,
    "sweep": step_sweep,
    "cnn_peer": step_cnn_peer,
}


def fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(report: dict) -> str:
    """The report for people: the machine, then one section a step."""
    env, steps = report["environment"], report["steps"]
    lines = [f"# GPU check, {env['date']}", ""]
    smoke = " (smoke: toy sizes and made-up data, no figure to quote)" if report["smoke"] else ""
    lines.append(
        f"{env.get('gpu', 'no GPU (CPU only)')}; driver {env.get('driver') or '-'}; torch {env['torch']}, "
        f"CUDA {env['cuda'] or '-'}, Python {env['python']}; host CPU: {env['cpu']}, "
        f"{env['cpu_cores']} cores. `{report['command']}`{smoke}; {report['seconds']:.0f} s in all."
    )
    lines.append("")
    lines += ["| step | status | seconds |", "|---|---|---|"]
    for name, step in steps.items():
        status = step["why"] if step.get("skipped") else "ok" if step["ok"] else f"FAILED: {step['why']}"
        lines.append(f"| {name} | {status} | {step['seconds']:.0f} |")
    if "tests" in steps:
        counts = steps["tests"].get("counts", {})
        lines += ["", "## pytest -m gpu", "", ", ".join(f"{n} {k}" for k, n in counts.items()) or "no count"]
    if "demo" in steps and steps["demo"]["ok"]:
        d = steps["demo"]
        lines += ["", "## Demo (configs/two_circles.yaml)", "",
                  f"test top-1 {fmt(d.get('test_top1'), '.4f')}; {d['steps']} steps, {d['epochs']} epochs; "
                  f"training command {d['train_wall_seconds']:.0f} s."]  # fmt: skip
    if "throughput" in steps:
        lines += ["", "## Throughput (benchmarks/throughput.py)", ""]
        for model, result in steps["throughput"].get("results", {}).items():
            lines.append(f"{model}, batch {result.get('batch')}:")
            lines.append("")
            lines.append("```")
            lines.append(result.get("text", json.dumps(result.get("precisions", {}), indent=1)[:3000]))
            lines.append("```")
    if "speedrun" in steps:
        columns = ["run", "test top-1", "flip TTA", "val/acc", "steps", "epochs", "training min",
                   "paused s", "loop img/s", "compile s", "capture s", "command s"]  # fmt: skip
        lines += ["", "## Speedrun (configs/cifar10_gpu.yaml)", ""]
        if "model" in steps["speedrun"]:
            grid, flops = steps["speedrun"]["model"]["grid"], steps["speedrun"]["model"]["forward_flops"]
            shares = ", ".join(
                f"{part} {flops[part] / flops['total']:.1%}" for part in ("stem", "attention", "MLP")
            )
            lines += [
                f"{grid[0]}x{grid[1]} tokens; forward {flops['total'] / 1e9:.2f} GFLOP an image: {shares}",
                "",
            ]
        lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for r in steps["speedrun"]["runs"].values():
            if not r["ok"]:
                lines.append(f"| {run_name(r)} | FAILED: {r['why']} |" + "|" * (len(columns) - 2))
                continue
            cells = [run_name(r), fmt(r.get("test_top1"), ".4f"), fmt(r.get("test_top1_tta"), ".4f"),
                     fmt(r.get("val_acc"), ".4f"), r["steps"], r["epochs"],
                     fmt(r.get("train_minutes"), ".2f"), fmt(r.get("paused_seconds"), ".1f"),
                     fmt(r.get("loop_images_per_second"), ",.0f"), fmt(r.get("compile_seconds"), ".1f"),
                     fmt(r.get("capture_seconds"), ".1f"),
                     f"{r['train_wall_seconds']:.0f}"]  # fmt: skip
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        lines += loop_against_benchmark(steps)
        for r in steps["speedrun"]["runs"].values():
            if (profile := r.get("profile") or {}).get("host_seconds") is not None:
                lines.append(
                    f"- {run_name(r)}, 20 steps profiled: the host {profile['host_seconds'] * 1e3:.2f} ms a "
                    f"step, the GPU's kernels {profile['device_seconds'] * 1e3:.2f} ms, the wall clock "
                    f"{profile['wall_seconds'] * 1e3:.2f} ms (the run's profile.txt: by operator)"
                )
    if steps.get("sweep", {}).get("table"):
        lines += ["", "## Sweep (benchmarks/gpu_sweep.py)", "", *steps["sweep"]["table"].splitlines()[2:]]
    if "cnn_peer" in steps:
        peer = steps["cnn_peer"]
        lines += ["", "## CNN peer (airbench94, benchmarks/cnn_peer.py)", ""]
        if peer.get("results"):
            r = peer["results"]
            lines.append(
                f"test top-1 {fmt(r.get('mean_acc'), '.4f')} (TTA {fmt(r.get('mean_acc_tta'), '.4f')}), "
                f"{fmt(r.get('mean_seconds'), '.2f')} s a run (airbench's own clock "
                f"{fmt(r.get('mean_airbench_seconds'), '.2f')} s), mean of {len(r.get('runs', []))} runs"
            )
        else:
            lines.append(peer.get("why") or "no result")
    return "\n".join(lines) + "\n"


def compiled_as(config: Path = ROOT / "configs" / "cifar10_gpu.yaml") -> str:
    """throughput.py's run of the recipe's network compiled as the speedrun's config compiles it."""
    import yaml

    mode = yaml.safe_load(config.read_text())["model"].get("compile", False)
    return {"reduce-overhead": "recipe-cudagraphs", False: "recipe"}.get(mode, "recipe-compiled")


def loop_against_benchmark(steps: dict, matching: str | None = None) -> list[str]:
    """The training loop's images a second against throughput.py's for the same network, batch,
    precision and compilation (the config's): the loop's goal is 0.95 of it."""
    matching = matching or compiled_as()
    result = steps.get("throughput", {}).get("results", {}).get(matching, {})
    rate = result.get("precisions", {}).get("bf16", {}).get("systems", {}).get("ours+stem", {})
    if "train_ips" not in rate:
        return []
    lines = [
        f"- {run_name(run)}: the loop at {loop:,.0f} images/s is {loop / rate['train_ips']:.2f}x "
        f"throughput.py's {matching} ({rate['train_ips']:,.0f} images/s, bf16)"
        for run in steps["speedrun"]["runs"].values()
        if (loop := run.get("loop_images_per_second"))
    ]
    return ["", *lines] if lines else []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", help="CIFAR-10: image folders, torchvision's copy, or a pack (lab/cifar10_pack.py)"
    )
    parser.add_argument("--out", default="runs/gpu_check", help="folder of the runs, the logs and the data")
    parser.add_argument("--report", help="folder of gpu_report.md and gpu_report.json; default --out")
    parser.add_argument(
        "--steps", nargs="+", choices=STEPS, default=list(STEPS), help="default: all, in order"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="toy sizes and made-up data: seconds, on any device"
    )
    parser.add_argument(
        "--throughput", nargs="+", choices=THROUGHPUT, default=list(THROUGHPUT),
        help="the throughput step's runs (default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--budgets", nargs="+", choices=BUDGETS, default=["120s", "20s"],
        help="the speedrun's runs, in this order (default: 120s 20s)",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=600, help="seconds each step may take")
    parser.add_argument(
        "--deadline", type=float, default=None, metavar="SECONDS",
        help="for the whole check: a step is stopped when it runs past it, and later ones are skipped",
    )  # fmt: skip
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    report_dir = Path(args.report).resolve() if args.report else out
    for folder in (out, report_dir):
        folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    command = " ".join(["python benchmarks/gpu_check.py", *(argv if argv is not None else sys.argv[1:])])
    report = dict(command=command, smoke=args.smoke, environment=environment(), steps={})
    print(json.dumps(report["environment"]), flush=True)
    data = (
        prepare_data(args.data, out, args.smoke)
        if {"speedrun", "sweep", "cnn_peer"} & set(args.steps)
        else None
    )
    for name in args.steps:
        left = None if args.deadline is None else args.deadline - (time.perf_counter() - start)
        print(f"== {name}", flush=True)
        if left is not None and left < 10:
            result = dict(
                ok=False, skipped=True, seconds=0.0, why=f"skipped: the {args.deadline:.0f} s deadline passed"
            )
        else:
            step_args = argparse.Namespace(
                **{**vars(args), "timeout": min(args.timeout, left or args.timeout)}
            )
            result = STEP_FUNCTIONS[name](step_args, out, data)
        report["steps"][name] = result
        status = "ok" if result["ok"] else f"FAILED: {result['why']}"
        print(f"== {name}: {status} ({result['seconds']:.0f} s)", flush=True)
        report["seconds"] = time.perf_counter() - start
        (report_dir / "gpu_report.json").write_text(json.dumps(report, indent=1))
        (report_dir / "gpu_report.md").write_text(markdown(report))
    print(markdown(report))
    if not all(step["ok"] for step in report["steps"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
