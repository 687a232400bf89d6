"""A training step that never waits for the GPU, checked on the CPU (`tests/syncs.py` follows
which tensors would live on a GPU and lists every operation that would make the host wait), and
the pieces of a fast step: the fused optimizer, the device-side batch order, a network that
compiles into one graph."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from syncs import WouldWait, training_tensors

from lab.cifar10_pack import fake_cifar10
from vit import ViT, ViTClassifier, ViTConfig
from vit.callbacks import EMA, ProgressBar
from vit.datamodules import CIFAR10, InMemory, ShuffledBatches, batches, whole_batch
from vit.optim import adamw


def test_the_checker_sees_each_kind_of_wait_and_nothing_on_the_host():
    device = torch.randn(8)
    with WouldWait([device]) as watch:
        (device * 2).sum().item()  # a value read back
        device[device > 0]  # a boolean mask: nonzero
        device.nonzero()
        device + torch.tensor([1.0] * 8)  # Python data copied to the device
        host = torch.rand(8)  # drawn on the host: no wait
        host.sum().item()
        (device * torch.tensor(2.0)).exp()  # a host scalar crosses without a copy
        device[torch.arange(4)]  # integer indices made by a factory
    kinds = sorted(key.split(":")[0] for key in watch.waits for _ in range(watch.waits[key]))
    assert kinds == [
        "a tensor built from Python data, copied to the device",
        "indexing with a boolean mask",
        "nonzero",
        "reads a value (.item(), float(), bool(), int())",
    ]


class WatchSteps(Callback):
    """Follows the tensors a GPU would hold from the start of training, and records what would
    wait for it from the end of the 3rd training step to the start of the 11th: 8 whole iterations
    (loading, augmentation, forward, backward, optimizer, EMA, logging), none a logging step.
    Following from the start matters: a value computed at the first step and read back later
    (Lightning shows a logged value in the progress bar at every step) waits for the GPU too."""

    def __init__(self):
        self.watch = None

    def on_train_start(self, trainer, pl_module):
        self.watch = WouldWait(training_tensors(trainer))
        self.watch.on = False
        self.watch.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.watch.on = batch_idx >= 2

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 10:
            self.watch.on = False
            self.watch.__exit__(None, None, None)


@pytest.mark.parametrize(
    "policy, flip, levers",  # the second with airbench's levers: alternating flips, whitening, Muon
    [("trivial", True, {}), ("randaugment", "alternate", {"optimizer": "muon", "whiten_stem": True})],
)
@pytest.mark.slow
def test_training_steps_of_the_gpu_recipe_would_not_wait_for_a_gpu(tmp_path, policy, flip, levers):
    root = fake_cifar10(tmp_path / "data", per_class=24)
    mixing = dict(mixup_alpha=0.8, cutmix_alpha=1.0)
    data = CIFAR10(root=str(root), val_size=16, batch_size=16, policy=policy, flip=flip, **mixing)
    vit = ViTConfig(preset="micro", patch_size=4, conv_stem=[8], conv_stem_strides=[1], drop_path=0.1)
    model = ViTClassifier(vit=vit, decay="linear", **levers)
    watch = WatchSteps()
    trainer = L.Trainer(
        accelerator="cpu", precision="bf16-mixed", max_steps=12, log_every_n_steps=50,
        callbacks=[watch, EMA(decay=0.99), ProgressBar(refresh_rate=50)], logger=False,
        enable_checkpointing=False, num_sanity_val_steps=0, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(model, data)
    assert watch.watch is not None and len(watch.watch.device) > 100  # it followed the tensors
    assert not watch.watch.waits, "\n".join(f"{n} x {w}" for w, n in watch.watch.waits.most_common())


def test_fused_and_foreach_adamw_take_the_same_steps():
    """The fused AdamW that `adamw` chooses on a GPU, run here on the CPU, steps as the multi-tensor
    one it chooses on a CPU (decayed and undecayed groups alike). A plain network: in a ViT the
    key bias gets a gradient of rounding noise only (softmax ignores it), which Adam scales up."""
    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))]
    nets.append(copy.deepcopy(nets[0]))
    start = copy.deepcopy(nets[0].state_dict())
    foreach = adamw(nets[0], lr=1e-2, weight_decay=0.05)
    assert foreach.defaults["foreach"] and not foreach.defaults["fused"]  # on the CPU
    assert sorted(g["weight_decay"] for g in foreach.param_groups) == [0.0, 0.05]
    fused = adamw(nets[1], lr=1e-2, weight_decay=0.05)
    for group in fused.param_groups:  # what adamw chooses on a GPU, here on the CPU
        group.update(fused=True, foreach=None)
    x, y = torch.randn(32, 12), torch.randint(4, (32,))
    for _ in range(5):
        for net, optimizer in zip(nets, (foreach, fused), strict=True):
            torch.nn.functional.cross_entropy(net(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    for (name, a), b in zip(nets[0].state_dict().items(), nets[1].state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
        assert (a - start[name]).abs().max() > 1e-3, name  # each moved


def test_shuffled_batches_come_in_the_order_a_shuffled_dataloader_draws():
    dataset = InMemory(torch.arange(50).view(50, 1, 1, 1), torch.arange(50))
    for drop_last, expected_batches in ((True, 3), (False, 4)):
        order = ShuffledBatches(50, 16, drop_last, torch.device("cpu"))
        torch.manual_seed(3)
        ours = [
            labels
            for _, labels in torch.utils.data.DataLoader(dataset, batch_sampler=order, collate_fn=whole_batch)
        ]
        torch.manual_seed(3)
        reference = torch.utils.data.DataLoader(
            dataset, batch_size=16, shuffle=True, drop_last=drop_last, collate_fn=whole_batch
        )
        theirs = [labels for _, labels in reference]
        assert len(ours) == len(order) == expected_batches
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a, b)
    loader = batches(dataset, 16, shuffle=True)
    assert isinstance(loader.batch_sampler, ShuffledBatches) and len(loader) == 3
    shared = batches(dataset, 16, shuffle=True, processes=2, rank=1)  # each process's share: 25 images
    assert isinstance(shared.batch_sampler, ShuffledBatches) and len(shared) == 1


@pytest.mark.slow
def test_the_recipe_network_compiles_into_one_graph():
    """No graph break in the forward and backward of the GPU recipe's kind of network (conv stem,
    mean pooling, drop path) in training: a break splits the compiled step and hands control back
    to Python in the middle of it."""
    torch._dynamo.reset()
    vit = ViTConfig(preset="micro", image_size=16, patch_size=4, conv_stem=[8], conv_stem_strides=[1],
                    pool="mean", drop_path=0.1, patch_norm=True)  # fmt: skip
    network = ViT(vit).train()
    explanation = torch._dynamo.explain(lambda x: network(x).float().sum())(torch.rand(4, 3, 16, 16))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
