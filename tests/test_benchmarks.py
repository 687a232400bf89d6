"""The benchmark scripts run end to end at a tiny size and report what they say."""

import subprocess
import sys
from pathlib import Path

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


def test_data_pipeline_benchmark_smoke(tmp_path, capsys):
    from benchmarks.data_pipeline import main
    from vit.images import CIFAR10_CLASSES

    root = make_folders(tmp_path / "cifar", classes=CIFAR10_CLASSES, per_class={"train": 1})
    tiny = ["--dim", "16", "--depth", "1", "--heads", "2", "--precision", "fp32", "--batch", "4"]
    steps = ["--val_size", "2", "--warmup", "1", "--steps", "2", "--rounds", "1"]
    results = main(["--root", str(root), *tiny, *steps])
    assert results["model_only"] > 0 and results["pipeline"] > 0 and results["augment_ms"] > 0
    assert results["ratio"] == results["pipeline"] / results["model_only"]
    out = capsys.readouterr().out
    assert "(a) model only:" in out and "(b) with pipeline:" in out and "ratio (b)/(a):" in out
