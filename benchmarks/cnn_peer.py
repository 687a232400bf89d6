"""The CNN peer of the GPU speed check: airbench's 94% schedule on this project's CIFAR-10 copy.

Keller Jordan's airbench (`pip install airbench==0.1.8`) trains a small CNN to 94% test accuracy
on the original CIFAR-10 in about 3.8 seconds of an A100 (its README). That figure is another
machine's, on other files; this script measures the peer here instead: the same copy of CIFAR-10
our ViT reads (the whole train split of 50,000 images, the test split of 10,000), on the same GPU,
in the same run of the machine. It writes both splits in airbench's format (`cifar10/train.pt`,
`cifar10/test.pt`, read by airbench from the working directory), runs `airbench.warmup94()` once
(one step: the CUDA and cuDNN start-up), then `airbench.train94()` `--runs` times, as airbench's
README does, and for each run reports:

- seconds: the wall time of `train94()` as the README calls it, between CUDA synchronisations:
  loading both splits onto the GPU, building the net, training, a test evaluation after each
  epoch, the final evaluation with test-time augmentation;
- airbench_seconds: the time airbench prints at the end of its table, its own CUDA-event clock of
  the whitening initialisation, the training epochs and the final evaluation only (no loading, no
  per-epoch evaluations);
- acc and acc_tta: test top-1 of the returned net, by `airbench.evaluate` without test-time
  augmentation and with it (level 2: flips and one-pixel translations, airbench's default).

    python benchmarks/cnn_peer.py --data ../shared/data/cifar10-jpeg --runs 5 --json cnn_peer.json

airbench needs CUDA (the CPU's peer is `benchmarks/cnn_peer_cpu.py`: airbench94's network and
recipe as this project implements them, trained to a time budget). `--workdir` keeps the written
files (about 180 MB); by default they go to a temporary folder, removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import torch

from vit.commands.base import fail
from vit.datamodules import CIFAR10, CIFAR10_CLASSES
from vit.errors import DataError


def write_airbench_data(root: str | Path, folder: str | Path) -> dict[str, int]:
    """Writes `folder/cifar10/train.pt` and `test.pt` from the CIFAR-10 copy at `root`, in the
    format of `airbench.CifarLoader`: {'images': uint8 (N, 32, 32, 3), 'labels': int64 (N,),
    'classes': names in label order}. Returns the number of images of each split."""
    data = CIFAR10(root=str(root), download=False)
    out = Path(folder) / "cifar10"
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split in ("train", "test"):
        images, labels = data.read_split(split)
        images = images.permute(0, 2, 3, 1).contiguous()  # (N, C, H, W) -> (N, H, W, C), as torchvision's
        record = {"images": images, "labels": labels.to(torch.int64), "classes": list(CIFAR10_CLASSES)}
        torch.save(record, out / f"{split}.pt")
        counts[split] = len(labels)
    return counts


def printed_seconds(log: str) -> float | None:
    """The total_time_seconds of the last row of airbench's table (the row of epoch `eval`)."""
    for line in reversed(log.splitlines()):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[1] == "eval":
            return float(cells[6])
    return None


def run(root: str | Path, runs: int, workdir: str | Path, tta_level: int = 2) -> dict:
    """airbench's warm-up, then `runs` trainings of its 94% schedule on the copy at `root`, with
    the data written to `workdir/cifar10` (on CUDA; the working directory is restored after)."""
    import airbench  # here: importing it turns on cudnn.benchmark

    images = write_airbench_data(root, workdir)
    here = os.getcwd()
    os.chdir(workdir)
    try:
        torch.cuda.synchronize()
        start = time.perf_counter()
        airbench.warmup94()
        torch.cuda.synchronize()
        warmup_seconds = time.perf_counter() - start
        test = airbench.CifarLoader("cifar10", train=False, batch_size=2000)
        results = []
        for i in range(runs):
            log = io.StringIO()
            torch.cuda.synchronize()
            start = time.perf_counter()
            with contextlib.redirect_stdout(log):
                model = airbench.train94(run=i)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            print(log.getvalue(), end="", flush=True)
            results.append(
                dict(
                    seconds=seconds,
                    airbench_seconds=printed_seconds(log.getvalue()),
                    acc=airbench.evaluate(model, test, tta_level=0),
                    acc_tta=airbench.evaluate(model, test, tta_level=tta_level),
                )
            )
    finally:
        os.chdir(here)
    means = {f"mean_{key}": statistics.mean(r[key] for r in results) for key in ("seconds", "acc", "acc_tta")}
    clocked = [r["airbench_seconds"] for r in results if r["airbench_seconds"] is not None]
    return dict(
        data=str(Path(root).resolve()),
        gpu=torch.cuda.get_device_name(0),
        torch=torch.__version__,
        airbench=version("airbench"),
        tta_level=tta_level,
        images=images,
        warmup_seconds=warmup_seconds,
        runs=results,
        **means,
        mean_airbench_seconds=statistics.mean(clocked) if clocked else None,
    )


def summary(result: dict) -> str:
    """The results as a few lines for the terminal."""
    images = result["images"]
    lines = [
        f"airbench {result['airbench']} train94 on {result['data']} ({images['train']:,} training, "
        f"{images['test']:,} test images), {result['gpu']}, torch {result['torch']}"
    ]
    for i, r in enumerate(result["runs"]):
        clock = "" if r["airbench_seconds"] is None else f" (airbench's clock {r['airbench_seconds']:.2f} s)"
        lines.append(
            f"run {i}: {r['seconds']:.2f} s{clock}, test acc {r['acc']:.4f}, with TTA {r['acc_tta']:.4f}"
        )
    clock = result["mean_airbench_seconds"]
    clock = "" if clock is None else f" (airbench's clock {clock:.2f} s)"
    lines.append(
        f"mean of {len(result['runs'])}: {result['mean_seconds']:.2f} s{clock}, test acc "
        f"{result['mean_acc']:.4f}, with TTA {result['mean_acc_tta']:.4f}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", required=True, help="CIFAR-10: torchvision's copy or image folders")
    parser.add_argument("--runs", type=int, default=5, help="trainings after the warm-up")
    parser.add_argument("--json", help="write the results there")
    parser.add_argument("--workdir", help="where airbench's files go and stay (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    # every check before anything is written or trained
    try:
        CIFAR10(root=args.data, download=False)
    except DataError as e:
        fail(e)
    if args.json is not None and not Path(args.json).resolve().parent.is_dir():
        fail(f"--json {args.json}: its folder does not exist")
    try:
        import airbench  # noqa: F401
    except ImportError as e:
        fail(f"airbench cannot be imported ({e}): pip install airbench==0.1.8")
    if not torch.cuda.is_available():
        fail(
            f"airbench trains on CUDA and torch {torch.__version__} finds no CUDA device "
            f"(on a CPU: benchmarks/cnn_peer_cpu.py)"
        )
    with contextlib.ExitStack() as stack:
        if args.workdir is None:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="airbench-"))
        else:
            workdir = args.workdir
            Path(workdir).mkdir(parents=True, exist_ok=True)
        result = run(args.data, args.runs, workdir)
    print(summary(result))
    if args.json is not None:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
