"""The CNN peer of the CPU figures: airbench94's network and recipe, trained on this CPU for a
wall-clock budget, on this project's CIFAR-10 copy.

airbench itself trains on CUDA only (`benchmarks/cnn_peer.py` runs it on a GPU). Here the same
network is this project's `AirbenchCNN` (vit/cnn.py) and the same recipe is `vit.teacher`'s
`AirbenchTraining` (the one that trains the ViT's distillation teacher): airbench94's SGD with
Nesterov momentum and decoupled hyper-parameters, its learning-rate shape (`airbench_lr`), label
smoothing 0.2, the stem whitened from the first batch and its bias learning for 3 epochs, batches
of 1,024 images translated by up to 2 pixels (the border reflected) and mirrored in alternate
epochs. It trains on the whole train split (50,000 images; none held out) and is tested on the
test split (10,000), in fp32 or under bf16 autocast where this CPU has native bf16 (`--precision
auto`, the check vit-train makes). Left out, as in the teacher: airbench's Lookahead.

The schedule follows the clock, as `vit.callbacks.TimeBudget` makes vit-train's follow
--trainer.max_time: before each step, progress is the time trained over the budget (`--minutes`,
less room for 1.5 times the last step, so that training ends within it), the learning rate is
airbench's at that progress, and training stops at 1. An airbench epoch count would stand for a
rate that differs by machine and precision; this spends the same minutes everywhere.

At each of `--report-at`'s moments, the first step boundary after it, a copy of the network is
tested without and with airbench's test-time augmentation (level 2: flips and one-pixel
translations, `vit.metrics.predict_probabilities(tta="flip-translate")`), with the clock stopped.
The figures at 5 minutes are those of the 30-minute schedule's network 5 minutes in (its learning
rate still high), not those of a 5-minute schedule. A moment at or after the schedule's end is
the network trained to the end. Each seed is one run; each report is a line on stderr as it is
made (a progress bar beside them on a terminal), the JSON holds every report, and the table
printed at the end each seed's top-1 and its min, median and max over the seeds.

    python benchmarks/cnn_peer_cpu.py --data ../shared/data/cifar10-jpeg --minutes 30 \
        --report-at 5 10 20 30 --seeds 0 1 2 --json cnn_peer_cpu.json  # the defaults, 1.5 h or more
    python benchmarks/cnn_peer_cpu.py --smoke  # a few seconds: made-up images, a narrow network

Each test of the network (two passes over the test split, 7 forward passes an image) takes time
outside the budget. The figures belong in docs/results.md, with the table's first line (the CPU,
its threads, the precision); take them on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from copy import deepcopy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: `lab` and `vit` import from the checkout

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from lab.cifar10_pack import fake_cifar10  # noqa: E402
from lab.machine import hardware  # noqa: E402
from vit.augment import random_crop_flip  # noqa: E402
from vit.cnn import AirbenchCNN  # noqa: E402
from vit.commands.base import USAGE, fail  # noqa: E402
from vit.datamodules import CIFAR10, CIFAR10_CLASSES, InMemory  # noqa: E402
from vit.errors import DataError  # noqa: E402
from vit.memory import keep_freed_memory  # noqa: E402
from vit.metrics import collect_probabilities  # noqa: E402
from vit.preparation import to_float  # noqa: E402
from vit.teacher import AirbenchTraining  # noqa: E402

BATCH_SIZE = 1024  # airbench94's
TRANSLATE = 2  # airbench94's: pixels an image moves each way, the border reflected
EVAL_BATCH = 2000  # airbench's test batches
WIDTHS = (64, 256, 256)  # airbench94's blocks
RESERVE = 1.5  # the room kept at the budget's end, in last steps (TimeBudget's)
# made-up data (5 images a class and split), a narrow network and a budget of about a second
SMOKE = dict(per_class=5, widths=(16, 64, 64), minutes=0.02, report_at=[0.005, 0.01, 0.02])


def resolve_precision(precision: str) -> str:
    """The precision to train in, fp32 or bf16: `auto` is bf16 where this CPU has native bf16
    (AVX-512 BF16 or AMX), as vit-train decides; bf16 asked for on a CPU without it is fp32, with
    vit-train's one-line note (emulated bf16 is many times slower)."""
    from vit.commands.train import precision_for_this_cpu
    from vit.optim import cpu_has_native_bf16

    if precision == "auto":
        return "bf16" if cpu_has_native_bf16() else "fp32"
    if precision == "bf16" and precision_for_this_cpu("bf16-mixed", "cpu") != "bf16-mixed":
        return "fp32"
    return precision


def autocast_for(precision: str) -> Callable[[], AbstractContextManager]:
    """The context of a forward pass in `precision` ("fp32" or "bf16") on the CPU."""
    if precision == "bf16":
        return lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    return nullcontext


def epoch_batches(
    train: InMemory, mirrored: torch.Tensor, epoch: int, batch_size: int = BATCH_SIZE
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """An epoch of airbench94's training batches from uint8 images: shuffled, the last partial
    batch dropped (a split smaller than a batch is one batch), each image translated by up to
    `TRANSLATE` pixels with its border reflected, and mirrored where `mirrored` says in even
    epochs and where it does not in odd ones (airbench's alternating flips), as float in [0, 1]."""
    flip = mirrored ^ bool(epoch % 2)
    order = torch.randperm(len(train))
    for index in order.split(batch_size)[: max(len(train) // batch_size, 1)]:
        images = random_crop_flip(train.images[index], TRANSLATE, flip[index], padding_mode="reflect")
        yield to_float(images), train.labels[index]


def top1(
    network: torch.nn.Module,
    test: InMemory,
    tta: str,
    autocast: Callable[[], AbstractContextManager],
    progress: bool = False,
    desc: str = "test split",
) -> float:
    """Top-1 accuracy of `network` on the split `test` with test-time augmentation `tta`."""
    with autocast():
        probabilities, labels = collect_probabilities(
            network, test, EVAL_BATCH, tta=tta, progress=progress, desc=desc
        )
    return float((probabilities.argmax(dim=-1) == labels).float().mean())


def train_seed(
    train: InMemory,
    test: InMemory,
    seed: int,
    minutes: float,
    report_at: list[float],
    precision: str = "fp32",
    widths: tuple[int, int, int] = WIDTHS,
    progress: bool = False,
) -> dict:
    """One run: an `AirbenchCNN` trained with airbench94's recipe on `train` (uint8 images) for
    `minutes` of wall-clock time, the schedule following the clock, and tested on `test` at the
    moments `report_at` (minutes, ascending) with the clock stopped. Its steps, epochs and
    seconds, and a report for each moment: the minute asked for, the minute and step it was
    taken at, and the test top-1 without TTA (`acc`) and with airbench's (`acc_tta`)."""
    torch.manual_seed(seed)
    autocast = autocast_for(precision)
    budget, moments, reports = 60 * minutes, [60 * m for m in report_at], []
    start, paused = time.perf_counter(), 0.0

    def clock() -> float:  # seconds of training: the evaluations' left out
        return time.perf_counter() - start - paused

    bar = tqdm(
        total=round(budget, 1), desc=f"seed {seed}", unit="s", disable=not progress, file=sys.stderr,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s of training{postfix}",
    )  # fmt: skip
    # channels-last, as airbench runs it: oneDNN's NHWC kernels (a Zen 3 in fp32: 1.13-1.17x
    # training, 1.47-1.53x testing; benchmarks/memory_format.py)
    network = AirbenchCNN(len(CIFAR10_CLASSES), train.images.shape[1], widths)
    network = network.to(memory_format=torch.channels_last)
    mirrored = torch.rand(len(train)) < 0.5  # the images the even epochs mirror, drawn once
    network.whiten(next(epoch_batches(train, mirrored, 0))[0])
    training = AirbenchTraining(network, BATCH_SIZE, autocast)
    step, seen, epoch, step_seconds, previous = 0, 0, 0, 0.0, None  # seen: training images

    def report(at: float) -> None:
        nonlocal paused
        began, seconds = time.perf_counter(), clock()
        copy = deepcopy(network).eval()
        where = f"seed {seed} at {seconds / 60:.2f} min"
        accuracy = {
            key: top1(copy, test, tta, autocast, progress, f"{where}, {tta} TTA")
            for key, tta in (("acc", "none"), ("acc_tta", "flip-translate"))
        }
        epochs = seen / len(train)
        reports.append(dict(at_minutes=at / 60, minutes=seconds / 60, steps=step, epochs=epochs, **accuracy))
        tqdm.write(  # a line at each moment, also where no bar is drawn (a log, not a terminal)
            f"{where} ({step} steps, {epochs:.2f} epochs): top-1 {accuracy['acc']:.4f}, "
            f"with TTA {accuracy['acc_tta']:.4f}",
            file=sys.stderr,
        )
        paused += time.perf_counter() - began

    training_ended = False
    while not training_ended:
        training.start_epoch(epoch)
        for images, labels in epoch_batches(train, mirrored, epoch):
            now = clock()
            if previous is not None:  # the last step with its batch's augmentation
                step_seconds = now - previous
            while moments and now >= moments[0]:
                report(moments.pop(0))
            room = budget - RESERVE * step_seconds
            schedule = now / room if room > 0 else 1.0
            if schedule >= 1:
                training_ended = True
                break
            training.step(images, labels, schedule)
            step, seen, previous = step + 1, seen + len(labels), now
            bar.update(min(now, budget) - bar.n)
            bar.set_postfix_str(f", epoch {epoch}, step {step}")
        else:
            epoch += 1
    seconds = clock()
    bar.update(min(seconds, budget) - bar.n)
    bar.close()
    while moments:  # at or after the schedule's end: the network trained to the end
        report(moments.pop(0))
    return dict(seed=seed, steps=step, epochs=seen / len(train), seconds=seconds, reports=reports)


def spread(values: list[float]) -> dict[str, float]:
    return dict(min=min(values), median=statistics.median(values), max=max(values))


def over_seeds(runs: list[dict], report_at: list[float]) -> list[dict]:
    """For each moment of `report_at`: the min, median and max over the runs of the top-1
    without and with TTA, of the minute it was taken at and of the epochs trained."""
    rows = []
    for i, at in enumerate(report_at):
        taken = [run["reports"][i] for run in runs]
        rows.append(
            dict(
                at_minutes=at,
                **{key: spread([r[key] for r in taken]) for key in ("acc", "acc_tta", "minutes", "epochs")},
            )
        )
    return rows


def run(
    root: str | Path,
    seeds: list[int],
    minutes: float,
    report_at: list[float],
    precision: str = "auto",
    widths: tuple[int, int, int] = WIDTHS,
    progress: bool = False,
) -> dict:
    """The peer's runs, one a seed, on the CIFAR-10 copy at `root` (its whole train split; its
    test split), in `precision` (`resolve_precision`), with what they ran on."""
    data = CIFAR10(root=str(root), download=False)
    train, test = (InMemory(*data.read_split(name)) for name in ("train", "test"))
    precision = resolve_precision(precision)
    report_at = sorted(set(report_at))
    runs = [train_seed(train, test, s, minutes, report_at, precision, widths, progress) for s in seeds]
    return dict(
        data=str(Path(root).resolve()),
        images={"train": len(train), "test": len(test)},
        hardware=hardware(torch.device("cpu")),
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        precision=precision,
        minutes=minutes,
        report_at=report_at,
        batch_size=BATCH_SIZE,
        widths=list(widths),
        tta="flip-translate",
        runs=runs,
        over_seeds=over_seeds(runs, report_at),
    )


def table(result: dict) -> str:
    """The results as markdown: a line saying what ran where, then one row a moment: each seed's
    top-1 without / with TTA, their min, median and max, and the epochs trained (median)."""
    images, seeds = result["images"], [r["seed"] for r in result["runs"]]
    width = "" if result["widths"] == list(WIDTHS) else f" (widths {result['widths']})"
    lines = [
        f"AirbenchCNN{width} with airbench94's recipe for {result['minutes']:g} min on the CPU, "
        f"{result['precision']}; data {result['data']} ({images['train']:,} training, "
        f"{images['test']:,} test images); {result['hardware']}",
        "",
        "top-1 on the test split, without / with airbench's TTA (flips and 1-pixel translations)",
        "",
        "| minutes | " + " | ".join(f"seed {s}" for s in seeds) + " | min | median | max | epochs |",
        "|---:|" + "---|" * (len(seeds) + 3) + "---:|",
    ]
    for i, row in enumerate(result["over_seeds"]):
        cells = [
            f"{r['acc']:.4f} / {r['acc_tta']:.4f}" for r in (run["reports"][i] for run in result["runs"])
        ]
        cells += [f"{row['acc'][k]:.4f} / {row['acc_tta'][k]:.4f}" for k in ("min", "median", "max")]
        lines.append(
            f"| {row['at_minutes']:g} | " + " | ".join(cells) + f" | {row['epochs']['median']:.2f} |"
        )
    return "\n".join(lines)


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (`error: ...`, exit status 2), not the usage text."""

    def error(self, message: str):
        fail(f"{message} (options: {self.prog} --help)", USAGE)


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="CIFAR-10: torchvision's copy or image folders (not with --smoke)")
    parser.add_argument("--minutes", type=float, help="the training budget of each seed (default 30)")
    parser.add_argument(
        "--report-at", type=float, nargs="+", metavar="MINUTES",
        help="moments of training to test the network at (default 5 10 20 30)",
    )  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run a seed")
    parser.add_argument(
        "--precision", choices=("auto", "fp32", "bf16"), default="auto",
        help="bf16: autocast; auto: bf16 where the CPU has native bf16, else fp32",
    )  # fmt: skip
    parser.add_argument("--json", help="write the results there")
    parser.add_argument(
        "--smoke", action="store_true",
        help=f"made-up images, a narrow network, {SMOKE['minutes']:g} min, reports at {SMOKE['report_at']}",
    )  # fmt: skip
    args = parser.parse_args(None if argv is None else [str(a) for a in argv])
    # every check before anything is read or trained
    if args.smoke and args.data is not None:
        fail("--smoke makes its own images: leave out --data", USAGE)
    if not args.smoke and args.data is None:
        fail("--data is required (a CIFAR-10 copy), or --smoke", USAGE)
    defaults = SMOKE if args.smoke else dict(minutes=30.0, report_at=[5.0, 10.0, 20.0, 30.0])
    minutes = defaults["minutes"] if args.minutes is None else args.minutes
    report_at = defaults["report_at"] if args.report_at is None else args.report_at
    if not (minutes > 0 and math.isfinite(minutes)):
        fail(f"--minutes {minutes:g}: the training budget must be a number of minutes above 0", USAGE)
    if bad := [m for m in report_at if not 0 < m <= minutes]:
        fail(f"--report-at {bad[0]:g}: each moment must lie in (0, --minutes {minutes:g}]", USAGE)
    if args.json is not None and not Path(args.json).resolve().parent.is_dir():
        fail(f"--json {args.json}: its folder does not exist")
    if args.data is not None:
        try:
            CIFAR10(root=args.data, download=False)
        except DataError as e:
            fail(e)
    keep_freed_memory()  # as vit-train does: the comparison is of networks, not of allocators
    progress = sys.stderr.isatty()
    with tempfile.TemporaryDirectory(prefix="cnn-peer-") as folder:
        if args.smoke:
            root, widths = fake_cifar10(Path(folder) / "cifar10-jpeg", SMOKE["per_class"]), SMOKE["widths"]
        else:
            root, widths = args.data, WIDTHS
        try:
            result = run(root, args.seeds, minutes, report_at, args.precision, widths, progress)
        except DataError as e:  # a split missing or unreadable
            fail(e)
    if args.smoke:
        result["data"] = "made-up images (--smoke)"
    print(table(result))
    if args.json is not None:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
