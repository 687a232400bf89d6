"""The two-circles comparison script runs end to end at a tiny size and writes what it says."""

import subprocess
import sys
from pathlib import Path

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
