"""Helpers shared by the tests: CLI runs (as processes, or in this one: `run_in_process`), scripts
run as a user runs them, fake image folders, an unsafe pickle, fits in one process or two."""

import contextlib
import gzip
import importlib
import io
import multiprocessing
import os
import pickle
import socket
import struct
import subprocess
import sys
import tempfile
import traceback
from importlib.metadata import entry_points
from pathlib import Path

import lightning as L
import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]

# A few seconds of training: the smallest preset on a few hundred two-circles images.
TINY = [
    "--config", str(ROOT / "configs/two_circles.yaml"),
    "--model.vit.preset", "micro",
    "--data.init_args.num_train", "512",
    "--data.init_args.num_val", "128",
    "--data.init_args.num_test", "128",
    "--data.init_args.batch_size", "32",
    "--trainer.max_epochs", "2",
    "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false",
    "--trainer.log_every_n_steps", "4",
]  # fmt: skip


def tiny_args(runs: Path, *extra: str, name: str = "tiny") -> list[str]:
    return [
        *TINY,
        "--trainer.logger.init_args.save_dir",
        str(runs),
        "--trainer.logger.init_args.name",
        name,
        *extra,
    ]


def run_train(
    *args: str, cwd: Path, timeout: float = 600, warnings: str = "ignore"
) -> subprocess.CompletedProcess:
    """`python train.py ARGS` in a subprocess, as a user runs it (Python warnings off unless
    `warnings="default"`)."""
    env = {**os.environ, "PYTHONWARNINGS": warnings}
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


REAL_RUN = subprocess.run


def main_of(command: list[str]):
    """The `main` a command line of this checkout calls, and its arguments: `python -m MODULE
    ARGS`, `python SCRIPT.py ARGS` (a file under the checkout) or `vit-train ARGS` and its
    siblings; (None, None) for any other command."""
    program, *args = map(str, command)
    if program == sys.executable and args[:1] == ["-m"] and (ROOT / args[1].split(".")[0]).is_dir():
        return importlib.import_module(args[1]).main, args[2:]
    if program == sys.executable and args and args[0].endswith(".py"):
        script = (ROOT / args[0]).resolve()
        if script.is_relative_to(ROOT):
            module = ".".join(script.relative_to(ROOT).with_suffix("").parts)
            return importlib.import_module(module).main, args[1:]
    # this project's commands (vit-train, vit-eval, ...): name -> "module:function"
    ours = {e.name: e.value for e in entry_points(group="console_scripts") if e.value.startswith("vit.")}
    if Path(program).name in ours:
        module, function = ours[Path(program).name].split(":")
        return getattr(importlib.import_module(module), function), args
    return None, None


def run_in_process(command, *, cwd=None, stdout=None, stderr=None, capture_output=False, text=False,
                   **ignored) -> subprocess.CompletedProcess:  # fmt: skip
    """`subprocess.run` for tests of scripts that run this project's commands, where the subject is
    what the script does with them, not the processes: a command of this checkout (`main_of`)
    runs here, as its `main(ARGS)`, with its output where `stdout`/`stderr` say, which saves each
    one Python's start and imports (12 s on a 2-core Zen 3). `env` and `timeout` are not applied.
    Any other command (pytest, a shell's) goes to the real `subprocess.run`."""
    main, args = main_of(command)
    if main is None:
        return REAL_RUN(command, cwd=cwd, stdout=stdout, stderr=stderr, capture_output=capture_output,
                        text=text, **ignored)  # fmt: skip
    out = io.StringIO() if capture_output or stdout == subprocess.PIPE else stdout or sys.stdout
    err = out if stderr == subprocess.STDOUT else io.StringIO() if capture_output else stderr or sys.stderr
    threads = torch.get_num_threads()  # a command may set its own; the tests after it keep theirs
    with contextlib.chdir(cwd or "."), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
            status = 0
        except SystemExit as exit:
            status = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
            if isinstance(exit.code, str):
                print(exit.code, file=sys.stderr)
        except Exception:
            traceback.print_exc()
            status = 1
        finally:
            torch.set_num_threads(threads)
    captured = [s.getvalue() if isinstance(s, io.StringIO) else None for s in (out, err)]
    return subprocess.CompletedProcess(command, status, *captured)


def run_script(script: Path, *args: str, own_process: bool = False) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS` as a user runs it, its output captured: in this process
    (`run_in_process`), or with `own_process` in one of its own, for a script that drives Chromium
    (Playwright's sync API will not start a second time in a process, and the session's `browser`
    holds the first)."""
    command = [sys.executable, str(script), *args]
    if own_process:
        return subprocess.run(command, capture_output=True, text=True, timeout=600)
    return run_in_process(command, capture_output=True, text=True)


def forked(target, *args) -> multiprocessing.Process:
    """`target(*args)` started in a process of its own, forked from a server process that imported
    vit-train's and vit-eval's modules once (multiprocessing's forkserver), so that each process
    skips Python's start and imports (12 s on a 2-core Zen 3)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["vit.commands.train", "vit.commands.eval"])  # before it starts
    process = context.Process(target=target, args=args)
    process.start()
    return process


def start_training(args: list[str], **env: str) -> multiprocessing.Process:
    """`vit-train ARGS` started in a forked process (`forked`), with `env` set there, for tests
    that kill runs. Its output is dropped."""
    return forked(train_quietly, args, env)


def train_quietly(args: list[str], env: dict) -> None:
    os.environ.update(env)
    tempfile.tempdir = None  # read TMPDIR again
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    from vit.commands.train import main

    main(args)


def forked_peak_megabytes(module: str, *args: str) -> float:
    """`benchmarks.streaming.peak_megabytes` in a forked process (`forked`): the peak resident
    memory in MB of `python -m MODULE ARGS`, counted from the server's at the fork (its imports,
    the same for every run) rather than from a fresh Python's."""
    with tempfile.TemporaryDirectory() as folder:
        out, log = Path(folder) / "peak", Path(folder) / "log"
        process = forked(run_for_peak, module, list(args), out, log)
        process.join(600)
        if process.exitcode != 0 or not out.exists():
            process.kill()
            output = log.read_text()[-3000:] if log.exists() else ""
            raise RuntimeError(f"python -m {module} {' '.join(args)} failed ({process.exitcode}):\n{output}")
        return int(out.read_text()) / 1024


def run_for_peak(module: str, args: list[str], out: Path, log: Path) -> None:
    """`module.main(args)` from the checkout's folder with its output in `log`; then the process's
    peak resident memory (VmHWM, KiB) into `out`."""
    os.chdir(ROOT)
    tempfile.tempdir = None  # read TMPDIR again
    with open(log, "w") as output:
        os.dup2(output.fileno(), 1)
        os.dup2(output.fileno(), 2)
    try:
        importlib.import_module(module).main(args)
    finally:  # a command that ends with SystemExit(0) has run too
        status = Path("/proc/self/status").read_text().splitlines()
        out.write_text(next(line.split()[1] for line in status if line.startswith("VmHWM:")))


# Sizes and modes the fake folders cycle through: odd sizes, grayscale, palette, alpha, RGB.
SIZES = [(13, 9), (16, 16), (7, 31), (40, 22)]
MODES = ["L", "P", "RGBA", "RGB"]


def save_as_vit_train(model, data, path: Path) -> None:
    """A ViTClassifier trained on two circles, saved as vit-train saves it today: weights, its
    hyperparameters and its data module's (with the class paths LightningCLI records), the
    preparation of its images and the format version."""
    from vit import compat

    torch.save(
        {
            "state_dict": model.state_dict(),
            "hyper_parameters": {**model.hparams, "_class_path": "vit.classifier.ViTClassifier"},
            "datamodule_hyper_parameters": {**data.hparams, "_class_path": "vit.two_circles.TwoCircles"},
            "preparation": data.preparation.to_dict(),
            compat.CHECKPOINT_KEY: compat.FORMAT_VERSION,
        },
        path,
    )


def write_image(path: Path, value: int, mode: str, size: tuple[int, int]) -> None:
    """A flat image of gray level `value`, whatever its mode (alpha is dropped when read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "L":
        image = Image.new("L", size, value)
    elif mode == "P":
        image = Image.new("RGB", size, (value,) * 3).quantize()
    elif mode == "RGBA":
        image = Image.new("RGBA", size, (value, value, value, 100))
    else:
        image = Image.new("RGB", size, (value,) * 3)
    image.save(path)


class SeedEachProcess(L.Callback):
    """Seeds each process its own way when training starts, as a run that wants each process to
    draw its own augmentation does: a resumed run that gave every process rank 0's random state
    would then draw other numbers in the others."""

    def on_train_start(self, trainer, pl_module):
        torch.manual_seed(1000 + trainer.global_rank)


def fit(data, model, ckpt_path=None, **trainer) -> None:
    """`model` fitted to `data` on the CPU by a quiet `Trainer(**trainer)`, from `ckpt_path` if
    given."""
    options = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    L.Trainer(**options | trainer).fit(model, data, ckpt_path=ckpt_path)


def fit_in_two_processes(*runs: dict) -> None:
    """`fit(**run)` for each of `runs` in turn, under DDP (gloo on the CPU) in two processes that
    Lightning takes for a launcher's (`strategy="ddp"`): the same two for every run, where
    `ddp_spawn` starts two for each fit, each importing torch, Lightning and vit again. Each process
    gets its own copy of the runs' data modules, models and callbacks, as `ddp_spawn` gives it."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    # pickled here: handed over as they are, the models' tensors would be shared memory, one copy
    # of the weights that both processes' optimizers step
    torch.multiprocessing.spawn(fit_runs, args=(port, pickle.dumps(runs)), nprocs=2)


def fit_runs(rank: int, port: int, runs: bytes) -> None:
    """One of `fit_in_two_processes`' processes: what a launcher tells DDP's process `rank`."""
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
                   "NODE_RANK": "0", "LOCAL_RANK": str(rank), "RANK": str(rank)}  # fmt: skip
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))  # the cores shared, as ddp_spawn does
    for run in pickle.loads(runs):
        fit(**run, strategy="ddp", devices=2)


def make_folders(root: Path, classes=("ant", "bee", "cat"), per_class: dict | None = None) -> Path:
    """`root/<split>/<class>/NN.png`; image j of class c is flat gray 10*c + j + 1 (+ 100 in the
    test split), so each pixel tells the file, its label and its split."""
    per_class = per_class or {"train": 6, "test": 2}
    for split, count in per_class.items():
        for c, name in enumerate(classes):
            for j in range(count):
                k = c * count + j
                value = 10 * c + j + 1 + (100 if split == "test" else 0)
                write_image(root / split / name / f"{j:02d}.png", value, MODES[k % 4], SIZES[k % 4])
    return root


def write_idx(path: Path, array: np.ndarray) -> None:
    """An IDX file as Fashion-MNIST ships them (gzip, unsigned bytes, big-endian sizes)."""
    header = b"\x00\x00\x08" + bytes([array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def command_error(command, args, capsys) -> tuple[int, str]:
    """Run a command's `main(args)` that must fail; its exit status and the one line it printed
    to stderr (checked to be one line starting with `error: `, with no traceback or usage text)."""
    import pytest

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        command([str(a) for a in args])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), lines
    assert "Traceback" not in err and "usage:" not in err, err
    return exit_info.value.code, lines[-1]


def explicit_attention_weights(model, images):
    """The tokens of `model` (a ViT) and every block's attention weights (batch, heads, tokens,
    tokens), from the explicit path, recorded by plain hooks on each `attend`: the reference that
    `vit.interpret.maps` is tested against."""
    weights, attns = [], [block.attn for block in model.blocks]
    fused = [attn.fused for attn in attns]
    hooks = [attn.attend.register_forward_hook(lambda m, args, w: weights.append(w)) for attn in attns]
    try:
        for attn in attns:
            attn.fused = False
        tokens = model.forward_features(images)
    finally:
        for attn, flag, hook in zip(attns, fused, hooks, strict=True):
            attn.fused = flag
            hook.remove()
    return tokens, weights


class UnsafePayload:
    """An object whose unpickling runs code: it creates the file `marker`. Saved in a checkpoint, it
    proves that a reader loads with weights_only (the marker stays absent) and refuses the file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def noise_folders(root: Path, per_class: dict[str, int] | None = None) -> Path:
    """`root/<split>/{ant,bee,cat}/NN.png`: `per_class` images a class in each split (default 16 in
    train and 1 in val) of random pixels (16 px), each distinct."""
    noise = torch.Generator().manual_seed(0)
    for split, count in (per_class or {"train": 16, "val": 1}).items():
        for name in ("ant", "bee", "cat"):
            (root / split / name).mkdir(parents=True)
            for j in range(count):
                pixels = torch.randint(0, 256, (16, 16, 3), dtype=torch.uint8, generator=noise).numpy()
                Image.fromarray(pixels).save(root / split / name / f"{j:02d}.png")
    return root
