"""Muon on a ViT's block matrices beside AdamW (vit/optim.py, `Classifier(optimizer="muon")`):
which parameters each takes, what a step does, the schedule of both, and resuming both. SGD with
Nesterov momentum (`optimizer="sgd"`): its steps against the update written out."""

from __future__ import annotations

import copy
import math

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.overrides import TorchFunctionMode

import vit.optim
from vit import CNNClassifier, TwoCircles, ViTClassifier, ViTConfig
from vit.errors import UsageError
from vit.optim import Combined, Muon, OptimizerOptions, build_optimizer

VIT = ViTConfig(preset="micro", patch_size=8, conv_stem=[8], conv_stem_strides=[1], patch_norm=True)


class LearningRates(Callback):
    """Each optimizer's learning rates over its base rates, before every step."""

    def __init__(self):
        self.factors: list[list[float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        groups = trainer.optimizers[0].param_groups
        self.factors.append([group["lr"] / group["initial_lr"] for group in groups])


def fit(root, max_steps: int, ckpt_path=None, callbacks=(), **options) -> tuple[ViTClassifier, L.Trainer]:
    """A micro ViT (conv stem, patch norm) trained with Muon (or `options`) on two circles: 4 steps
    an epoch."""
    L.seed_everything(0, verbose=False)
    data = TwoCircles(num_train=64, num_val=16, num_test=16, batch_size=16)
    options = {"optimizer": "muon", "lr": 3e-3, **options}
    model = ViTClassifier(num_classes=4, image_size=32, in_channels=1, vit=VIT, **options)
    trainer = L.Trainer(
        accelerator="cpu", max_steps=max_steps, logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=list(callbacks), default_root_dir=root,
    )  # fmt: skip
    trainer.fit(model, data, ckpt_path=ckpt_path)
    return model, trainer


def test_muon_takes_the_block_matrices_and_the_schedule_scales_both(tmp_path):
    rates = LearningRates()
    model, trainer = fit(tmp_path, max_steps=6, callbacks=[rates])
    combined = trainer.optimizers[0]
    assert isinstance(combined, Combined)
    muon, adam = combined.optimizers
    assert isinstance(muon, torch.optim.Muon) and isinstance(adam, torch.optim.AdamW)
    names = {id(p): name for name, p in model.model.named_parameters()}
    in_muon = sorted(names[id(p)] for group in muon.param_groups for p in group["params"])
    layers = ("attn.proj.weight", "attn.qkv.weight", "mlp.fc1.weight", "mlp.fc2.weight")
    assert in_muon == [f"blocks.{i}.{layer}" for i in range(VIT.resolve().depth) for layer in layers]
    in_adam = [names[id(p)] for group in adam.param_groups for p in group["params"]]
    assert sorted(in_muon + in_adam) == sorted(names.values())  # every parameter, once
    assert {"stem.0.weight", "patch_embed.proj.weight", "head.weight", "cls_token"} <= set(in_adam)
    # the groups Lightning's scheduler sees are the two optimizers' own
    assert all(
        a is b for a, b in zip(combined.param_groups, muon.param_groups + adam.param_groups, strict=True)
    )
    assert [g["initial_lr"] for g in muon.param_groups] == [0.02]
    assert {g["initial_lr"] for g in adam.param_groups} == {3e-3}
    # every step, all groups at the same share of their base rate: warm-up, then the decay
    assert all(max(step) - min(step) < 1e-12 for step in rates.factors), rates.factors
    factors = [step[0] for step in rates.factors]
    assert len(factors) == 6 and factors[0] < factors[1] > factors[-1] and len(set(factors)) > 3
    assert all(len(muon.state[p]["momentum_buffer"]) for p in muon.param_groups[0]["params"])


def test_a_combined_step_is_each_optimizers_step_and_muon_orthogonalises_it():
    """Against torch.optim.Muon and AdamW each stepping alone on copies: the same parameters,
    bit for bit. The first Muon update of a gradient whose singular values span 2 decades is
    orthogonalised: lr times (Keller Jordan's) sqrt(rows / columns) times a matrix whose singular
    values Newton-Schulz leaves between 0.5 and 1.5, with the gradient's singular vectors."""
    torch.manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(12, 12))
    v, _ = torch.linalg.qr(torch.randn(6, 6))
    spread = torch.logspace(1, -1, 6)
    grad = u[:, :6] @ torch.diag(spread) @ v.T  # (12, 6)
    weight, bias = torch.nn.Parameter(torch.randn(12, 6)), torch.nn.Parameter(torch.randn(6))
    alone = [torch.nn.Parameter(weight.detach().clone()), torch.nn.Parameter(bias.detach().clone())]

    def optimizers(w, b):
        return torch.optim.Muon([w], lr=0.02, momentum=0.95, weight_decay=0.0), torch.optim.AdamW(
            [b], lr=0.01
        )

    combined = Combined(list(optimizers(weight, bias)))
    references = optimizers(*alone)
    start = weight.detach().clone()
    for step in range(3):
        for w, b in ((weight, bias), alone):
            w.grad, b.grad = grad * (step + 1), torch.full((6,), 0.5)
        combined.step()
        for reference in references:
            reference.step()
        if step == 0:
            update = (start - weight.detach()) / (0.02 * math.sqrt(12 / 6))
            left, values, right = torch.linalg.svd(update, full_matrices=False)
            assert values.min() > 0.5 and values.max() < 1.5, values
            # the same singular directions as the gradient's: U^T update V diagonal
            inner = u[:, :6].T @ update @ v
            assert (inner - torch.diag(inner.diagonal())).abs().max() < 0.05
        torch.testing.assert_close(weight, alone[0], rtol=0, atol=0)
        torch.testing.assert_close(bias, alone[1], rtol=0, atol=0)
    combined.zero_grad()
    assert weight.grad is None and bias.grad is None


class MatmulDtypes(TorchFunctionMode):
    """The dtypes of the matrix products called inside it (`@`, `torch.mm`, `torch.addmm`)."""

    def __init__(self):
        super().__init__()
        self.dtypes: set[torch.dtype] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.__matmul__, torch.matmul, torch.mm, torch.addmm):
            self.dtypes |= {a.dtype for a in args if torch.is_tensor(a)}
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("native", [True, False])
def test_the_classifiers_muon_multiplies_in_bf16_only_where_bf16_is_native(tmp_path, monkeypatch, native):
    """torch.optim.Muon runs its Newton-Schulz iterations in bf16 on any device: a CPU without
    AVX-512 BF16 or AMX emulates those products (on a 2-core Zen 3, Muon's run trained at 124
    images/s where AdamW's trained at 295). The classifier's Muon multiplies in bf16 where that
    is native and in fp32 elsewhere."""
    monkeypatch.setattr(vit.optim, "cpu_has_native_bf16", lambda: native)
    _, trainer = fit(tmp_path, max_steps=1)
    muon = trainer.optimizers[0].optimizers[0]
    for group in muon.param_groups:
        for p in group["params"]:
            p.grad = torch.randn_like(p)
    with MatmulDtypes() as seen:
        muon.step()
    assert seen.dtypes == {torch.bfloat16 if native else torch.float32}


def newton_schulz_float64(update: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Keller Jordan's quintic iteration written out in float64, on the wide side."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = update.double().T if update.size(0) > update.size(1) else update.double()
    x = x / x.norm()
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if update.size(0) > update.size(1) else x


def test_muon_steps_as_torchs_with_native_bf16_and_nearer_exact_in_fp32(monkeypatch):
    """`vit.optim.Muon` against torch.optim.Muon over three steps (momentum, Nesterov, weight
    decay, a tall matrix): bit for bit where bf16 is native. Elsewhere its fp32 iterations are
    within 1e-5 of the float64 ones, where torch's bf16 ones are over 1e-3 off."""
    torch.manual_seed(0)
    start, grads = torch.randn(48, 24), [torch.randn(48, 24) for _ in range(3)]
    update, coefficients = grads[0] + torch.randn(48, 24), (3.4445, -4.7750, 2.0315)
    exact = newton_schulz_float64(update)
    torch_bf16 = torch.optim._muon._zeropower_via_newtonschulz(update, coefficients, 5, 1e-7)
    assert (torch_bf16 - exact).abs().max() > 1e-3
    assert (vit.optim.orthogonalise(update, coefficients, 5, 1e-7, torch.float32) - exact).abs().max() < 1e-5
    for native in (True, False):
        monkeypatch.setattr(vit.optim, "cpu_has_native_bf16", lambda native=native: native)
        w, reference = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
        options = dict(lr=0.02, weight_decay=0.05)
        optimizers = [Muon([w], **options), torch.optim.Muon([reference], **options)]
        assert optimizers[0].ns_dtype == (torch.bfloat16 if native else torch.float32)
        for grad in grads:
            w.grad, reference.grad = grad.clone(), grad.clone()
            for optimizer in optimizers:
                optimizer.step()
        moved = (reference - start).abs().max()
        difference = (w - reference).abs().max()
        assert difference == 0 if native else 0 < difference < moved * 2**-5, (native, difference, moved)


def test_combined_state_dict_round_trips_both_optimizers():
    """A fresh Combined loaded from another's state goes on exactly as that one goes on, and its
    param_groups are again the loaded optimizers' own groups (what a scheduler changes)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 3))
    twin = copy.deepcopy(net)

    def combined(network):
        muon = torch.optim.Muon([network[0].weight], lr=0.02)
        rest = [p for name, p in network.named_parameters() if name != "0.weight"]
        return Combined([muon, torch.optim.AdamW(rest, lr=0.01)])

    x, y = torch.randn(16, 8), torch.randint(3, (16,))

    def step(network, optimizer):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(network(x), y).backward()
        optimizer.step()

    first = combined(net)
    for _ in range(3):
        step(net, first)
    twin.load_state_dict(net.state_dict())
    second = combined(twin)
    second.load_state_dict(copy.deepcopy(first.state_dict()))  # as from a file: no tensor shared
    assert len(second.state) == len(first.state) == 4  # Muon's matrix and AdamW's three
    for group in second.param_groups:
        group["lr"] *= 0.5  # as a scheduler would: both optimizers see it
    for group in first.param_groups:
        group["lr"] *= 0.5
    assert [g["lr"] for g in second.optimizers[0].param_groups] == [0.01]
    for _ in range(2):
        step(net, first)
        step(twin, second)
    for a, b in zip(net.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_checkpoint_resumes_both_optimizers_exactly(tmp_path):
    """Stopped at step 3 of 8 (mid-epoch) and resumed from its checkpoint, a Muon run ends with
    the weights and optimizer states of the run never stopped."""
    every_3 = ModelCheckpoint(tmp_path / "ckpts", every_n_train_steps=3, save_top_k=-1)
    unstopped, trainer = fit(tmp_path / "a", max_steps=8, callbacks=[every_3])
    resumed, again = fit(tmp_path / "b", max_steps=8, ckpt_path=tmp_path / "ckpts" / "epoch=0-step=3.ckpt")
    for (name, a), b in zip(unstopped.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    states = [t.optimizers[0].state_dict()["optimizers"] for t in (trainer, again)]
    for one, other in zip(*states, strict=True):
        assert one["param_groups"] == other["param_groups"]
        for key, state in one["state"].items():
            for name, value in state.items():
                torch.testing.assert_close(value, other["state"][key][name], rtol=0, atol=0)


def test_muon_is_refused_where_it_has_no_blocks_or_with_layer_decay():
    with pytest.raises(UsageError, match="optimizer=muon needs a ViT"):
        CNNClassifier(optimizer="muon")
    with pytest.raises(UsageError, match="layer_decay goes with optimizer=adamw"):
        ViTClassifier(optimizer="muon", layer_decay=0.7)
    with pytest.raises(UsageError, match="optimizer='lion' must be 'adamw', 'muon' or 'sgd'"):
        ViTClassifier(optimizer="lion")


def test_sgd_steps_with_nesterov_momentum_and_l2_on_the_weight_matrices_alone():
    """Two steps of a classifier's `optimizer="sgd"` (`build_optimizer`) on a micro ViT against SGD
    written out: g' = g + wd * p where the parameter decays, b = m * b + g' (b = g' at first),
    p -= lr * (g' + m * b). Biases, norms, positions and the class token do not decay; the
    stem's, embedding's, blocks' and head's matrices do."""
    torch.manual_seed(0)
    lr, wd, m = 0.05, 0.1, 0.85
    options = dict(optimizer="sgd", lr=lr, weight_decay=wd, momentum=m)
    classifier = ViTClassifier(num_classes=4, image_size=32, in_channels=1, vit=VIT, **options)
    model = classifier.model
    optimizer = build_optimizer(model, OptimizerOptions.of(classifier.hparams))
    decayed = {
        name for name, p in model.named_parameters()
        for group in optimizer.param_groups if group["weight_decay"] for q in group["params"] if p is q
    }  # fmt: skip
    assert {"stem.0.weight", "patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "head.weight"} <= decayed
    assert not decayed & {"cls_token", "pos_embed", "head.bias", "norm.weight", "blocks.0.norm1.weight"}
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    buffers: dict[str, torch.Tensor] = {}
    for step in range(2):
        x, y = torch.randn(8, 1, 32, 32), torch.randint(4, (8,))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        for name, p in model.named_parameters():
            g = p.grad + (wd * params[name] if name in decayed else 0)
            buffers[name] = g if step == 0 else m * buffers[name] + g
            params[name] = params[name] - lr * (g + m * buffers[name])
        optimizer.step()
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.detach(), params[name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_classifier_with_optimizer_sgd_trains_with_it_on_the_schedule(tmp_path):
    rates = LearningRates()
    model, trainer = fit(tmp_path, max_steps=6, callbacks=[rates], optimizer="sgd", lr=0.1, momentum=0.85)
    optimizer = trainer.optimizers[0]
    assert type(optimizer) is torch.optim.SGD
    settings = {(g["momentum"], g["nesterov"], g["initial_lr"]) for g in optimizer.param_groups}
    assert settings == {(0.85, True, 0.1)}
    factors = [step[0] for step in rates.factors]
    assert len(factors) == 6 and factors[0] < factors[1] > factors[-1]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    assert len(params) == len(list(model.parameters()))
    assert all(optimizer.state[p]["momentum_buffer"] is not None for p in params)
    with pytest.raises(UsageError, match="momentum=1.0 must lie in"):
        ViTClassifier(optimizer="sgd", momentum=1.0)
    with pytest.raises(UsageError, match="capture_step goes with optimizer=adamw or muon"):
        ViTClassifier(optimizer="sgd", compile=True, capture_step=True)
