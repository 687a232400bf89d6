"""The tools of tools/ at a tiny size: each runs end to end and reports what it says."""

import re
import subprocess
from pathlib import Path

import helpers
import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_script(name: str, *args: str, **options) -> subprocess.CompletedProcess:
    """`python tools/NAME ARGS` (`helpers.run_script`)."""
    return helpers.run_script(ROOT / "tools" / name, *args, **options)


@pytest.mark.slow
def test_demo_seeds_reports_each_seed_and_goes_on_where_it_stopped(tmp_path):
    tiny = [
        "--", "--model.vit.preset", "micro", "--data.init_args.num_train", "256",
        "--data.init_args.num_val", "64", "--data.init_args.num_test", "64", "--trainer.max_epochs", "2",
    ]  # fmt: skip
    out, runs = tmp_path / "probe", tmp_path / "runs"
    result = run_script("demo_seeds.py", "--seeds", "3", "--out", str(out), "--runs", str(runs), *tiny)
    assert result.returncode == 0, result.stderr[-2000:]
    result = run_script("demo_seeds.py", "--seeds", "3", "4", "--out", str(out), "--runs", str(runs), *tiny)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "seed 3:" not in result.stdout and "seed 4:" in result.stdout  # seed 3 was done
    table = (out / "table.md").read_text()
    rows = re.findall(r"^\| (\d) \| (0\.\d{4}) \| ([0-9., ]+) \|", table, re.MULTILINE)
    assert [r[0] for r in rows] == ["3", "4"] and all(len(r[2].split(", ")) == 2 for r in rows)
    assert "min / median / max" in table
    other = run_script(
        "demo_seeds.py", "--seeds", "5", "--out", str(out), "--runs", str(runs), "--", "--model.lr", "1"
    )
    assert other.returncode != 0 and "holds another config or options" in other.stderr


@pytest.mark.slow
def test_tensorboard_screenshots_show_the_first_and_the_last_pictures(chromium, tmp_path):
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger
    from PIL import Image

    from vit import TwoCircles, ViTClassifier, ViTConfig
    from vit.interpret.watching import AttentionMaps

    data = TwoCircles(num_train=64, num_val=32, num_test=32, batch_size=32)
    model = ViTClassifier(
        num_classes=4, image_size=32, in_channels=1, vit=ViTConfig(preset="micro", patch_size=8)
    )
    logger = TensorBoardLogger(tmp_path / "runs", name="demo")
    trainer = L.Trainer(max_epochs=1, logger=logger, callbacks=[AttentionMaps(num_images=2)],
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")  # fmt: skip
    trainer.fit(model, datamodule=data)
    shots = tmp_path / "shots"
    result = run_script("tensorboard_screenshots.py", str(tmp_path / "runs"), "--out", str(shots),
                        "--chromium", chromium, own_process=True)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    first, last = (
        Image.open(tmp_path / "shots" / name) for name in ("tensorboard_step0.png", "tensorboard_end.png")
    )
    assert first.size == last.size == (1400, 960)
    assert first.tobytes() != last.tobytes()  # the slider moved: another picture, another step
    result = run_script(
        "tensorboard_screenshots.py", str(shots), "--out", str(tmp_path / "none")
    )  # no events
    assert result.returncode != 0 and "error: no TensorBoard events under" in result.stderr
    assert not (tmp_path / "none").exists()
