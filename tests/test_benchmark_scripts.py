"""The benchmark scripts run end to end at a tiny size and report what they say."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import make_folders

ROOT = Path(__file__).resolve().parents[1]


def test_two_circles_comparison_smoke(tmp_path):
    tiny = ["--steps", "2", "--seeds", "1", "--num_train", "128", "--num_test", "64", "--fields", "3"]
    command = [
        sys.executable,
        str(ROOT / "benchmarks/two_circles.py"),
        *tiny,
        "--cnn_width",
        "8",
        "--out",
        str(tmp_path),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    table = (tmp_path / "table.md").read_text()
    for name in (
        "ViT",
        "ViT, no position embeddings",
        "ViT, attention window 0",
        "ViT, attention window 1",
        "ResNet",
        "bag CNN, field 3",
    ):
        assert f"| {name} |" in table
    for png in ("accuracy_vs_separation.png", "accuracy_vs_receptive_field.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
        (tmp_path / png).unlink()
    replot = [sys.executable, str(ROOT / "benchmarks/two_circles.py"), "--replot", "--out", str(tmp_path)]
    result = subprocess.run(replot, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "accuracy_vs_separation.png").read_bytes()[:4] == b"\x89PNG"


def test_data_pipeline_benchmark_smoke(tmp_path, capsys):
    from benchmarks.data_pipeline import main
    from vit.datamodules import CIFAR10_CLASSES

    root = make_folders(tmp_path / "cifar", classes=CIFAR10_CLASSES, per_class={"train": 1})
    tiny = ["--dim", "16", "--depth", "1", "--heads", "2", "--precision", "fp32", "--batch", "4"]
    steps = ["--val_size", "2", "--warmup", "1", "--steps", "2", "--rounds", "1"]
    results = main(["--root", str(root), *tiny, *steps, "--shifted_patches", "--locality_attention"])
    assert results["model_only"] > 0 and results["pipeline"] > 0 and results["augment_ms"] > 0
    assert results["ratio"] == results["pipeline"] / results["model_only"]
    out = capsys.readouterr().out
    assert "(a) model only:" in out and "(b) with pipeline:" in out and "ratio (b)/(a):" in out


def test_short_run_smoke(tmp_path, capsys):
    from benchmarks.short_run import main
    from vit.datamodules import CIFAR10_CLASSES

    root = make_folders(tmp_path / "cifar", classes=CIFAR10_CLASSES, per_class={"train": 2})
    tiny = ["--dim", "16", "--depth", "1", "--heads", "2", "--mlp_ratio", "1"]
    steps = ["--val_size", "4", "--batch_size", "4", "--limit", "2", "--epochs", "2"]
    main(["--root", str(root), *tiny, *steps])
    out = capsys.readouterr().out
    assert "epoch 1/2 val/acc" in out and "epoch 2/2 val/acc" in out
    for bad in (["--epochs", "0"], ["--limit", "0"], ["--model", "vit-pytorch", "--dim", "64"]):
        with pytest.raises(SystemExit):
            main(["--root", str(root), *bad])
    assert "must be at least 1" in capsys.readouterr().err


def test_separation_curves_keep_test_and_far_images_apart():
    """Test separations end at 14.5 pixels, far ones start there, and both have a 14-pixel bin:
    the 14.2-pixel test images and the 14.7-pixel far images stay on different curves."""
    import torch

    from benchmarks.two_circles import by_separation, separation_curve

    run = {
        "test": {"by_separation": by_separation(torch.tensor([1, 1, 0]), torch.tensor([13.9, 14.2, 14.4]))},
        "far": {"by_separation": by_separation(torch.tensor([0, 0, 1]), torch.tensor([14.6, 14.7, 15.1]))},
    }
    assert separation_curve([run], "test", (12.0, 14.5)) == ([13.5, 14.25], [1.0, 0.5])
    assert separation_curve([run], "far", (14.5, 15.9)) == ([14.75, 15.45], [0.0, 1.0])


def test_finetune_study_smoke(tmp_path, capsys):
    """Pretrain, export, fine-tune and train from scratch through the commands, on a few images."""
    from benchmarks.finetune import main
    from vit.datamodules import CIFAR10_CLASSES

    cifar = make_folders(tmp_path / "cifar", classes=CIFAR10_CLASSES, per_class={"train": 4, "test": 2})
    tiny = ["--pretrain-epochs", "1", "--epochs", "1", "--per-class", "2", "--val-per-class", "2"]
    main(["--cifar", str(cifar), "--out", str(tmp_path / "out"), "--batch-size", "4", *tiny])
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| fine-tune (layer decay 0.75) | classes 5-9, 10 images | 1 (2) |" in table
    assert "| from scratch | classes 5-9, 10 images | 1 (2) |" in table
    assert (tmp_path / "out" / "pretrained" / "model.safetensors").is_file()
    ckpt = tmp_path / "out" / "finetune" / "run" / "checkpoints" / "last.ckpt"
    recorded = torch.load(ckpt, weights_only=True)
    assert recorded["hyper_parameters"]["pretrained"] == str(tmp_path / "out" / "pretrained")
