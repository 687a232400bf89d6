"""What the GPU recipe (configs/cifar10_gpu.yaml) and the GPU check rely on, tested on the CPU: the
linear decay, the moving average of the weights, compilation before the clock, the CIFAR-10 pack
that carries the data to a GPU machine, and the check itself at toy sizes (`--smoke`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import run_in_process
from lightning.pytorch.callbacks import Callback

from benchmarks import gpu_check
from lab.cifar10_pack import fake_cifar10, files_of, pack, unpack
from vit import TwoCircles, ViTClassifier, ViTConfig
from vit.callbacks import EMA
from vit.optim import warmup_cosine


def test_linear_decay_falls_in_a_straight_line_to_the_floor():
    warmup, floor = 0.1, 0.01
    assert warmup_cosine(0.05, warmup, floor, decay="linear") == pytest.approx(0.5)  # warming up
    assert warmup_cosine(0.1, warmup, floor, decay="linear") == pytest.approx(1.0)
    assert warmup_cosine(0.55, warmup, floor, decay="linear") == pytest.approx((1 + floor) / 2)
    assert warmup_cosine(0.325, warmup, floor, decay="linear") == pytest.approx(floor + (1 - floor) * 0.75)
    assert warmup_cosine(1.0, warmup, floor, decay="linear") == pytest.approx(floor)
    # the cosine, by contrast, is above the line in the first half of the decay
    assert warmup_cosine(0.325, warmup, floor) > warmup_cosine(0.325, warmup, floor, decay="linear")


def test_decay_must_be_cosine_or_linear():
    from vit.errors import UsageError

    with pytest.raises(UsageError, match="decay='step' must be 'cosine' or 'linear'"):
        ViTClassifier(vit=ViTConfig(preset="micro"), decay="step")


class Weights(Callback):
    """The network's weights after each optimizer step (before EMA's update reads them)."""

    def __init__(self):
        self.after_step = []

    def on_fit_start(self, trainer, pl_module):
        self.initial = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

    def on_train_batch_end(self, trainer, pl_module, *args):
        self.after_step.append({k: v.detach().clone() for k, v in pl_module.state_dict().items()})


def test_ema_keeps_the_moving_average_with_a_warm_up_and_saves_it(tmp_path):
    torch.manual_seed(0)
    data = TwoCircles(num_train=128, num_val=32, num_test=32, batch_size=32)  # 4 steps an epoch
    vit = ViTConfig(preset="micro", patch_size=8, conv_stem=[4])  # BatchNorm buffers too
    model = ViTClassifier(in_channels=1, num_classes=4, vit=vit)
    weights, decay = Weights(), 0.6
    trainer = L.Trainer(
        max_steps=6, callbacks=[weights, EMA(decay=decay)], logger=False, default_root_dir=tmp_path,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(model, data)
    expected = {k: v.clone() for k, v in weights.initial.items()}
    for step, current in enumerate(weights.after_step, start=1):
        weight = 1 - min(decay, (1 + step) / (10 + step))
        for key, value in current.items():
            if value.is_floating_point():
                expected[key] = torch.lerp(expected[key], value, weight)
            else:
                expected[key] = value
    # after training the network holds the average (Lightning's WeightAveraging copies it in)
    final = model.state_dict()
    assert not torch.allclose(weights.after_step[-1]["model.head.weight"], expected["model.head.weight"])
    for key, value in expected.items():
        torch.testing.assert_close(final[key], value, atol=1e-6, rtol=1e-6, msg=key)
    # the checkpoint's weights are the average; training's own go beside them
    trainer.save_checkpoint(tmp_path / "ema.ckpt")
    saved = torch.load(tmp_path / "ema.ckpt", weights_only=True)
    torch.testing.assert_close(saved["state_dict"]["model.head.weight"], expected["model.head.weight"])


def test_ema_refuses_a_decay_outside_0_1():
    with pytest.raises(ValueError, match="EMA decay=1.0 must lie in"):
        EMA(decay=1.0)


def test_the_pack_unpacks_into_the_same_files(tmp_path):
    source = fake_cifar10(tmp_path / "source", per_class=2)
    count, size = pack(source, tmp_path / "c.pack")
    assert count == len(files_of(source)) == 2 * 10 * 2
    payload = sum((source / name).stat().st_size for name in files_of(source))
    assert payload < size < payload + 10_000  # the index is small
    assert unpack(tmp_path / "c.pack", tmp_path / "copy") == count
    for name in files_of(source):
        assert (tmp_path / "copy" / name).read_bytes() == (source / name).read_bytes()
    assert files_of(tmp_path / "copy") == files_of(source)


def test_a_truncated_or_foreign_pack_is_one_line(tmp_path):
    source = fake_cifar10(tmp_path / "source", per_class=1)
    pack(source, tmp_path / "c.pack")
    data = (tmp_path / "c.pack").read_bytes()
    (tmp_path / "cut.pack").write_bytes(data[:-100])
    with pytest.raises(SystemExit, match="truncated at train/truck/0000.jpg"):
        unpack(tmp_path / "cut.pack", tmp_path / "out")
    (tmp_path / "other.pack").write_bytes(b"PK\x03\x04 a zip")
    with pytest.raises(SystemExit, match="is not an image pack"):
        unpack(tmp_path / "other.pack", tmp_path / "out2")


@pytest.mark.slow
def test_the_gpu_check_runs_every_step_at_toy_size(tmp_path, monkeypatch):
    """`--smoke` on the CPU: every step runs (airbench, which needs CUDA, says why it did not), the
    GPU recipe trains to its time budget and is evaluated, and both reports are written. The
    steps' commands of this checkout run in this process (`run_in_process`); pytest and the sweep's
    variants are processes, as on the GPU."""
    monkeypatch.setattr(gpu_check.subprocess, "run", run_in_process)
    out = tmp_path / "check"
    gpu_check.main(["--smoke", "--out", str(out)])
    report = json.loads((out / "gpu_report.json").read_text())
    steps = report["steps"]
    assert list(steps) == list(gpu_check.STEPS)
    assert all(step["ok"] for step in steps.values()), {k: s["why"] for k, s in steps.items()}
    assert steps["cnn_peer"].get("skipped", False) == (not torch.cuda.is_available())
    counts = steps["tests"]["counts"]  # pytest -m gpu: without CUDA every GPU test skips
    assert counts.get("failed", 0) == 0
    assert counts.get("passed" if torch.cuda.is_available() else "skipped", 0) >= 14
    (speedrun,) = steps["speedrun"]["runs"].values()
    assert speedrun["steps"] > 1 and speedrun["epochs"] >= 1
    assert 0 < speedrun["train_minutes"] * 60 <= 5 + 2  # the budget, with the last validation's slack
    assert 0 <= speedrun["test_top1"] <= 1 and 0 <= speedrun["test_top1_tta"] <= 1
    assert 0 <= steps["demo"]["test_top1"] <= 1
    # the loop's rate: steps x batch over the clock less validation and checkpoints
    assert 0 < speedrun["paused_seconds"] < speedrun["clock_seconds"]
    rate = speedrun["steps"] * 16 / (speedrun["clock_seconds"] - speedrun["paused_seconds"])
    assert speedrun["loop_images_per_second"] == pytest.approx(rate)
    (throughput,) = steps["throughput"]["results"].values()
    assert throughput["precisions"]["fp32"]["systems"]["ours"]["train_ips"] > 0
    sweep = steps["sweep"]["results"]["variants"]
    assert sweep and all(v["status"] == "ok" for v in sweep.values())
    page = (out / "gpu_report.md").read_text()
    for heading in ("## pytest -m gpu", "## Demo", "## Throughput", "## Speedrun", "## Sweep", "## CNN peer"):
        assert heading in page
    assert math.isfinite(report["seconds"])


def test_training_and_evaluation_share_one_time_limit(tmp_path, monkeypatch):
    """A step's limit covers its training and its evaluations together (the check's deadline held
    only if so): with 100 s, training that takes 70 s leaves 30 s to evaluate, and a second
    budget of the speedrun gets what the first left."""
    clock, given = [0.0], []

    def seventy_seconds(commands, log, timeout):
        given.append(timeout)
        clock[0] += 70
        return dict(ok=True, seconds=70.0, why=None)

    monkeypatch.setattr(gpu_check.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(gpu_check, "run", seventy_seconds)
    monkeypatch.setattr(gpu_check, "read_metrics", lambda run_dir: {})
    monkeypatch.setattr(gpu_check, "eval_top1", lambda out: 0.5)
    gpu_check.train_and_eval("run", "configs/cifar10_gpu.yaml", [], tmp_path, timeout=100, tta=True)
    assert given == [100, 30]


def test_a_failed_step_names_the_module_it_ran(tmp_path):
    failing = gpu_check.python("-m", "json.tool", str(tmp_path / "missing.json"))
    result = gpu_check.run([failing], tmp_path / "log", timeout=60)
    assert not result["ok"] and result["why"].startswith("json.tool exited 2: ")


def test_the_gpu_check_needs_data_without_smoke(tmp_path):
    with pytest.raises(SystemExit, match="--data is needed without --smoke"):
        gpu_check.main(["--out", str(tmp_path), "--steps", "speedrun"])
    with pytest.raises(SystemExit, match="no such folder or pack file"):
        gpu_check.main(["--out", str(tmp_path), "--steps", "speedrun", "--data", str(tmp_path / "nothing")])


def test_the_recipe_config_keeps_an_8x8_token_grid():
    import yaml

    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs/cifar10_gpu.yaml").read_text())
    vit = ViTConfig.from_dict({**config["model"]["vit"], "image_size": 32}).resolve()
    from vit import ViT

    assert ViT(vit).grid_size == (8, 8)


def test_the_cost_of_the_recipe_adds_up_by_part():
    from benchmarks import gpu_recipe_cost

    model, config = gpu_recipe_cost.build(Path(gpu_recipe_cost.ROOT) / "configs" / "cifar10_gpu.yaml")
    images = torch.rand(2, 3, 32, 32)
    forward = gpu_recipe_cost.flops_by_part(model, images, train=False)
    train = gpu_recipe_cost.flops_by_part(model, images, train=True)
    for flops in (forward, train):  # norms, activations and softmax are not counted: the parts are all
        assert sum(v for k, v in flops.items() if k != "total") == pytest.approx(flops["total"])
    assert forward["stem"] > 0 and forward["attention"] > forward["MLP"] > 0
    assert 2.5 < train["total"] / forward["total"] < 3.5  # backward: about twice the forward


@pytest.mark.parametrize(("given", "mode"), [(True, "default"), ("reduce-overhead", "reduce-overhead")])
@pytest.mark.slow
def test_compile_takes_a_mode(tmp_path, monkeypatch, given, mode):
    """`--model.compile true` compiles in torch's default mode; a mode name (reduce-overhead:
    CUDA graphs) is passed on; anything else is one line."""
    from vit import captured_step
    from vit.commands.train import run as train
    from vit.errors import UsageError

    modes = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kwargs: modes.append(kwargs["mode"]))
    monkeypatch.setattr(captured_step, "compile_now", lambda model: None)
    args = ["fit", "--config", "configs/two_circles.yaml", "--model.vit.preset", "micro",
            "--model.compile", str(given).lower(), "--trainer.max_steps", "1",
            "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.enable_progress_bar", "false",
            "--data.init_args.num_train", "64", "--data.init_args.num_val", "32",
            "--data.init_args.num_test", "32"]  # fmt: skip
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    result = train(args)
    assert modes == [mode] and result.model.hparams.compile == given
    with pytest.raises(UsageError, match="compile='fast' must be true, false or a mode"):
        ViTClassifier(vit=ViTConfig(preset="micro"), compile="fast")


def test_the_loop_is_compared_with_the_network_compiled_as_the_config_compiles_it(tmp_path):
    def rate(ips):
        return {"precisions": {"bf16": {"systems": {"ours+stem": {"train_ips": ips}}}}}

    results = {"recipe-compiled": rate(20_000.0), "recipe-cudagraphs": rate(40_000.0)}
    run = {"budget": "00:00:00:20", "loop_images_per_second": 30_000.0}
    steps = {"throughput": {"results": results}, "speedrun": {"runs": {"20s": run}}}
    cases = (("reduce-overhead", "recipe-cudagraphs", "0.75x"), ("true", "recipe-compiled", "1.50x"))
    for mode, name, ratio in cases:
        config = tmp_path / f"{name}.yaml"
        config.write_text(f"model:\n  compile: {mode}\n")
        assert gpu_check.compiled_as(config) == name
        line = gpu_check.loop_against_benchmark(steps, gpu_check.compiled_as(config))[-1]
        assert line == f"- 00:00:00:20: the loop at 30,000 images/s is {ratio} throughput.py's {name} (" + (
            f"{results[name]['precisions']['bf16']['systems']['ours+stem']['train_ips']:,.0f} images/s, bf16)"
        )
    assert gpu_check.loop_against_benchmark(steps, "recipe") == []  # not measured: no line
