"""benchmarks/gpu_sweep.py at toy size on the CPU: variants trained at once into one table, a
deadline that stops the sweep, and a bad variants file as one line."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks import gpu_sweep

TWO = 'recipe: []\nno_policy: ["--data.init_args.policy", "none"]\n'


@pytest.mark.slow
def test_a_smoke_sweep_trains_two_variants_at_once_into_one_table(tmp_path):
    (tmp_path / "v.yaml").write_text(TWO)
    out = tmp_path / "sweep"
    gpu_sweep.main(["--smoke", "--variants", str(tmp_path / "v.yaml"), "--parallel", "2", "--out", str(out)])
    report = json.loads((out / "sweep.json").read_text())
    variants = report["variants"]
    assert list(variants) == ["recipe", "no_policy"] and report["parallel"] == 2
    for name, r in variants.items():
        assert r["status"] == "ok", (name, r["why"])
        assert set(r["val_acc_by_epoch"]) == {"0"} and r["val_acc"] == r["val_acc_by_epoch"]["0"]
        assert 0 <= r["test_top1"] <= 1
        assert r["steps"] == 4 and r["epochs"] == 1 and r["batch_size"] == 16  # 64 images of 80 train
        assert r["images_per_second"] > 0 and r["wall_seconds"] > r["train_seconds"] > 0
        assert r["paused_seconds"] >= 0 and r["checkpoint"].endswith("checkpoints/last.ckpt")
        assert "--trainer.max_epochs 1 --trainer.max_time null" in r["commands"][0]
        assert (out / "logs" / f"{name}.log").is_file()
    sizes = "--data.init_args.batch_size 16 --data.init_args.val_size 16"  # the smoke's, last
    assert variants["recipe"]["commands"][0].endswith(f"--trainer.logger.init_args.version version_0 {sizes}")
    assert variants["no_policy"]["commands"][0].endswith(f"version_0 --data.init_args.policy none {sizes}")
    assert variants["recipe"]["commands"][1].endswith(f"--out {out / 'eval' / 'recipe'}")
    assert "--model.vit.conv_stem '[8, 16, 32]'" in variants["recipe"]["commands"][0]  # quoted for a shell
    page = (out / "sweep.md").read_text()
    assert "**up to 2 at once on one " in page
    for name in variants:
        assert page.count(f"| {name} | ") == 2  # the table and val/acc by epoch


@pytest.mark.slow
def test_a_deadline_stops_the_running_variant_and_leaves_the_next_unstarted(tmp_path):
    (tmp_path / "v.yaml").write_text(TWO)
    out = tmp_path / "sweep"
    argv = ["--smoke", "--variants", str(tmp_path / "v.yaml"), "--parallel", "1", "--deadline", "3"]
    report = gpu_sweep.main([*argv, "--out", str(out)])
    assert report["seconds"] < 3 + 15  # the deadline, and SIGTERM's wait at most
    first, second = report["variants"]["recipe"], report["variants"]["no_policy"]
    assert first["status"] == "stopped" and first["why"] == "at the 3 s deadline"
    assert second["status"] == "not started"
    page = (out / "sweep.md").read_text()
    assert "| recipe | stopped: at the 3 s deadline |" in page
    assert "| no_policy | not started | - |" in page


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "no such file"),
        ("recipe: [", "is not YAML"),
        ("- recipe\n- lr", "must map each variant's name to a list of overrides"),
        ("lr: --model.lr 0.1\n", "lr: give a list of strings"),
        ('lr: ["--model.lr", 0.1]\n', "lr: give a list of strings (quote numbers)"),
        ('"a b": []\n', "the name 'a b' must be"),
    ],
)
def test_a_bad_variants_file_is_one_line(tmp_path, text, message):
    path = tmp_path / "v.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit, match=re.escape(message)) as error:
        gpu_sweep.main(["--smoke", "--variants", str(path), "--out", str(tmp_path / "out")])
    assert str(error.value).startswith("error: ") and "\n" not in str(error.value)


def test_without_smoke_the_sweep_needs_data(tmp_path):
    (tmp_path / "v.yaml").write_text(TWO)
    with pytest.raises(SystemExit, match="--data is needed without --smoke"):
        gpu_sweep.main(["--variants", str(tmp_path / "v.yaml"), "--out", str(tmp_path / "out")])


def test_a_sweep_stopped_at_its_deadline_exits_0_and_one_with_a_failed_variant_exits_1():
    statuses = {"a": "ok", "b": "stopped", "c": "not started"}
    report = dict(variants={name: dict(status=status) for name, status in statuses.items()})
    assert gpu_sweep.exit_status(report) == 0
    report["variants"]["d"] = dict(status="failed")
    assert gpu_sweep.exit_status(report) == 1


def test_the_sweep_starts_its_clock_before_anything_heavy_is_imported():
    """Its deadline is counted from main(): what Python imports before that is time the GPU
    check's step limit sees and the sweep's clock does not (torch, matplotlib, vit: seconds on a
    fresh machine)."""
    import subprocess
    import sys

    heavy = "{'torch', 'matplotlib', 'vit'}"
    code = f"import sys; import benchmarks.gpu_sweep; print(sorted({heavy} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
def test_minutes_give_each_variant_a_time_budget_instead_of_epochs(tmp_path):
    """`--minutes`: the config's schedule spans a wall-clock budget (4 s here) instead of epochs,
    and training ends within it; the page says minutes, not epochs."""
    (tmp_path / "v.yaml").write_text("recipe: []\n")
    out = tmp_path / "sweep"
    argv = ["--smoke", "--variants", str(tmp_path / "v.yaml"), "--parallel", "1", "--minutes", "0.07"]
    gpu_sweep.main([*argv, "--out", str(out)])
    report = json.loads((out / "sweep.json").read_text())
    recipe = report["variants"]["recipe"]
    assert recipe["status"] == "ok", recipe["why"]
    assert "--trainer.max_epochs -1 --trainer.max_time 00:00:00:04" in recipe["commands"][0]
    assert 0 < recipe["train_seconds"] <= 4 + 1  # the clock at the last validation
    assert "0.07 minutes of training each" in (out / "sweep.md").read_text()
    with pytest.raises(SystemExit, match="--minutes 0.0 must be positive"):
        gpu_sweep.main([*argv[:-1], "0", "--out", str(out)])


def test_the_proxy_shrinks_the_network_and_each_epoch():
    assert gpu_sweep.PROXY[gpu_sweep.PROXY.index("--model.vit.dim") + 1] == "96"
    assert gpu_sweep.PROXY[gpu_sweep.PROXY.index("--trainer.limit_train_batches") + 1] == "0.2"


def test_only_runs_the_named_variants_in_its_order_and_a_name_not_in_the_file_is_one_line(tmp_path):
    """`--only`: a study keeps every variant in one file and runs some; a deadline of 0 s starts
    none, so the report lists what was picked without training."""
    path = tmp_path / "v.yaml"
    path.write_text(TWO + 'depth0: ["--model.vit.depth", "0"]\n')
    argv = ["--smoke", "--variants", str(path), "--deadline", "0", "--out", str(tmp_path / "out")]
    report = gpu_sweep.main([*argv, "--only", "depth0", "recipe"])
    assert list(report["variants"]) == ["depth0", "recipe"]
    assert all(r["status"] == "not started" for r in report["variants"].values())
    with pytest.raises(SystemExit, match=re.escape("--only wide: not in ")) as error:
        gpu_sweep.main([*argv, "--only", "recipe", "wide"])
    assert str(error.value).endswith("(it has recipe, no_policy, depth0)") and "\n" not in str(error.value)


def test_the_smokes_toy_data_sizes_win_over_a_variants_own(tmp_path):
    """A variant with the CNN peer's batches of 1,024 and 1,000 held-out images failed its smoke:
    they came after the smoke's sizes and do not fit its 80 made-up images. A deadline of 0 s
    starts nothing; the commands say what each variant would run."""
    path = tmp_path / "v.yaml"
    path.write_text('peer: ["--data.init_args.batch_size", "1024", "--data.init_args.val_size", "1000"]\n')
    argv = ["--smoke", "--variants", str(path), "--deadline", "0", "--out", str(tmp_path / "out")]
    command = gpu_sweep.main(argv)["variants"]["peer"]["commands"][0]
    assert command.endswith("--data.init_args.batch_size 16 --data.init_args.val_size 16")
    assert "--data.init_args.val_size 1000" in command  # the variant's own, overridden
    real = ["--variants", str(path), "--deadline", "0", "--data", str(tmp_path)]
    command = gpu_sweep.main([*real, "--out", str(tmp_path / "real")])["variants"]["peer"]["commands"][0]
    assert command.endswith("--data.init_args.val_size 1000")  # without --smoke the variant's own stand


def test_the_smoke_keeps_a_configs_number_of_stem_convolutions_so_its_strides_still_fit():
    """configs/cifar10_cpu.yaml's stem has 5 convolutions and 5 strides: the smoke's 3-convolution
    toy stem left those strides without convolutions, and every variant failed to build."""
    import yaml

    from benchmarks.gpu_check import SMOKE_SPEEDRUN, smoke_for
    from vit.config import ViTConfig
    from vit.errors import UsageError

    def stem(smoke: list[str]) -> list[int]:
        return yaml.safe_load(smoke[smoke.index("--model.vit.conv_stem") + 1])

    config = yaml.safe_load(open("configs/cifar10_cpu.yaml"))["model"]["vit"]
    toy = dict(dim=32, depth=1, heads=2)
    with pytest.raises(UsageError, match="one stride per conv_stem entry"):
        ViTConfig(**{**config, **toy, "conv_stem": stem(SMOKE_SPEEDRUN)}).resolve()
    smoke = smoke_for("configs/cifar10_cpu.yaml")
    assert stem(smoke) == [8, 16, 32, 32, 32] and len(smoke) == len(SMOKE_SPEEDRUN)
    ViTConfig(**{**config, **toy, "conv_stem": stem(smoke)}).resolve()  # builds
    assert smoke_for("configs/cifar10_gpu.yaml") == SMOKE_SPEEDRUN  # 3 convolutions already
    assert smoke_for("configs/two_circles.yaml") == smoke_for("no/such/config.yaml") == SMOKE_SPEEDRUN
