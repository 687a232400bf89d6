"""studies/cifar10_cpu/cifar10_probes.py: its variants name real options, and steps follow step costs."""

import inspect
import json
from dataclasses import fields

import pytest

from studies.cifar10_cpu import cifar10_probes as probes
from vit.classifier import Classifier
from vit.config import ViTConfig
from vit.datamodules import ImageDataModule


def test_pairs_keep_options_with_their_values_and_appends_alone():
    args = ["--trainer.callbacks+=a.B", "--trainer.callbacks.decay", "0.9", "--model.vit.depth", "3"]
    assert probes.pairs(args) == [
        ("--trainer.callbacks+=a.B", None), ("--trainer.callbacks.decay", "0.9"), ("--model.vit.depth", "3"),
    ]  # fmt: skip
    assert probes.overrides_of(args, "--model.vit.") == {"depth": 3}


def test_every_variant_names_options_that_exist():
    """A misspelt override would only fail on the machine the probes run on, minutes in."""
    vit = {f.name for f in fields(ViTConfig)}
    model = set(inspect.signature(Classifier.__init__).parameters)
    data = set(inspect.signature(ImageDataModule.__init__).parameters)
    for name, variant in {"BEFORE": probes.BEFORE, **probes.VARIANTS}.items():
        for key, _ in probes.pairs(variant):
            if key.startswith("--model.vit."):
                assert key.removeprefix("--model.vit.") in vit, (name, key)
            elif key.startswith("--model."):
                assert key.removeprefix("--model.") in model, (name, key)
            elif key.startswith("--data.init_args."):
                assert key.removeprefix("--data.init_args.") in data, (name, key)
            else:
                assert key.startswith("--trainer."), (name, key)


@pytest.mark.parametrize("variant", ["before", "stem-extra-8x8+depth2"])
def test_step_cost_times_a_training_step(variant):
    assert probes.step_cost(probes.VARIANTS[variant], steps=1, warmup=0) > 0


def test_run_gives_each_variant_steps_in_proportion_to_its_cost(tmp_path, monkeypatch):
    """A variant that costs twice the config's step gets half its steps; one that changes only
    training settings (not the model or the batch) gets the config's; one of twice the batch,
    at the same cost per 128 images, half the steps."""
    costs = tmp_path / "costs.json"
    ms = {"before": 200.0, "depth6": 400.0, "lr2e-3": 150.0, "batch256-lr2e-3": 200.0}
    costs.write_text(json.dumps(ms))
    launched = []
    monkeypatch.setattr(probes, "train", lambda *job: launched.append(job[:3]) or {"variant": job[0]})
    args = probes.argparse.Namespace(
        costs=str(costs), root="unused", out=str(tmp_path / "out"), steps=1000, seeds=[0], jobs=1,
        variants=["before", "depth6", "lr2e-3", "batch256-lr2e-3"],
    )  # fmt: skip
    probes.run(args)
    assert sorted(launched) == [
        ("batch256-lr2e-3", 0, 500), ("before", 0, 1000), ("depth6", 0, 500), ("lr2e-3", 0, 1000),
    ]  # fmt: skip
    assert "| depth6 | failed |" in (tmp_path / "out" / "summary.md").read_text()
