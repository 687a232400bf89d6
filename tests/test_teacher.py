"""Distillation from a CNN teacher (DeiT's hard labels, vit.teacher): each head learns its own
target, the loss is half of each, the student's checkpoint needs no teacher, the one-line
refusals, and `teacher: airbench` trained on the training clock."""

import csv

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import command_error, tiny_args
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.loggers import CSVLogger
from torch import nn

from lab.cifar10_pack import fake_cifar10
from vit import CIFAR10, CNNClassifier, ViTClassifier, ViTConfig, compat
from vit.classifier import MODELS
from vit.cnn import AirbenchCNN
from vit.commands import train as cli
from vit.commands.eval import EvalOptions, evaluate
from vit.errors import UsageError
from vit.teacher import AirbenchTraining, Teacher, airbench_lr, load_teacher

# a distilled micro ViT of 16x16 grayscale images, 4 patches of 8x8 pixels
VIT = ViTConfig(preset="micro", patch_size=8, distilled=True)
STUDENT = dict(num_classes=4, image_size=16, in_channels=1, vit=VIT)
# two circles at toy size, with options a distillation token combines with (rel_pos_bias does not)
DISTILLED = [
    "--model.vit.distilled", "true", "--model.vit.rel_pos_bias", "false", "--model.vit.pos_embed", "learned",
]  # fmt: skip
SMALL = ["--data.init_args.num_train", "128", "--data.init_args.num_val", "64", "--trainer.max_epochs", "1"]


class Always(nn.Module):
    """A network that answers `label` for every image."""

    def __init__(self, label: int, classes: int = 4):
        super().__init__()
        self.label, self.classes = label, classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.one_hot(torch.full((len(x),), self.label), self.classes).float()


def brightness_data(n: int = 256, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """16x16 images whose label (0-3) is their brightness, with noise: learned in a few steps."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=generator)
    images = 0.1 + 0.25 * labels[:, None, None, None] + 0.1 * torch.rand(n, 1, 16, 16, generator=generator)
    return images, labels


def heads(student: ViTClassifier, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return student.model.forward_heads(student.model.forward_features(images))


def save_classifier(classifier, path):
    """A checkpoint as vit-train writes one (without a data module)."""
    hparams = {**classifier.hparams, "_class_path": f"vit.classifier.{type(classifier).__name__}"}
    ckpt = {"state_dict": classifier.state_dict(), "hyper_parameters": hparams}
    torch.save({**ckpt, compat.CHECKPOINT_KEY: compat.FORMAT_VERSION}, path)
    return path


def metrics(run) -> list[dict]:
    with open(run / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_the_distillation_head_learns_the_teacher_and_the_class_head_the_labels():
    """The teacher always answers 3; the labels are the images' brightness: after training, the
    distillation head answers 3 and the class head the labels (neither could if the loss mixed
    their targets up), and in eval the model gives both heads' mean."""
    torch.manual_seed(0)
    student = ViTClassifier(**STUDENT, label_smoothing=0.0)
    student.teacher = Teacher(Always(3))
    images, labels = brightness_data()
    optimizer = torch.optim.AdamW(student.parameters(), lr=3e-3)
    student.train()
    for _ in range(6):
        for x, y in zip(images.split(32), labels.split(32), strict=True):
            _, loss = student.loss(x, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    student.eval()
    test_images, test_labels = brightness_data(seed=1)
    classes, distilled = heads(student, test_images)
    assert (distilled.argmax(-1) == 3).float().mean() > 0.95
    assert (classes.argmax(-1) == test_labels).float().mean() > 0.9
    torch.testing.assert_close(student(test_images), (classes + distilled) / 2)


@pytest.mark.parametrize("mixed", [False, True], ids=["labels", "mixup-probabilities"])
def test_the_loss_with_a_teacher_is_half_each_heads_cross_entropy(mixed):
    torch.manual_seed(0)
    student = ViTClassifier(**STUDENT, label_smoothing=0.1).train()
    student.teacher = Teacher(nn.Sequential(nn.Flatten(), nn.Linear(256, 4)))  # a fixed random teacher
    images, labels = brightness_data(16)
    targets = F.one_hot(labels, 4).float().lerp(torch.full((16, 4), 0.25), 0.3) if mixed else labels
    answers = student.teacher.network(images).argmax(-1)
    assert answers.unique().numel() > 1  # a teacher that does not agree with itself everywhere
    logits, loss = student.loss(images, targets)
    classes, distilled = heads(student, images)
    from_labels = F.cross_entropy(classes, targets, label_smoothing=0.1)
    torch.testing.assert_close(loss, 0.5 * from_labels + 0.5 * F.cross_entropy(distilled, answers))
    torch.testing.assert_close(logits, (classes + distilled) / 2)
    # outside training (validation, test), the teacher takes no part: the heads' mean, as usual
    student.eval()
    logits, loss = student.loss(images, targets)
    torch.testing.assert_close(loss, F.cross_entropy(logits, targets, label_smoothing=0.1))


@pytest.mark.slow
def test_a_students_checkpoint_has_no_teacher_and_evaluates_without_it(runs, tmp_path):
    """vit-train fit with a CNN teacher's checkpoint: the teacher is loaded (frozen, in eval mode,
    on the training device), kept out of the student's checkpoint, and vit-eval reads the student
    with the teacher's file gone."""
    cnn = CNNClassifier(num_classes=4, in_channels=1, arch="bag", receptive_field=3, width=8)
    teacher = save_classifier(cnn, tmp_path / "cnn.ckpt")
    result = cli.run(["fit", *tiny_args(runs, *DISTILLED, *SMALL, "--model.teacher", str(teacher))])
    student = result.model
    assert isinstance(student.teacher, Teacher) and not student.teacher.network.training
    assert not any(p.requires_grad for p in student.teacher.network.parameters())
    assert next(student.teacher.network.parameters()).device == student.device
    best = runs / "tiny" / "version_0" / "checkpoints" / "best.ckpt"
    saved = torch.load(best, weights_only=True)
    assert saved["hyper_parameters"]["teacher"] == str(teacher)
    assert saved["state_dict"] and all(key.startswith("model.") for key in saved["state_dict"])
    teacher.unlink()
    measured = evaluate(EvalOptions(ckpt=best), progress=False)
    assert measured["num_images"] == 128 and 0 <= measured["top1"] <= 1


def test_a_teacher_needs_a_distillation_token_and_the_datas_classes(tmp_path):
    with pytest.raises(UsageError, match=r"^teacher=cnn.ckpt needs vit.distilled: true$"):
        ViTClassifier(num_classes=4, vit=ViTConfig(preset="micro"), teacher="cnn.ckpt")
    with pytest.raises(UsageError, match="teacher_epochs=0 must be at least 1"):
        ViTClassifier(**STUDENT, teacher="airbench", teacher_epochs=0)
    three = save_classifier(CNNClassifier(num_classes=3, in_channels=1, width=8), tmp_path / "three.ckpt")
    with pytest.raises(UsageError, match=r"three.ckpt tells 3 classes apart, the data has 4$"):
        load_teacher(three, num_classes=4, models=MODELS)
    with pytest.raises(FileNotFoundError, match=r"teacher .*missing.ckpt: no such checkpoint"):
        load_teacher(tmp_path / "missing.ckpt", num_classes=4, models=MODELS)


@pytest.mark.slow
def test_vit_train_refuses_a_bad_teacher_in_one_line(runs, tmp_path, capsys):
    status, message = command_error(
        cli.main, ["fit", *tiny_args(runs, "--model.teacher", "airbench")], capsys
    )
    assert status == 2 and message == "error: teacher=airbench needs vit.distilled: true"
    missing = tmp_path / "missing.ckpt"
    status, message = command_error(
        cli.main, ["fit", *tiny_args(runs, *DISTILLED, *SMALL, "--model.teacher", missing)], capsys
    )
    assert status == 1 and message.startswith(f"error: teacher {missing}: no such checkpoint")


def test_the_airbench_schedule():
    """airbench94's get_lr: 0.2 at the start, 1 at 23% of the steps, 0.07 at the end."""
    assert [round(airbench_lr(p), 6) for p in (0.0, 0.115, 0.23, 0.615, 1.0)] == [0.2, 0.6, 1.0, 0.535, 0.07]


def test_airbench_training_steps_at_the_schedules_learning_rate_and_freezes_the_stems_bias():
    """A step at progress p: both groups at their peak times airbench_lr(p) (BatchNorm's biases at
    64 times the rest), the loss summed over the batch with label smoothing 0.2, as computed
    before the step; from epoch 3 the stem's bias no longer moves."""
    torch.manual_seed(0)
    network = AirbenchCNN(10, 3, widths=(8, 16, 16))
    images, labels = torch.rand(6, 3, 32, 32), torch.arange(6)
    network.whiten(images)
    training = AirbenchTraining(network, batch_size=6)
    other, biases = training.peak_lr[1], training.peak_lr[0]
    assert biases == pytest.approx(64 * other)
    for epoch, progress in ((0, 0.0), (2, 0.5), (3, 0.9)):
        training.start_epoch(epoch)
        assert network.training and network.stem.bias.requires_grad == (epoch < 3)
        with torch.no_grad():
            expected = F.cross_entropy(network(images), labels, label_smoothing=0.2, reduction="sum")
        bias = network.stem.bias.detach().clone()
        loss = training.step(images, labels, progress)
        torch.testing.assert_close(loss, expected)
        lrs = [group["lr"] for group in training.optimizer.param_groups]
        assert lrs == pytest.approx([peak * airbench_lr(progress) for peak in training.peak_lr])
        assert torch.equal(network.stem.bias, bias) == (epoch >= 3)


class Clock(L.Callback):
    """The training clock's reading (Lightning's Timer) at the ViT's first step."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.global_step == 0:
            self.first_step = next(c for c in trainer.callbacks if isinstance(c, Timer)).time_elapsed()


@pytest.mark.parametrize("bar", [False, True])
def test_an_airbench_teacher_trains_on_the_training_clock(tmp_path, monkeypatch, capsys, bar):
    """`teacher: airbench` on a fake CIFAR-10 (one epoch of 40 images, MixUp on): trained when
    training starts, on the batches the ViT sees (the data module's augmentation, once per batch),
    its seconds on the clock of --trainer.max_time before the ViT's first step, its validation
    accuracy logged; then the ViT trains with it. Its steps have a progress bar where the trainer
    has one."""
    augmented = []
    augment = CIFAR10.augment
    monkeypatch.setattr(CIFAR10, "augment", lambda self, *batch: augmented.append(1) or augment(self, *batch))
    root = fake_cifar10(tmp_path / "data", per_class=5)
    data = CIFAR10(root=str(root), val_size=10, batch_size=8, mixup_alpha=0.8)
    student = ViTClassifier(vit=VIT, teacher="airbench", teacher_epochs=1)  # 10 classes of 32x32 RGB
    clock = Clock()
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, max_time={"minutes": 10}, logger=CSVLogger(tmp_path, name="run"),
        callbacks=[clock], enable_checkpointing=False, enable_progress_bar=bar, num_sanity_val_steps=0,
        enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(student, data)
    printed = capsys.readouterr()
    assert "teacher: airbench trained for 1 epochs" in printed.out
    # the bar is drawn where the trainer draws one; not its last state: tqdm skips redraws closer
    # than 0.1 s apart, and a bar that is not left is cleared unredrawn
    assert ("teacher: airbench, 1 epochs:" in printed.err) == bar
    rows = metrics(tmp_path / "run" / "version_0")
    [seconds] = [float(r["time/teacher_seconds"]) for r in rows if r.get("time/teacher_seconds")]
    [accuracy] = [float(r["teacher/acc"]) for r in rows if r.get("teacher/acc")]
    assert 0 < seconds < clock.first_step and 0 <= accuracy <= 1
    steps = 40 // 8
    assert trainer.global_step == steps and len(augmented) == 1 + 2 * steps  # whitening, teacher, ViT
    teacher = student.teacher
    assert isinstance(teacher, Teacher) and not teacher.network.stem.weight.requires_grad  # whitened
    # NHWC weights: oneDNN's faster convolutions on the CPU, cuDNN's on a GPU
    assert teacher.network.blocks[0][0].weight.is_contiguous(memory_format=torch.channels_last)


def test_an_airbench_teacher_alternates_its_flips_by_its_own_epochs(tmp_path, monkeypatch):
    """With `flip: alternate`, the teacher's epochs mirror each image one way then the other, as the
    ViT's do: it trains before the trainer's first epoch, so the parity is the teacher's epoch."""
    parities = []
    augment = CIFAR10.augment

    def spy(self, *batch):
        parities.append(bool(self.odd_epoch))
        return augment(self, *batch)

    monkeypatch.setattr(CIFAR10, "augment", spy)
    root = fake_cifar10(tmp_path / "data", per_class=4)
    data = CIFAR10(root=str(root), val_size=8, batch_size=8, flip="alternate")
    student = ViTClassifier(vit=VIT, teacher="airbench", teacher_epochs=2)
    trainer = L.Trainer(
        accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, num_sanity_val_steps=0, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(student, data)
    per_epoch = 32 // 8
    # whitening (epoch 0), the teacher's two epochs, then the ViT's first step (epoch 0)
    assert parities == [False] * (1 + per_epoch) + [True] * per_epoch + [False]


@pytest.mark.slow
def test_an_airbench_teacher_trains_before_a_captured_step(tmp_path, monkeypatch):
    """A captured step augments raw batches itself, so the data module leaves them raw: the teacher
    augments its own (it trained on uint8 images before, and failed). The step is traced again at
    the first step, with the teacher in it (it trains on the clock, after the capture)."""
    graphs = []
    compile_ = torch.compile
    monkeypatch.setattr(
        "vit.captured_step.torch.compile",
        lambda fn, mode=None, fullgraph=True: compile_(
            fn, backend=lambda gm, inputs: graphs.append(gm) or gm.forward, fullgraph=True
        ),
    )
    torch._dynamo.reset()
    root = fake_cifar10(tmp_path / "data", per_class=4)
    data = CIFAR10(root=str(root), val_size=8, batch_size=8, policy="trivial")
    student = ViTClassifier(vit=VIT, teacher="airbench", teacher_epochs=1, compile=True, capture_step=True)
    student.model.compile = lambda mode=None: None  # the network's own compilation: eager here
    trainer = L.Trainer(
        accelerator="cpu", max_steps=3, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, num_sanity_val_steps=0, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(student, data)
    assert trainer.global_step == 3 and student.teacher is not None
    assert len(graphs) == 2  # captured before the clock, and again with the teacher
