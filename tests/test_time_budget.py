"""Training to a wall-clock budget (--trainer.max_time): warm-up and cosine span the budget, the
last validation fits inside it, and a resumed run continues the same schedule. A fake clock makes
every training step take 1 s and every validation batch 1.5 s."""

import csv
import math
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers import tiny_args
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, Timer
from lightning.pytorch.callbacks import timer as timer_module

from vit import TwoCircles, ViTClassifier, ViTConfig
from vit.commands import train as cli

LR, FLOOR = 1e-3, 0.01


class Clock(Callback):
    """Advances the fake clock: 1 s per training step (before the optimizer and the schedule
    step), 1.5 s per validation batch; records each step's learning rate and the validations."""

    def __init__(self, clock: list[float]):
        self.clock, self.rates, self.validated_at = clock, {}, []

    def on_before_optimizer_step(self, *args):
        self.clock[0] += 1.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rates[trainer.global_step] = trainer.optimizers[0].param_groups[0]["lr"]

    def on_validation_batch_end(self, trainer, *args):
        self.clock[0] += 1.5

    def on_validation_end(self, trainer, pl_module):
        self.validated_at.append(self.clock[0])


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(timer_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return now


def fit(clock, tmp_path, callbacks=(), ckpt_path=None, max_time=40, **options):
    # 256 images in batches of 32: 8 steps an epoch; 64 validation images: 2 batches, 3 s
    data = TwoCircles(num_train=256, num_val=64, num_test=64, batch_size=32)
    vit = ViTConfig(preset="micro", patch_size=8, patch_dropout=options.pop("patch_dropout", 0.0))
    model = ViTClassifier(in_channels=1, num_classes=4, vit=vit, lr=LR, min_lr_fraction=FLOOR, **options)
    timed = Clock(clock)
    trainer = L.Trainer(
        max_epochs=-1, max_time={"seconds": max_time}, callbacks=[timed, *callbacks], logger=False,
        enable_checkpointing=bool(callbacks), enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(model, data, ckpt_path=ckpt_path)
    return trainer, timed


def test_the_schedule_spans_the_budget_and_the_last_validation_fits_in_it(clock, tmp_path):
    trainer, timed = fit(clock, tmp_path)
    timer = next(c for c in trainer.callbacks if isinstance(c, Timer))
    # epochs take 8 s and validations 3 s: after the first, 1.5 x (1 + 3) s are kept for a step
    # and the last validation, so the schedule spans 34 s; step 25 ends at 34 s, then the last
    # validation: 37 s of 40
    assert trainer.global_step == 25
    assert timed.validated_at == [1011.0, 1022.0, 1033.0, 1037.0]
    assert timer.time_elapsed() == 37.0 <= 40
    rates = [timed.rates[step] for step in sorted(timed.rates)]
    assert rates[-1] == pytest.approx(LR * FLOOR)  # the cosine ended with training
    assert max(rates) == pytest.approx(LR, rel=0.02) and rates.index(max(rates)) in (1, 2)  # warm-up: 5%
    assert all(a >= b for a, b in zip(rates[2:], rates[3:], strict=False))  # then only down
    # a wall-time schedule: 12 s in, lr is the cosine's at (12 - 1.7) / (34 - 1.7) of the way
    progress = (12 / 34 - 0.05) / 0.95
    expected = LR * (FLOOR + (1 - FLOOR) * (1 + torch.cos(torch.tensor(torch.pi * progress)).item()) / 2)
    assert timed.rates[9] == pytest.approx(expected, rel=1e-5)  # step 9 ends at 12 s


@pytest.mark.slow
def test_patch_dropout_end_moves_the_share_of_dropped_patches_with_the_schedule(clock, tmp_path):
    """patch_dropout 0.75 -> patch_dropout_end 0.25 over the time budget: the first steps keep a
    quarter of the patches, the last ones three quarters, never fewer than the step before."""
    kept = []

    class Tokens(Callback):  # the patch tokens the first block sees in each training step
        def on_fit_start(self, trainer, pl_module):
            block = pl_module.model.blocks[0]
            block.register_forward_pre_hook(
                lambda m, args, kwargs: kept.append(args[0].shape[1] - 1) if m.training else None,
                with_kwargs=True,
            )

    trainer, timed = fit(clock, tmp_path, callbacks=[Tokens()], patch_dropout=0.75, patch_dropout_end=0.25)
    patches = math.prod(trainer.lightning_module.model.grid_size)
    assert trainer.global_step == 25 and len(kept) == 25
    assert kept[0] == patches // 4 and kept[-1] == round(
        patches * (1 - 0.25 - 0.5 / 34)
    )  # step 25 starts at 33 s of 34
    assert all(a <= b for a, b in zip(kept, kept[1:], strict=False))
    # a fixed share without patch_dropout_end, as before
    kept.clear()
    clock[0] = 2000.0
    fit(clock, tmp_path / "fixed", callbacks=[Tokens()], patch_dropout=0.75)
    assert set(kept) == {patches // 4}


@pytest.mark.slow
def test_a_resumed_run_continues_the_schedule(clock, tmp_path):
    _, whole = fit(clock, tmp_path / "whole")
    saved = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=12, save_top_k=-1, save_last=False)
    clock[0] = 5000.0

    class Stop(Callback):  # the first run ends after step 13, a checkpoint written at step 12
        def on_train_batch_end(self, trainer, *args):
            trainer.should_stop = trainer.global_step == 13

    fit(clock, tmp_path / "first", callbacks=[saved, Stop()])
    ckpt = next((tmp_path / "ckpt").glob("*step=12.ckpt"))
    assert torch.load(ckpt, weights_only=True)["time_reserve_seconds"] == {"validation": 3.0, "step": 1.0}
    clock[0] = 9000.0
    trainer, resumed = fit(clock, tmp_path / "second", ckpt_path=ckpt)
    timer = next(c for c in trainer.callbacks if isinstance(c, Timer))
    assert timer.time_elapsed() == 37.0  # the clock went on from the checkpoint's 15 s
    assert sorted(resumed.rates) == list(range(13, 26))  # ends at the same step, at the budget
    for step, rate in resumed.rates.items():
        assert rate == pytest.approx(whole.rates[step], rel=1e-6), step


@pytest.mark.slow
def test_max_epochs_minus_one_with_max_time_from_the_cli(runs):
    # 6 s: a validation that takes over 1.5 times the longest before it (a busy machine) ends
    # training at the budget mid-schedule; more validations measured make that less likely
    budget = ["--trainer.max_epochs", "-1", "--trainer.max_time", "00:00:00:06"]
    cli.main(["fit", *tiny_args(runs, *budget, "--model.min_lr_fraction", "0.01")])
    run = runs / "tiny" / "version_0"
    assert (run / "checkpoints" / "best.ckpt").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    rates = [float(r["train/lr"]) for r in rows if r.get("train/lr")]
    minutes = [float(r["time/minutes"]) for r in rows if r.get("time/minutes")]
    # on a real clock, within the budget up to its noise (the fake clock above measures exactly)
    assert rates and minutes and minutes[-1] <= 6.5 / 60
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    last_lr = saved["lr_schedulers"][0]["_last_lr"]
    assert last_lr[-1] == pytest.approx(saved["hyper_parameters"]["lr"] * 0.01)  # ended at the budget


def test_the_last_step_takes_the_floor_when_the_clock_moves_on_after_the_schedule(clock, tmp_path):
    """The scheduler reads the clock for a step's learning rate before the end-of-step hooks, and
    a real clock moves on in between: training must stop on the scheduler's reading, so that the
    last step's rate is the floor, not a hair above it (a race a real-clock test lost now and then)."""

    class Lag(Callback):  # time passing between the schedule's step and the module's hook
        def on_train_batch_end(self, *args):
            clock[0] += 0.9

    trainer, timed = fit(clock, tmp_path, callbacks=[Lag()])
    rates = [timed.rates[step] for step in sorted(timed.rates)]
    assert rates[-1] == pytest.approx(LR * FLOOR)
