"""Helpers shared by the CLI tests."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A few seconds of training: the smallest preset on a few hundred two-circles images.
TINY = [
    "--config", str(ROOT / "configs/two_circles.yaml"),
    "--model.preset", "micro",
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


def run_train(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python train.py ARGS` in a subprocess, as a user runs it."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
