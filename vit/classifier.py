"""The Lightning modules: a ViT or a CNN baseline, trained the same way."""

from __future__ import annotations

import time
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR
from torchmetrics.classification import MulticlassAccuracy

from vit.cnn import BagCNN, ResNet
from vit.errors import UsageError, require
from vit.model import PRESETS, build_vit


def adamw(
    model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.999)
) -> torch.optim.AdamW:
    """AdamW without decay on biases, norms and the parameters in `model.no_weight_decay()`."""
    skip = getattr(model, "no_weight_decay", set)()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        # biases and norm weights are 1-D (a learned attention temperature 0-D); embeddings and
        # the class token are named
        (no_decay if p.ndim < 2 or name in skip else decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=betas,
    )


class Classifier(L.LightningModule):
    """Image classification with any network: cross-entropy with label smoothing, accuracy
    metrics, AdamW without decay on biases, norms and embeddings, linear warm-up then cosine.
    `compile: true` trains through `torch.compile` (same math, fewer passes over memory).

    Subclasses build `self.model` and pass these training settings through `**kwargs`.
    """

    def __init__(
        self,
        num_classes: int = 10,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_fraction: float = 0.05,  # share of all optimizer steps spent warming up linearly
        min_lr_fraction: float = 0.01,  # cosine decays to lr * min_lr_fraction
        label_smoothing: float = 0.1,
        compile: bool = False,  # torch.compile the network for training (the first steps compile)
    ):
        super().__init__()
        require(lr > 0, f"lr={lr} must be positive")
        require(weight_decay >= 0, f"weight_decay={weight_decay} must be >= 0")
        require(all(0 <= b < 1 for b in betas), f"betas={betas} must lie in [0, 1)")
        require(0 <= warmup_fraction < 1, f"warmup_fraction={warmup_fraction} must lie in [0, 1)")
        require(0 <= min_lr_fraction <= 1, f"min_lr_fraction={min_lr_fraction} must lie in [0, 1]")
        require(0 <= label_smoothing < 1, f"label_smoothing={label_smoothing} must lie in [0, 1)")
        # Saves these arguments and the subclass's, so a checkpoint rebuilds its model.
        self.save_hyperparameters()
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def _step(self, batch, stage: str, accuracy: MulticlassAccuracy) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        # y: class indices (N,), or class probabilities (N, classes) from MixUp/CutMix, which
        # cross-entropy takes as they are and accuracy counts against their largest class
        loss = F.cross_entropy(logits, y, label_smoothing=self.hparams.label_smoothing)
        accuracy(logits, y.argmax(dim=1) if y.ndim == 2 else y)
        on_step = stage == "train"
        # epoch-level losses are averaged over all processes; accuracy syncs itself (torchmetrics)
        self.log(
            f"{stage}/loss", loss, prog_bar=True, on_step=on_step, on_epoch=not on_step, sync_dist=not on_step
        )
        self.log(f"{stage}/acc", accuracy, prog_bar=True, on_step=False, on_epoch=True)
        return loss

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train", self.train_acc)

    def setup(self, stage: str) -> None:
        # In place, so parameter names and checkpoints stay those of the eager network. From fit
        # on the network stays compiled in this process (validation, and a later test or predict
        # in the same process, too); vit-eval and vit-attention rebuild it eagerly.
        if self.hparams.compile and stage == "fit":
            self.model.compile()

    def on_fit_start(self) -> None:
        self._fit_started = time.perf_counter()

    def on_validation_epoch_end(self) -> None:
        # minutes since this fit started, beside val/acc: accuracy against wall time (every
        # process logs its own; with several, the mean)
        if self.trainer.state.fn == "fit" and not self.trainer.sanity_checking:
            self.log("time/minutes", (time.perf_counter() - self._fit_started) / 60, sync_dist=True)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # how image files become model input, so that a checkpoint alone classifies and draws them
        preparation = getattr(self.trainer.datamodule, "preparation", None)
        if preparation is not None:
            checkpoint["preparation"] = preparation.to_dict()

    def validation_step(self, batch, batch_idx: int) -> None:
        self._step(batch, "val", self.val_acc)

    def test_step(self, batch, batch_idx: int) -> None:
        self._step(batch, "test", self.test_acc)

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(x).softmax(dim=-1)

    def configure_optimizers(self):
        hp = self.hparams
        optimizer = adamw(self.model, lr=hp.lr, weight_decay=hp.weight_decay, betas=hp.betas)
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        warmup = min(max(int(total * hp.warmup_fraction), 1), total - 1) if total > 1 else 0
        cosine = CosineAnnealingLR(
            optimizer, T_max=max(total - warmup, 1), eta_min=hp.lr * hp.min_lr_fraction
        )
        if warmup:
            scheduler = SequentialLR(
                optimizer,
                [LinearLR(optimizer, start_factor=1 / (warmup + 1), total_iters=warmup), cosine],
                milestones=[warmup],
            )
        else:
            scheduler = cosine
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class ViTClassifier(Classifier):
    """Train, validate and test a ViT image classifier.

    `num_classes`, `image_size` and `in_channels` come from the data module through the CLI.
    `preset` names a size in `vit.model.PRESETS`; `dim`, `depth`, `heads` and `mlp_ratio`
    override it when given. `attn_window` restricts attention to patches at most that many
    patches away (a local-attention control; it needs `pool: mean`).
    """

    def __init__(
        self,
        num_classes: int = 10,
        image_size: int | tuple[int, int] = 32,
        in_channels: int = 3,
        preset: str = "cifar",
        patch_size: int = 4,
        dim: int | None = None,
        depth: int | None = None,
        heads: int | None = None,
        mlp_ratio: float | None = None,
        pos_embed: Literal["learned", "sincos", "periodic", "none"] = "learned",
        pool: Literal["cls", "mean"] = "cls",
        attn_window: int | None = None,
        dropout: float = 0.0,
        drop_path: float = 0.0,
        patch_dropout: float = 0.0,  # share of patch tokens dropped at random in training
        fused_attn: bool = True,
        patch_norm: bool = False,
        shifted_patches: bool = False,  # patches also see half a patch around them (SPT)
        locality_attention: bool = False,  # learned temperature, no attention to oneself (LSA)
        init: Literal["timm", "torch"] = "torch",
        # the token layout and norms of the ViTs people study (vit.model.ViT explains them)
        class_token: bool = True,
        num_registers: int = 0,
        no_embed_class: bool = False,
        fc_norm: bool = False,
        pre_norm: bool = False,
        layer_scale: float | None = None,
        qkv_bias: bool = True,
        norm_eps: float = 1e-5,
        **kwargs,
    ):
        if preset not in PRESETS:
            raise UsageError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        super().__init__(num_classes, **kwargs)
        self.model = build_vit(
            preset,
            num_classes=num_classes,
            image_size=image_size,
            patch_size=patch_size,
            in_channels=in_channels,
            dim=dim,
            depth=depth,
            heads=heads,
            mlp_ratio=mlp_ratio,
            pos_embed=pos_embed,
            pool=pool,
            attn_window=attn_window,
            dropout=dropout,
            drop_path=drop_path,
            patch_dropout=patch_dropout,
            fused_attn=fused_attn,
            patch_norm=patch_norm,
            shifted_patches=shifted_patches,
            locality_attention=locality_attention,
            init=init,
            class_token=class_token,
            num_registers=num_registers,
            no_embed_class=no_embed_class,
            fc_norm=fc_norm,
            pre_norm=pre_norm,
            layer_scale=layer_scale,
            qkv_bias=qkv_bias,
            norm_eps=norm_eps,
        )


class CNNClassifier(Classifier):
    """The convolutional baselines of `vit.cnn`: `arch: bag` (local features with a
    `receptive_field`, then global average pooling) or `arch: resnet` (covers the image)."""

    def __init__(
        self,
        num_classes: int = 10,
        image_size: int | tuple[int, int] = 32,  # linked from the data; convolutions take any size
        in_channels: int = 3,
        arch: Literal["bag", "resnet"] = "bag",
        receptive_field: int = 7,
        width: int = 64,
        padding: Literal["circular", "zeros", "valid"] = "circular",
        **kwargs,
    ):
        super().__init__(num_classes, **kwargs)
        if arch == "bag":
            self.model = BagCNN(num_classes, in_channels, receptive_field, width, padding)
        elif arch == "resnet":
            self.model = ResNet(
                num_classes, in_channels, widths=(width // 4, width // 2, width), padding=padding
            )
        else:
            raise UsageError(f"arch must be 'bag' or 'resnet', got {arch!r}")
