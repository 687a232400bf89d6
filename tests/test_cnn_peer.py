"""benchmarks/cnn_peer.py: the files it writes are airbench's format, and without CUDA it stops.
benchmarks/cnn_peer_cpu.py: airbench94's batches, a schedule that follows the clock with the
evaluations off it, a report for each moment and seed, and one-line errors."""

import importlib.util
import json
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import command_error
from PIL import Image

from benchmarks import cnn_peer, cnn_peer_cpu
from vit.datamodules import CIFAR10, CIFAR10_CLASSES, InMemory

PER_CLASS = {"train": 2, "test": 1}
HAS_AIRBENCH = importlib.util.find_spec("airbench") is not None


@pytest.fixture
def cifar_folders(tmp_path: Path) -> Path:
    """`root/<split>/<class>/N.jpg`: 32x32 RGB noise, different in every image and channel."""
    generator = np.random.default_rng(0)
    root = tmp_path / "cifar10-jpeg"
    for split, count in PER_CLASS.items():
        for name in CIFAR10_CLASSES:
            (root / split / name).mkdir(parents=True)
            for j in range(count):
                pixels = generator.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{j}.jpg", quality=90)
    return root


def test_written_files_are_nhwc_uint8_with_labels_in_cifar_order(cifar_folders, tmp_path):
    counts = cnn_peer.write_airbench_data(cifar_folders, tmp_path / "work")
    assert counts == {"train": 20, "test": 10}
    data = CIFAR10(root=str(cifar_folders))
    for split, count in PER_CLASS.items():
        saved = torch.load(tmp_path / "work" / "cifar10" / f"{split}.pt", weights_only=True)
        images, labels = saved["images"], saved["labels"]
        assert set(saved) == {"images", "labels", "classes"}
        assert images.shape == (10 * count, 32, 32, 3) and images.dtype == torch.uint8
        assert images.is_contiguous()
        assert labels.dtype == torch.int64
        assert labels.tolist() == [c for c in range(10) for _ in range(count)]
        assert saved["classes"] == CIFAR10_CLASSES
        # pixel [n, y, x, c] of the file is pixel [n, c, y, x] of the data module's image
        nchw, module_labels = data.read_split(split)
        assert torch.equal(images, nchw.permute(0, 2, 3, 1))
        assert torch.equal(labels, module_labels)
        # and the decoded file itself, read without the data module: the last image of the truck class
        with Image.open(cifar_folders / split / "truck" / f"{count - 1}.jpg") as image:
            assert np.array_equal(images[-1].numpy(), np.asarray(image.convert("RGB")))


def test_airbench_reads_the_files(cifar_folders, tmp_path):
    """airbench's own loader (on the CPU: its `gpu` is torch.load's map_location) reads what we
    write: its keys, its NHWC -> NCHW permute, labels and classes."""
    airbench = pytest.importorskip("airbench")
    cnn_peer.write_airbench_data(cifar_folders, tmp_path)
    nchw, labels = CIFAR10(root=str(cifar_folders)).read_split("train")
    loader = airbench.CifarLoader(str(tmp_path / "cifar10"), train=True, batch_size=4, gpu="cpu")
    assert loader.images.shape == (20, 3, 32, 32)
    assert torch.equal(loader.images, nchw.half() / 255)
    assert torch.equal(loader.labels, labels) and loader.classes == CIFAR10_CLASSES
    assert len(airbench.CifarLoader(str(tmp_path / "cifar10"), train=False, gpu="cpu").labels) == 10


def test_printed_seconds_reads_the_last_row_of_airbench_table(capsys):
    log = (
        "| run | epoch | train_loss | train_acc | val_acc | tta_val_acc | total_time_seconds |\n"
        "|   0 |     9 |     0.0009 |    0.9043 |  0.9381 |             |             3.1000 |\n"
        "|     |  eval |     0.0009 |    0.9043 |  0.9381 |      0.9412 |             3.4567 |\n"
    )
    assert cnn_peer.printed_seconds(log) == 3.4567
    assert cnn_peer.printed_seconds("nothing printed") is None
    if HAS_AIRBENCH:  # the rows airbench itself prints at the end of train94
        from airbench.utils import print_training_details

        capsys.readouterr()
        row = dict(
            run=None,
            epoch="eval",
            train_loss=0.001,
            val_acc=0.9381,
            tta_val_acc=0.94,
            total_time_seconds=3.75,
        )
        print_training_details(row, is_final_entry=True)
        assert cnn_peer.printed_seconds(capsys.readouterr().out) == 3.75


@pytest.mark.parametrize("missing", ["cuda", "airbench"])
def test_without_cuda_or_airbench_one_line_and_nothing_written(
    missing, cifar_folders, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if missing == "airbench":
        monkeypatch.setitem(sys.modules, "airbench", None)  # import airbench: ImportError
    out, work = tmp_path / "out.json", tmp_path / "work"
    args = ["--data", cifar_folders, "--runs", "1", "--json", out, "--workdir", work]
    status, line = command_error(cnn_peer.main, args, capsys)
    assert status == 1
    assert ("CUDA" in line) if missing == "cuda" and HAS_AIRBENCH else ("airbench" in line), line
    assert not out.exists() and not work.exists()


def test_a_missing_data_folder_is_one_line(tmp_path, capsys):
    status, line = command_error(cnn_peer.main, ["--data", tmp_path / "nowhere"], capsys)
    assert status == 1 and "CIFAR-10 not found" in line


def test_run_times_each_training_in_the_workdir_and_restores_the_cwd(cifar_folders, tmp_path, monkeypatch):
    """run() with a stand-in for airbench (no CUDA here): it warms up once, trains `runs` times
    with the files in its working directory, evaluates with and without TTA, and goes back."""
    calls = []

    class Loader:
        def __init__(self, path, train=True, batch_size=500):
            assert Path(path, "train.pt" if train else "test.pt").is_file()  # relative to the workdir
            calls.append(("loader", path, train, batch_size))

    def train94(run=0):
        calls.append(("train94", run))
        print(f"|         |   eval  |  0.0009  |  0.9043  |  0.9381  |  0.9412  |  {3.5 + run:.4f}  |")
        return f"model {run}"

    fake = type(sys)("airbench")
    fake.warmup94 = lambda: calls.append(("warmup94",))
    fake.train94, fake.CifarLoader = train94, Loader
    fake.evaluate = lambda model, loader, tta_level=0: 0.9 + tta_level / 100
    monkeypatch.setitem(sys.modules, "airbench", fake)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "a GPU")
    monkeypatch.setattr(cnn_peer, "version", lambda name: "0.1.8")
    here = Path.cwd()

    result = cnn_peer.run(cifar_folders, runs=2, workdir=tmp_path / "work")
    assert Path.cwd() == here
    assert calls == [("warmup94",), ("loader", "cifar10", False, 2000), ("train94", 0), ("train94", 1)]
    assert [r["airbench_seconds"] for r in result["runs"]] == [3.5, 4.5]
    assert all(r["acc"] == 0.9 and r["acc_tta"] == 0.92 and r["seconds"] >= 0 for r in result["runs"])
    assert result["mean_airbench_seconds"] == 4.0 and result["mean_acc_tta"] == 0.92
    assert result["images"] == {"train": 20, "test": 10} and result["gpu"] == "a GPU"
    assert result["data"] == str(cifar_folders.resolve()) and result["airbench"] == "0.1.8"
    assert cnn_peer.summary(result).splitlines()[-1].startswith("mean of 2: ")


# ---- benchmarks/cnn_peer_cpu.py ----


def test_cpu_peer_batches_alternate_flips_and_drop_the_last_partial_batch(monkeypatch):
    """Without translation, each image of an epoch is itself or its mirror: mirrored where
    `mirrored` says in even epochs, where it does not in odd ones; 10 images in batches of 4 are
    2 batches (the last 2 images dropped), 3 images one batch."""
    monkeypatch.setattr(cnn_peer_cpu, "TRANSLATE", 0)
    images = torch.randint(0, 256, (10, 3, 4, 4), dtype=torch.uint8)
    train = InMemory(images, torch.arange(10))  # the label is the image's index
    mirrored = torch.tensor([True, False] * 5)
    for epoch in range(2):
        batches = list(cnn_peer_cpu.epoch_batches(train, mirrored, epoch, batch_size=4))
        assert [len(labels) for _, labels in batches] == [4, 4]
        for batch, labels in batches:
            assert batch.dtype == torch.float32
            for image, i in zip(batch, labels.tolist(), strict=True):
                original = images[i].float() / 255
                expected = original.flip(-1) if bool(mirrored[i]) != (epoch == 1) else original
                torch.testing.assert_close(image, expected)
    small = InMemory(images[:3], torch.arange(3))
    assert [len(y) for _, y in cnn_peer_cpu.epoch_batches(small, mirrored[:3], 0, batch_size=4)] == [3]


def test_cpu_peer_schedule_follows_the_clock_with_evaluations_off_it(monkeypatch):
    """On a made-up clock: each step takes 10 s and each evaluation 1000 s. The learning rate's
    progress is the time trained over the budget less 1.5 last steps (60 - 15 s); training stops
    when it reaches 1, within the budget; the report at 0.25 min is taken at the first step after
    it (20 s), one at or after the end with the network trained to the end; evaluations cost the
    clock nothing."""
    now = [0.0]
    monkeypatch.setattr(cnn_peer_cpu, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    progresses, epochs = [], []

    class Training:
        def __init__(self, network, batch_size, autocast):
            assert batch_size == cnn_peer_cpu.BATCH_SIZE

        def start_epoch(self, epoch):
            epochs.append(epoch)

        def step(self, images, labels, progress):
            progresses.append(progress)
            now[0] += 10

    def top1(network, test, tta, autocast, progress=False, desc=""):
        assert not network.training  # a copy, in eval mode
        now[0] += 1000
        return {"none": 0.5, "flip-translate": 0.6}[tta]

    monkeypatch.setattr(cnn_peer_cpu, "AirbenchTraining", Training)
    monkeypatch.setattr(cnn_peer_cpu, "top1", top1)
    images, labels = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8), torch.arange(8) % 10
    train = test = InMemory(images, labels)
    result = cnn_peer_cpu.train_seed(train, test, 0, minutes=1, report_at=[0.25, 1], widths=(8, 16, 16))
    assert progresses == pytest.approx([0, 10 / 45, 20 / 45, 30 / 45, 40 / 45])
    assert epochs == [0, 1, 2, 3, 4, 5]  # one batch an epoch; the 6th stopped before its step
    assert result["steps"] == 5 and result["epochs"] == 5 and result["seconds"] == 50
    first, last = result["reports"]
    assert first == dict(at_minutes=0.25, minutes=20 / 60, steps=2, epochs=2, acc=0.5, acc_tta=0.6)
    assert last == dict(at_minutes=1, minutes=50 / 60, steps=5, epochs=5, acc=0.5, acc_tta=0.6)


@pytest.mark.slow
def test_cpu_peer_smoke_reports_every_moment_of_every_seed(tmp_path, capsys):
    """`--smoke` end to end, on one thread (tiny matrices): made-up images, each seed trained for
    its budget and tested at each moment, the JSON and the table agreeing."""
    out = tmp_path / "peer.json"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cnn_peer_cpu.main(["--smoke", "--seeds", "0", "1", "--precision", "fp32", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    result = json.loads(out.read_text())
    smoke = cnn_peer_cpu.SMOKE
    assert result["images"] == {"train": 10 * smoke["per_class"], "test": 10 * smoke["per_class"]}
    assert result["precision"] == "fp32" and result["report_at"] == smoke["report_at"]
    assert [run["seed"] for run in result["runs"]] == [0, 1]
    for run in result["runs"]:
        assert run["steps"] >= 1 and run["seconds"] > 0
        reports = run["reports"]
        assert [r["at_minutes"] for r in reports] == smoke["report_at"]
        assert all(r["minutes"] >= r["at_minutes"] or r is reports[-1] for r in reports)
        assert [r["steps"] for r in reports] == sorted(r["steps"] for r in reports)
        assert reports[-1]["steps"] == run["steps"]  # the last moment: the network trained to the end
        assert all(0 <= r[key] <= 1 for r in reports for key in ("acc", "acc_tta"))
    for i, row in enumerate(result["over_seeds"]):
        for key in ("acc", "acc_tta"):
            values = [run["reports"][i][key] for run in result["runs"]]
            assert row[key] == dict(min=min(values), median=sum(values) / 2, max=max(values))
    printed = capsys.readouterr()
    table = printed.out.splitlines()
    # a line at each moment on stderr, though no bar is drawn there (not a terminal under pytest)
    moments = [
        line
        for line in printed.err.splitlines()
        if re.match(r"seed [01] at .* top-1 0\.\d{4}, with TTA", line)
    ]
    assert len(moments) == 2 * len(smoke["report_at"])
    rows = [line for line in table if line.startswith("| 0.0")]
    assert len(rows) == 3 and table[4].startswith("| minutes | seed 0 | seed 1 | min | median | max |")
    first = result["runs"][0]["reports"][0]
    assert rows[0].split(" | ")[1] == f"{first['acc']:.4f} / {first['acc_tta']:.4f}"


@pytest.mark.parametrize(
    "args, status, words",
    [
        (["--data", "{tmp}/nowhere"], 1, "CIFAR-10 not found"),
        (["--data", "{data}", "--minutes", "0"], 2, "--minutes 0: the training budget must be a number"),
        (["--data", "{data}", "--minutes", "ten"], 2, "--minutes: invalid float value: 'ten'"),
        (["--data", "{data}", "--minutes", "inf"], 2, "--minutes inf: the training budget must be"),
        (["--data", "{data}", "--minutes", "10"], 2, "--report-at 20: each moment must lie in (0, --minutes"),
        (["--data", "{data}", "--report-at", "0", "5"], 2, "--report-at 0: each moment"),
        (["--smoke", "--data", "{data}"], 2, "--smoke makes its own images"),
        ([], 2, "--data is required"),
        (["--data", "{data}", "--json", "{tmp}/no/such/folder/out.json"], 1, "its folder does not exist"),
    ],
    ids=["no-data", "zero-minutes", "bad-minutes", "endless-minutes", "report-after-the-end", "report-at-0",
         "smoke-and-data", "nothing", "json-folder"],
)  # fmt: skip
def test_cpu_peer_bad_input_is_one_line_and_trains_nothing(
    args, status, words, cifar_folders, tmp_path, capsys
):
    filled = [a.format(tmp=tmp_path, data=cifar_folders) for a in args]
    code, line = command_error(cnn_peer_cpu.main, ["--json", tmp_path / "out.json", *filled], capsys)
    assert code == status and words in line, line
    assert not (tmp_path / "out.json").exists() and not (cifar_folders / ".vit-cache").exists()


@pytest.mark.parametrize("native", [True, False])
def test_cpu_peer_precision_is_bf16_only_where_the_cpu_has_it(native, monkeypatch, capsys):
    import vit.optim

    monkeypatch.setattr(vit.optim, "cpu_has_native_bf16", lambda: native)
    assert cnn_peer_cpu.resolve_precision("auto") == ("bf16" if native else "fp32")
    assert cnn_peer_cpu.resolve_precision("fp32") == "fp32"
    capsys.readouterr()
    assert cnn_peer_cpu.resolve_precision("bf16") == ("bf16" if native else "fp32")
    assert ("no native bf16" in capsys.readouterr().err) == (not native)
