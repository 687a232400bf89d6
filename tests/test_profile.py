"""`vit.callbacks.Profile`: a few training steps under torch.profiler, reported in the run folder."""

from __future__ import annotations

import csv

import lightning as L
import pytest
from lightning.pytorch.loggers import CSVLogger

from lab.cifar10_pack import fake_cifar10
from vit import ViTClassifier, ViTConfig
from vit.callbacks import Profile
from vit.datamodules import CIFAR10


@pytest.mark.slow
def test_a_few_steps_are_profiled_and_reported_in_the_run_folder(tmp_path):
    root = fake_cifar10(tmp_path / "data", per_class=12)
    data = CIFAR10(root=str(root), val_size=16, batch_size=16, policy="trivial")
    model = ViTClassifier(vit=ViTConfig(preset="micro", patch_size=4, conv_stem=[8], conv_stem_strides=[1]))
    profile = Profile(start=2, steps=3, trace=True)
    trainer = L.Trainer(
        accelerator="cpu", max_steps=8, logger=CSVLogger(tmp_path, name="run"), callbacks=[profile],
        enable_checkpointing=False, enable_progress_bar=False, num_sanity_val_steps=0, limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(model, data)
    folder = tmp_path / "run" / "version_0"
    text = (folder / "profile.txt").read_text()
    assert text.startswith("3 training steps from step 2: the host")
    assert "aten::addmm" in text or "aten::mm" in text  # the operators of a step, by their own time
    assert (folder / "profile.json").is_file()
    report = profile.report
    assert report["steps"] == 3
    # on a CPU the kernels run on the host: the host's time holds the device's (the CPU's) kernels
    assert 0 < report["device_seconds"] <= report["host_seconds"] <= report["wall_seconds"]
    rows = [r for r in csv.DictReader(open(folder / "metrics.csv")) if r.get("profile/host_seconds")]
    assert len(rows) == 1 and rows[0]["step"] == "5"


def test_a_profile_needs_at_least_one_step():
    with pytest.raises(ValueError, match="steps=0"):
        Profile(steps=0)
