"""benchmarks/cnn_peer.py: the files it writes are airbench's format, and without CUDA it stops."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import command_error
from PIL import Image

from benchmarks import cnn_peer
from vit.datamodules import CIFAR10, CIFAR10_CLASSES

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
