"""The Lightning modules: a ViT or a CNN baseline, trained the same way."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from vit import compat
from vit.callbacks import FiniteLoss, LearningRate, budget_callbacks, logged_step, training_progress
from vit.captured_step import CapturedStep, check_compile, compile_training
from vit.cnn import AirbenchCNN, BagCNN, ResNet
from vit.config import ViTConfig
from vit.errors import UsageError, require
from vit.layers import first_conv, whiten_, whitening_images
from vit.metrics import MeanLoss
from vit.model import ViT
from vit.optim import OptimizerOptions, build_optimizer, check_schedule, warmup_decay
from vit.preparation import for_the_device
from vit.pretrained import for_finetuning
from vit.teacher import AIRBENCH, Teacher, distillation_loss, load_teacher, train_airbench


class Classifier(L.LightningModule):
    """Image classification with any network: cross-entropy with label smoothing, accuracy
    metrics, AdamW without decay on biases, norms and embeddings (with `optimizer: muon`, Muon on
    a ViT's block matrices beside it; with `optimizer: sgd`, SGD with Nesterov momentum in its
    place: `vit.optim`), linear warm-up then a cosine (or linear) decay over the step limit or the
    time budget (`vit.callbacks.TimeBudget`), whichever ends first. `compile: true` (or a mode)
    trains through `torch.compile`, compiled before the training clock starts; `capture_step`
    compiles the whole step (`vit.captured_step`). Subclasses build `self.model` and pass these
    training settings through `**kwargs`."""

    def __init__(
        self,
        num_classes: int = 10,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_fraction: float = 0.05,  # share of all optimizer steps spent warming up linearly
        min_lr_fraction: float = 0.01,  # the decay ends at lr * min_lr_fraction
        decay: Literal["cosine", "linear"] = "cosine",  # the shape from the warm-up's end to the floor
        label_smoothing: float = 0.1,
        # torch.compile the network for training (before the clock starts): true, or a mode;
        # reduce-overhead replays CUDA graphs, for small kernels on a GPU
        compile: bool | Literal["default", "reduce-overhead", "max-autotune"] = False,
        layer_decay: float | None = None,  # layer-wise lr decay (ViTs; fine-tuning): 0.65 to 0.75
        # the whole training step (augmentation, forward, backward, optimizer, EMA) as one graph,
        # compiled in `compile`'s mode: no kernel launched from Python (vit.captured_step)
        capture_step: bool = False,
        # muon: Muon on the weight matrices of a ViT's blocks, AdamW on the rest (`vit.optim`);
        # sgd: SGD with Nesterov momentum (`momentum`) at lr, weight decay as L2
        optimizer: Literal["adamw", "muon", "sgd"] = "adamw",
        muon_lr: float = 0.02,  # Muon's peak lr (Keller Jordan's default), scheduled as lr is
        muon_momentum: float = 0.95,  # Nesterov momentum of the updates Muon orthogonalises
        momentum: float = 0.9,  # optimizer=sgd's Nesterov momentum (airbench's: 0.85)
        # at fit start, the network's first convolution whitens the patches of training images
        # (airbench's initialisation: `whiten_stem`); a ViT needs a conv stem, a CNN arch=airbench
        whiten_stem: bool = False,
    ):
        super().__init__()
        self.save_hyperparameters()  # these arguments and the subclass's: a checkpoint rebuilds its model
        self.optimizer_options = OptimizerOptions.of(self.hparams)  # checked: a bad option is one line
        check_schedule(warmup_fraction, min_lr_fraction, decay)
        require(0 <= label_smoothing < 1, f"label_smoothing={label_smoothing} must lie in [0, 1)")
        # capture_step, read here once: a captured step updates the weights itself (manual optimisation)
        self.automatic_optimization = not capture_step
        check_compile(compile, not self.automatic_optimization, optimizer)
        self.captured: CapturedStep | None = None
        accuracy = lambda: MulticlassAccuracy(num_classes, average="micro")  # noqa: E731
        self.train_acc, self.val_acc, self.test_acc = accuracy(), accuracy(), accuracy()
        self.losses = nn.ModuleDict({"val": MeanLoss(), "test": MeanLoss()})  # val/loss, test/loss

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The logits of images `x` and their loss: cross-entropy with label smoothing against `y`,
        class indices (N,) or class probabilities (N, classes) from MixUp/CutMix, taken as they are."""
        logits = self(for_the_device(x, self.model))
        return logits, F.cross_entropy(logits, y, label_smoothing=self.hparams.label_smoothing)

    def _step(self, batch, stage: str, accuracy: MulticlassAccuracy) -> torch.Tensor:
        logits, loss = self.loss(*batch)
        self._log(stage, logits, batch[1], loss, accuracy)
        return loss

    def _log(self, stage: str, logits, y, loss, accuracy: MulticlassAccuracy) -> None:
        # accuracy counts probabilities (MixUp, CutMix) against their largest class
        accuracy(logits, y.argmax(dim=1) if y.ndim == 2 else y)
        if stage != "train":  # over every process's images, as accuracy is (torchmetrics)
            self.losses[stage].update(loss, len(y))
            self.log(f"{stage}/loss", self.losses[stage], prog_bar=True, on_epoch=True)
        elif self._trainer is None or logged_step(self.trainer, self.trainer.global_step + 1):
            # a step's loss is read back from the device (a wait for a GPU) where it is logged, so
            # only on the steps Lightning writes to the logger; accuracy accumulates on the device.
            # Not prog_bar: Lightning would read the last logged value back at every step
            # (`vit.callbacks.ProgressBar` shows it, read when the bar is drawn)
            self.log("train/loss", loss, on_step=True, on_epoch=False)
        self.log(f"{stage}/acc", accuracy, prog_bar=True, on_step=False, on_epoch=True)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor | None:
        if self.captured is None:
            return self._step(batch, "train", self.train_acc)
        with self.captured.counted(self.optimizers(), self.lr_schedulers()):
            loss, logits = self.captured(*batch)
            self._log("train", logits, batch[1], loss, self.train_acc)  # at the eager step's global_step
        return None

    def configure_callbacks(self) -> list:
        # the time budget and its clock where missing, the lr's logging, a stop where the loss diverges
        return [*budget_callbacks(self.trainer), LearningRate(), FiniteLoss()]

    def on_fit_start(self) -> None:
        if self.hparams.whiten_stem and self.trainer.ckpt_path is None:  # a resumed run has its weights
            self.whiten_stem(whitening_images(self.trainer.datamodule, self.device))
        if self.trainer.strategy.root_device.type == "cuda":
            # what stays fp32 under autocast multiplies on TF32 tensor cores (Lightning advises
            # it on such GPUs; the results differ from fp32's in the 4th digit)
            torch.set_float32_matmul_precision("high")
        if self.hparams.compile:  # a captured step takes over augmentation and the EMA's update
            self.captured = compile_training(self, self.hparams.compile, not self.automatic_optimization)

    def on_fit_end(self) -> None:
        if self.captured is not None:  # a later fit of the data module and the EMA may step eagerly
            self.captured.give_back()

    def whiten_stem(self, images: torch.Tensor) -> None:
        """airbench's whitening initialisation of the network's first convolution from `images`:
        each subclass knows its network's."""
        raise NotImplementedError

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # the format's version, and how image files become model input (the checkpoint alone reads them)
        checkpoint[compat.CHECKPOINT_KEY] = compat.FORMAT_VERSION
        if (preparation := getattr(self.trainer.datamodule, "preparation", None)) is not None:
            checkpoint["preparation"] = preparation.to_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # before Lightning loads the weights: checkpoints of older versions read as today's
        compat.checkpoint(checkpoint)

    def on_train_start(self) -> None:
        if self.captured is not None:  # a resumed run's step count is known now (read after on_fit_start)
            self.captured.start_at(self.trainer.global_step)
        # A resumed run's training loader gets its place in the epoch back (ResumableLoader).
        # Lightning gives it when it builds the loader, but configure_optimizers built it earlier
        # (estimated_stepping_batches), before the checkpoint's loop state was read, and then the
        # state is never given: github.com/Lightning-AI/pytorch-lightning/issues/20550. The
        # loader's first batch is not drawn yet: give it now (nothing left where Lightning did).
        self.trainer.fit_loop._load_combined_loader_states()

    def validation_step(self, batch, batch_idx: int) -> None:
        self._step(batch, "val", self.val_acc)

    def test_step(self, batch, batch_idx: int) -> None:
        self._step(batch, "test", self.test_acc)

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(x).softmax(dim=-1)

    def configure_optimizers(self):
        hp, captured = self.hparams, not self.automatic_optimization  # a captured step reads lr tensors
        optimizer = build_optimizer(self.model, self.optimizer_options, tensor_lr=captured)
        # Warm-up and decay span the step limit (max_epochs or max_steps) or the time budget
        # (max_time), whichever ends first; with only a time budget, max_epochs may be -1.
        total = max(self.trainer.estimated_stepping_batches, 1)
        scheduler = warmup_decay(
            optimizer, lambda step: training_progress(self.trainer, step, total), total,
            hp.warmup_fraction, hp.min_lr_fraction, hp.decay,
        )  # fmt: skip
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class ViTClassifier(Classifier):
    """Train, validate and test a ViT image classifier: the architecture is `vit` (a `ViTConfig`;
    the YAML's `model: {vit: {preset: mini, patch_size: 8}, lr: 0.003}`, the CLI's
    `--model.vit.depth 4`), the training settings are `Classifier`'s. `num_classes`,
    `image_size` and `in_channels` come from the data module through the CLI and go into `vit`.

    Fine-tuning: `pretrained` names a model to start from (`timm:NAME`, `hf:ID_OR_FOLDER` or a
    vit-export folder; `weights` its file, as `vit.load_pretrained` takes them). Its architecture
    replaces `vit`, except `vit`'s training options (dropout, drop_path, patch_dropout,
    fused_attn); the head is replaced when the data's class count differs, the positions
    resampled to the data's image size. The architecture is then recorded as `architecture` (a
    `ViTConfig` dict), so a checkpoint rebuilds the model from itself and never fetches the
    source again.

    Distillation (DeiT's hard labels, `vit.teacher`): `teacher` is a classifier checkpoint
    written by vit-train (a `CNNClassifier`'s .ckpt, read when fitting starts, never saved in this
    model's checkpoints), or `airbench`: an `AirbenchCNN` trained for `teacher_epochs` epochs
    when training starts, on the training clock (its seconds count in --trainer.max_time, so the
    ViT's schedule starts that far along; a resumed run trains it again). Needs `vit.distilled`.
    The loss is then half the class head's and half the distillation head's against the
    teacher's answers (`loss`); validation and the checkpoint's model use both heads' mean, as
    without a teacher. With `compile`, the distilled step's forward (`forward_heads`) runs eagerly.
    """

    def __init__(
        self,
        num_classes: int = 10,
        image_size: int | tuple[int, int] = 32,
        in_channels: int = 3,
        vit: ViTConfig = ViTConfig(),  # noqa: B008 (never changed: resolve() makes a copy)
        # PatchDropout's share at the end of training, linear from vit.patch_dropout over the
        # schedule (steps or time budget); None: vit.patch_dropout throughout
        patch_dropout_end: float | None = None,
        pretrained: str | None = None,  # fine-tune this model (timm:NAME, hf:ID, a vit-export folder)
        weights: str | None = None,  # the pretrained model's weights file: nothing downloaded
        architecture: dict | None = None,  # recorded by fine-tuning: a ViTConfig's fields
        teacher: str | None = None,  # distill from: a vit-train .ckpt, or "airbench" (trained first)
        teacher_epochs: int = 10,  # teacher: airbench's training, on the clock (airbench94's ~10)
        **kwargs,
    ):
        if weights is not None and pretrained is None:
            raise UsageError("weights goes with pretrained (the model to fine-tune)")
        if patch_dropout_end is not None and not 0 <= patch_dropout_end < 1:
            raise UsageError(f"patch_dropout_end={patch_dropout_end} must lie in [0, 1)")
        config = ViTConfig.from_dict(vit) if isinstance(vit, dict) else vit
        data = dict(num_classes=num_classes, image_size=image_size, in_channels=in_channels)
        config = replace(config, **data).resolve()
        training = {k: getattr(config, k) for k in ("dropout", "drop_path", "patch_dropout", "fused_attn")}
        model = None
        if pretrained is not None and architecture is None:
            model = for_finetuning(pretrained, weights, num_classes, image_size, in_channels, **training)
            architecture = model.config.to_dict()  # recorded: the source is never read again
        super().__init__(num_classes, **kwargs)  # saves the arguments
        # as plain values (checkpoints load weights_only), resolved: the model they rebuild
        self.hparams.update(vit=config.to_dict(), architecture=architecture)
        if model is None:  # a fine-tuned checkpoint's weights come with it
            model = ViT(config if architecture is None else ViTConfig.from_dict(architecture))
        self.model = model
        if teacher is not None and model.head_dist is None:
            raise UsageError(f"teacher={teacher} needs vit.distilled: true")
        require(teacher_epochs >= 1, f"teacher_epochs={teacher_epochs} must be at least 1")
        require(
            not kwargs.get("whiten_stem") or model.config.conv_stem,
            "whiten_stem needs a conv stem (vit.conv_stem)",
        )
        self.teacher: Teacher | None = None  # when fitting starts (a Teacher is no registered module)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """With a teacher, in training, DeiT's hard distillation (`vit.teacher.distillation_loss`):
        half the class head's loss, half the distillation head's against the teacher's answers."""
        if self.teacher is None or not self.training:
            return super().loss(x, y)
        return distillation_loss(self.model, self.teacher, x, y, self.hparams.label_smoothing)

    def on_fit_start(self) -> None:
        # the teacher first: a captured step (compiled in Classifier.on_fit_start, after the
        # stem's whitening) includes the teacher
        if self.hparams.teacher not in (None, "airbench"):
            self.teacher = load_teacher(self.hparams.teacher, self.hparams.num_classes, MODELS).to(
                self.device
            )
        super().on_fit_start()

    def on_train_start(self) -> None:
        super().on_train_start()
        if self.hparams.teacher == "airbench":
            # on the training clock: Lightning's Timer starts in its on_train_start, which the fit
            # loop calls before this module's (lightning/pytorch/loops/fit_loop.py, on_run_start)
            hp = self.hparams
            self.teacher = train_airbench(self.trainer, hp.num_classes, hp.in_channels, hp.teacher_epochs)

    def whiten_stem(self, images: torch.Tensor) -> None:
        """airbench's whitening initialisation (`vit.layers.whiten_`) of the stem's first
        convolution (`vit.layers.first_conv`), which then learns on."""
        if self.model.mean is not None:  # as the stem sees them
            images = (images - self.model.mean) / self.model.std
        whiten_(first_conv(self.model.stem), images)

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        start, end = self.model.config.patch_dropout, self.hparams.patch_dropout_end
        if end is not None:
            total = max(self.trainer.estimated_stepping_batches, 1)
            progress = min(training_progress(self.trainer, self.global_step, total), 1.0)
            self.model.patch_dropout = start + (end - start) * progress
            self.log("train/patch_dropout", self.model.patch_dropout, on_step=True, on_epoch=False)


class CNNClassifier(Classifier):
    """The convolutional baselines of `vit.cnn`: `arch: bag` (local features with a
    `receptive_field`, then global average pooling; or `depth` 3x3 layers, with `downsample`
    every other one of stride 2, and `mlp_head` a hidden layer after pooling), `arch: resnet`
    (covers the image) or `arch: airbench` (airbench94's network, `AirbenchCNN`: blocks of
    `width`, 4 * `width`, 4 * `width` channels, airbench's 64, 256, 256 by default; its own
    zero padding and no other option; trained here by this module's recipe, its stem learned, or
    with `whiten_stem` whitened and frozen as airbench's is)."""

    def __init__(
        self,
        num_classes: int = 10,
        image_size: int | tuple[int, int] = 32,  # linked from the data; convolutions take any size
        in_channels: int = 3,
        arch: Literal["bag", "resnet", "airbench"] = "bag",
        receptive_field: int = 7,
        width: int = 64,
        padding: Literal["circular", "zeros", "valid"] = "circular",
        depth: int | None = None,
        downsample: bool = False,
        mlp_head: bool = False,
        **kwargs,
    ):
        if kwargs.get("layer_decay") is not None:
            raise UsageError("layer_decay needs a ViT (its blocks are the layers); CNNClassifier has none")
        if kwargs.get("optimizer") == "muon":
            raise UsageError("optimizer=muon needs a ViT (Muon takes its blocks); CNNClassifier has none")
        if kwargs.get("whiten_stem") and arch != "airbench":
            raise UsageError("whiten_stem needs arch=airbench (its 2x2 first convolution)")
        super().__init__(num_classes, **kwargs)
        if arch == "bag":
            self.model = BagCNN(
                num_classes, in_channels, receptive_field, width, padding,
                depth=depth, downsample=downsample, mlp_head=mlp_head,
            )  # fmt: skip
        elif arch == "resnet":
            self.model = ResNet(
                num_classes, in_channels, widths=(width // 4, width // 2, width), padding=padding
            )
        elif arch == "airbench":
            self.model = AirbenchCNN(num_classes, in_channels, widths=(width, 4 * width, 4 * width))
        else:
            raise UsageError(f"arch must be 'bag', 'resnet' or 'airbench', got {arch!r}")

    def whiten_stem(self, images: torch.Tensor) -> None:
        """airbench's: the stem's filters whiten the 2x2 patches of `images` and stay so
        (`AirbenchCNN.whiten`); its bias learns for the first epochs only (`on_train_epoch_start`)."""
        self.model.whiten(images)

    def on_train_epoch_start(self) -> None:
        if self.hparams.whiten_stem:
            self.model.freeze_stem(self.current_epoch, AIRBENCH["whiten_bias_epochs"])


# The classifiers a checkpoint may name, by the class path LightningCLI records (either spelling);
# checkpoints without one hold a ViTClassifier (`vit.safe_load.build_model`).
MODELS: dict[str, type[Classifier]] = {
    f"{module}.{cls.__name__}": cls
    for cls in (ViTClassifier, CNNClassifier)
    for module in ("vit", "vit.classifier")
}
