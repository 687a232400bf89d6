"""Does pretraining help? Pretrain on CIFAR-10 classes 0-4, fine-tune on 100 images per class of
classes 5-9, against the same model trained from scratch on the same images for the same steps.

    python studies/finetune/finetune.py --cifar ../shared/data/cifar10-jpeg --out runs/finetune_study
    python studies/finetune/finetune.py --cifar DIR --pretrain-epochs 1 --epochs 2 --out /tmp/quick  # smoke

Everything goes through the commands a user runs: `vit-train fit` with configs/cifar10_cpu.yaml's
model (width 192, depth 4) on image folders, `vit-export`, `vit-train fit --model.pretrained` and
`vit-eval`. The folders are symbolic links into the CIFAR-10 JPEG tree (`--cifar`, laid out
train/<class>/, test/<class>/):
- `first/`: classes 0-4 (airplane ... deer), all their training images (10% held out for
  validation) and test images;
- `second/`: classes 5-9 (dog ... truck), `--per-class` training images per class, the next
  `--val-per-class` (50) of the training set for validation, and all their test images (5,000).

Both runs on `second/` use the same config, seed, batch size, epochs (so steps) and learning rate;
fine-tuning adds `--model.layer_decay`. Writes `results.json` and `table.md` into `--out`, and
prints the table. Prediction, stated before the first run: fine-tuning beats training from
scratch by more than 10 points of test top-1 (500 images are far too few for a ViT from scratch;
features of the other five classes carry over).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRST = ["airplane", "automobile", "bird", "cat", "deer"]
SECOND = ["dog", "frog", "horse", "ship", "truck"]
CONFIG = str(ROOT / "configs" / "cifar10_cpu.yaml")
PRECISION = "32-true"  # set by --precision


def link_folders(cifar: Path, out: Path, per_class: int, val_per_class: int = 50) -> tuple[Path, Path]:
    """The two data sets as folders of symbolic links (made again each run)."""
    first, second = out / "data" / "first", out / "data" / "second"
    shutil.rmtree(out / "data", ignore_errors=True)
    for name in FIRST:
        for split in ("train", "test"):
            (first / split).mkdir(parents=True, exist_ok=True)
            (first / split / name).symlink_to((cifar / split / name).resolve())
    for name in SECOND:
        files = sorted((cifar / "train" / name).iterdir())
        val = files[per_class : per_class + val_per_class]
        for split, chosen in (("train", files[:per_class]), ("val", val)):
            folder = second / split / name
            folder.mkdir(parents=True)
            for file in chosen:
                (folder / file.name).symlink_to(file.resolve())
        (second / "test").mkdir(parents=True, exist_ok=True)
        (second / "test" / name).symlink_to((cifar / "test" / name).resolve())
    return first, second


def run(command: list[str], log: Path) -> float:
    """Run a command of this project (output into `log`); its wall time in seconds."""
    start = time.perf_counter()
    print("$", " ".join(command), flush=True)
    with log.open("w") as f:
        done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=os.environ)
    if done.returncode:
        sys.exit(f"failed ({done.returncode}); see {log}")
    return time.perf_counter() - start


def train(out: Path, name: str, root: Path, epochs: int, batch_size: int, *extra: str) -> float:
    data = {
        "class_path": "vit.datamodules.ImageFolders",
        "init_args": {"root": str(root), "batch_size": batch_size, "crop_padding": 4, "flip": True},
    }
    return run(
        [
            str(Path(sys.executable).parent / "vit-train"), "fit", "--config", CONFIG,
            "--data", json.dumps(data), "--trainer.max_epochs", str(epochs), "--trainer.max_time", "null",
            "--trainer.logger.init_args.save_dir", str(out), "--trainer.logger.init_args.name", name,
            "--trainer.logger.init_args.version", "run", "--trainer.enable_progress_bar", "false",
            "--trainer.precision", PRECISION,
            "--model.compile", "false",  # eagerly, as the recorded runs trained (before the config compiled)
            *extra,
        ],
        out / f"{name}.log",
    )  # fmt: skip


def test_top1(out: Path, name: str) -> float:
    ckpt = out / name / "run" / "checkpoints" / "best.ckpt"
    vit_eval = str(Path(sys.executable).parent / "vit-eval")
    run([vit_eval, "--ckpt", str(ckpt), "--out", str(out / name / "eval")], out / f"{name}-eval.log")
    return json.loads((out / name / "eval" / "metrics.json").read_text())["top1"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cifar", type=Path, required=True, help="CIFAR-10 as train/<class>/, test/<class>/")
    parser.add_argument("--out", type=Path, default=Path("runs/finetune_study"))
    parser.add_argument("--pretrain-epochs", type=int, default=15)
    parser.add_argument("--epochs", type=int, default=60, help="epochs on the 5 x per-class images")
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--val-per-class", type=int, default=50, help="validation images of the small set")
    parser.add_argument("--batch-size", type=int, default=64, help="of the runs on the small set")
    parser.add_argument("--layer-decay", type=float, default=0.75)
    parser.add_argument(
        "--precision",
        default="32-true",
        help="bf16-mixed only on a CPU with native bf16 (AVX-512 BF16, AMX); emulated, it is 100x slower",
    )
    args = parser.parse_args(argv)
    global PRECISION
    PRECISION = args.precision
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    first, second = link_folders(args.cifar, out, args.per_class, args.val_per_class)
    results = {"per_class": args.per_class, "epochs": args.epochs, "batch_size": args.batch_size}
    results |= {"precision": args.precision, "pretrain_epochs": args.pretrain_epochs}
    results["pretrain_seconds"] = train(out, "pretrain", first, args.pretrain_epochs, 128)
    results["pretrain_top1"] = test_top1(out, "pretrain")
    exported = out / "pretrained"
    vit_export = str(Path(sys.executable).parent / "vit-export")
    ckpt = out / "pretrain" / "run" / "checkpoints" / "best.ckpt"
    run([vit_export, "--ckpt", str(ckpt), "--out", str(exported)], out / "export.log")
    finetune = ["--model.pretrained", str(exported), "--model.layer_decay", str(args.layer_decay)]
    for name, extra in (("finetune", finetune), ("scratch", [])):
        results[f"{name}_seconds"] = train(out, name, second, args.epochs, args.batch_size, *extra)
        results[f"{name}_top1"] = test_top1(out, name)
    steps = args.epochs * (5 * args.per_class // args.batch_size)
    small = f"classes 5-9, {5 * args.per_class} images"
    rows = [
        ("pretrain", "classes 0-4, 22,500 images", str(args.pretrain_epochs), "pretrain", " (classes 0-4)"),
        (f"fine-tune (layer decay {args.layer_decay})", small, f"{args.epochs} ({steps})", "finetune", ""),
        ("from scratch", small, f"{args.epochs} ({steps})", "scratch", ""),
    ]
    table = "\n".join(
        ["| run | data | epochs (steps) | minutes | test top-1 |", "|---|---|---|---|---|"]
        + [
            f"| {run_name} | {data} | {epochs} | {results[f'{key}_seconds'] / 60:.1f} | "
            f"{results[f'{key}_top1']:.4f}{note} |"
            for run_name, data, epochs, key, note in rows
        ]
    )
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "table.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
