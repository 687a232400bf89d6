"""The whole training step as one graph (`vit.captured_step`), checked on the CPU: Dynamo traces it
without a break (augmentation, forward, backward, optimizer and EMA), a new learning rate or new
random draws recompile nothing, and it trains as the eager step does (same seeds, same weights)."""

from __future__ import annotations

import csv
import functools
from dataclasses import replace

import lightning as L
import pytest
import torch

from lab.cifar10_pack import fake_cifar10
from vit import ViTClassifier, ViTConfig
from vit.callbacks import EMA
from vit.captured_step import init_state, tracing, update
from vit.datamodules import CIFAR10
from vit.errors import UsageError
from vit.optim import Muon

VIT = ViTConfig(
    preset="micro", patch_size=4, conv_stem=[8], conv_stem_strides=[1], drop_path=0.1, pool="mean"
)


class Compilations:
    """A torch.compile backend that runs Dynamo's graph as it is (eager) and counts the graphs it
    is given: the step's, and any recompilation."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, graph, inputs):
        self.graphs += 1
        return graph.forward


@pytest.fixture
def counted(monkeypatch):
    """torch.compile in vit.captured_step through the counting backend (inductor's C++ compilation
    takes half a minute here; the graph Dynamo captures is the same)."""
    backend = Compilations()
    compile_ = functools.partial(torch.compile, backend=backend, fullgraph=True)
    monkeypatch.setattr("vit.captured_step.torch.compile", lambda fn, mode=None, fullgraph=True: compile_(fn))
    torch._dynamo.reset()
    return backend


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        if name.endswith("qkv.bias"):  # the key bias's gradient is rounding noise (softmax ignores
            x, y = x.view(3, -1)[[0, 2]], y.view(3, -1)[[0, 2]]  # it), which Adam scales up
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def fit(tmp_path, steps, capture: bool, policy="trivial", ema=True, vit=VIT, model_args=None, **data):
    L.seed_everything(0)
    root = fake_cifar10(tmp_path / "data", per_class=12)
    datamodule = CIFAR10(root=str(root), val_size=16, batch_size=16, policy=policy, **data)
    options = dict(decay="linear", compile=capture, capture_step=capture, **(model_args or {}))
    model = ViTClassifier(vit=vit, **options)
    trainer = L.Trainer(
        accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, callbacks=[EMA(decay=0.9)] if ema else [], default_root_dir=tmp_path,
    )  # fmt: skip
    if capture:  # the network's own compilation for validation: eager here, as the step's
        model.model.compile = lambda mode=None: None
    trainer.fit(model, datamodule)
    return model, trainer


@pytest.mark.parametrize(
    "policy, model_args",
    [("trivial", {}), ("trivial", {"optimizer": "muon"})],
    ids=["adamw", "muon"],
)
@pytest.mark.slow
def test_the_whole_step_is_one_graph(tmp_path, counted, policy, model_args):
    model, _ = fit(tmp_path, 1, capture=True, policy=policy, model_args=model_args)
    step = model.captured
    images = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    labels = torch.randint(0, 10, (16,))
    with tracing():
        explained = torch._dynamo.explain(step.step)(images, labels)
    reasons = [reason.reason for reason in explained.break_reasons]
    assert explained.graph_break_count == 0, reasons
    assert explained.graph_count == 1
    # the graph holds all of it: the augmentation's draws, the backward, Adam's and the EMA's updates
    ops = {str(node.target) for graph in explained.graphs for node in graph.graph.nodes}
    assert any("randint" in op for op in ops)
    assert any("grad" in op for op in ops)
    assert any("_foreach_lerp_" in op for op in ops)
    assert any("_foreach_addcdiv_" in op or "_foreach_div" in op for op in ops)


@pytest.mark.slow
def test_a_new_learning_rate_or_new_draws_recompile_nothing(tmp_path, counted):
    model, trainer = fit(tmp_path, 12, capture=True)
    # compiled once before the clock (three calls) and never again in 12 steps with a warm-up
    # and a decay of the learning rate, and 12 batches of new crops, flips and operations
    assert counted.graphs == 1
    assert trainer.global_step == 12
    lrs = {round(float(group["lr"]), 12) for group in trainer.optimizers[0].param_groups}
    assert len(lrs) == 1 and 0 < lrs.pop() < 1e-3  # decayed


LEVERS = {"adamw": ({}, {}), "alternate_flips": ({}, {"flip": "alternate"})}


@pytest.mark.parametrize("lever", LEVERS)
@pytest.mark.slow
def test_the_captured_step_trains_as_the_eager_step(tmp_path, counted, lever):
    """Same seed, same data, 12 steps each (into the second epoch): the same weights, EMA average
    and optimizer state. The captured step's draws come in the eager step's order
    (augmentation, then drop path). With alternating flips too, whose parity changes each epoch.
    Adam divides by sqrt(v) + eps, so rounding differences of 1e-7 grow to 1e-6 in 12 steps."""
    model_args, data = LEVERS[lever]
    captured, captured_trainer = fit(tmp_path / "a", 12, capture=True, model_args=model_args, **data)
    eager, eager_trainer = fit(tmp_path / "b", 12, capture=False, model_args=model_args, **data)
    assert captured_trainer.global_step == eager_trainer.global_step == 12
    assert captured_trainer.current_epoch >= 1  # the parity of alternating flips changed
    assert counted.graphs == 1  # no recompilation when the epoch changes
    start = ViTClassifier(vit=VIT).model.state_dict()  # weights that moved prove the steps ran
    assert_same_weights(captured.model, eager.model)
    weights = captured.model.state_dict()
    moved = [name for name, value in weights.items() if not torch.equal(value, start[name])]
    assert len(moved) > 10
    average = lambda trainer: next(c for c in trainer.callbacks if isinstance(c, EMA))._average_model.module  # noqa: E731
    assert_same_weights(average(captured_trainer).model, average(eager_trainer).model)
    states = [trainer.optimizers[0].state_dict()["state"] for trainer in (captured_trainer, eager_trainer)]
    assert states[0].keys() == states[1].keys()
    for key, state in states[1].items():
        assert states[0][key].keys() == state.keys()
        for name, value in state.items():
            # the moments of the stem's gradients drift by up to 0.5% of an element in 12 steps
            assert (states[0][key][name] - value).norm() <= 1e-3 * value.norm(), (key, name)


@pytest.mark.slow
def test_the_warm_up_before_the_clock_changes_nothing(tmp_path, counted):
    """Capturing runs three steps on random images before training: they leave the weights, the
    optimizer state and the EMA as they were. When fitting ends, the data module augments its
    batches and the EMA updates its average again (the step had taken both over)."""
    L.seed_everything(0)
    root = fake_cifar10(tmp_path / "data", per_class=12)
    datamodule = CIFAR10(root=str(root), val_size=16, batch_size=16, policy="trivial")
    model = ViTClassifier(vit=VIT, compile=True, capture_step=True)
    model.model.compile = lambda mode=None: None
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    ema = EMA(decay=0.9)
    trainer = L.Trainer(
        accelerator="cpu", max_steps=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, num_sanity_val_steps=0, callbacks=[ema],
    )  # fmt: skip
    trainer.fit(model, datamodule)
    assert model.captured is not None and counted.graphs == 1
    assert not datamodule.step_augments and not ema.step_updates
    model.captured.take_over()
    assert datamodule.step_augments and ema.step_updates
    for name, value in model.model.state_dict().items():
        assert torch.equal(value, before[name]), name
    state = trainer.optimizers[0].state
    assert state and all(float(s["step"]) == 0 and not s["exp_avg"].any() for s in state.values())


def test_what_the_captured_step_cannot_take_is_refused_in_one_line(tmp_path, counted):
    with pytest.raises(UsageError, match="capture_step compiles the step"):
        ViTClassifier(vit=VIT, capture_step=True)
    with pytest.raises(UsageError, match="MixUp and CutMix draw on the host"):
        fit(tmp_path, 1, capture=True, mixup_alpha=0.8)


@pytest.mark.slow
def test_inductor_compiles_the_step_that_trains_as_the_eager_step(tmp_path):
    """The same comparison through inductor, as a GPU run compiles it (C++ kernels here), with its
    random numbers drawn by torch's generator (`fallback_random`). Crops and flips only, and no
    drop path: inductor's fused arithmetic rounds some of the policy's pixels the other way, and
    its Bernoulli draws are not eager's."""
    torch._dynamo.reset()
    vit = replace(VIT, drop_path=0.0)
    with torch._inductor.config.patch(fallback_random=True):
        captured, _ = fit(tmp_path / "a", 4, capture=True, policy="none", vit=vit)
    eager, _ = fit(tmp_path / "b", 4, capture=False, policy="none", vit=vit)
    assert_same_weights(captured.model, eager.model)


def test_muon_steps_in_the_graph_as_its_eager_step_up_to_bf16_rounding_of_its_update(counted):
    """Muon's functional update traced whole: one graph, and the weights `vit.optim.Muon`'s eager
    step gives. Not bit for bit where bf16 is native: with the lr a tensor, Dynamo fuses
    `add_(update, alpha=-lr)` into one multiply-add whose product keeps the dtype of Muon's bf16
    orthogonalised update, so each update is rounded to bf16 (a relative 2^-8) where eager adds it
    in fp32."""
    torch.manual_seed(0)
    start = torch.randn(32, 16)
    grads = [torch.randn(32, 16) for _ in range(3)]
    eager, captured = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    reference = Muon([eager], lr=0.02, weight_decay=0.05)
    optimizer = Muon([captured], lr=torch.tensor(0.02), weight_decay=0.05)
    init_state(optimizer)
    step = torch.compile(lambda g: update(optimizer, {captured: g}), fullgraph=True)
    for grad in grads:
        eager.grad = grad.clone()
        reference.step()
        before = captured.detach().clone()
        with torch.no_grad(), tracing():
            step(grad.clone())
        moved = (captured - before).abs().max()
        assert moved > 0.01  # an update of lr * sqrt(32 / 16) per element, roughly
        torch.testing.assert_close(captured.detach(), eager.detach(), atol=float(moved) * 2**-7, rtol=0)
    assert counted.graphs == 1
    momentum = optimizer.state[captured]["momentum_buffer"]
    torch.testing.assert_close(momentum, reference.state[eager]["momentum_buffer"])


@pytest.mark.slow
def test_the_captured_step_logs_the_eager_steps_figures_at_the_same_steps(tmp_path, counted):
    """train/loss and train/lr are read back on logging steps only (a wait for a GPU): the captured
    loop logs them at the eager loop's steps, with the eager loop's values."""
    from lightning.pytorch.loggers import CSVLogger

    logged = {}
    for capture in (True, False):
        L.seed_everything(0)
        root = fake_cifar10(tmp_path / f"data{capture}", per_class=12)
        data = CIFAR10(root=str(root), val_size=16, batch_size=16, policy="trivial")
        model = ViTClassifier(vit=VIT, decay="linear", compile=capture, capture_step=capture)
        model.model.compile = lambda mode=None: None
        trainer = L.Trainer(
            accelerator="cpu", max_steps=9, log_every_n_steps=4, limit_val_batches=0,
            logger=CSVLogger(tmp_path, name=str(capture)), callbacks=[EMA(decay=0.9)],
            enable_checkpointing=False, enable_progress_bar=False, num_sanity_val_steps=0,
        )  # fmt: skip
        trainer.fit(model, data)
        rows = list(csv.DictReader(open(tmp_path / str(capture) / "version_0" / "metrics.csv")))
        logged[capture] = {
            key: [(r["step"], round(float(r[key]), 5)) for r in rows if r.get(key)]
            for key in ("train/loss", "train/lr")
        }
    assert logged[True] == logged[False]
    assert [step for step, _ in logged[True]["train/loss"]] == ["3", "7"]
