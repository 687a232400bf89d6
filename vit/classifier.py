"""The Lightning module: a ViT, cross-entropy with label smoothing, AdamW, warm-up + cosine."""

from __future__ import annotations

from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR
from torchmetrics.classification import MulticlassAccuracy

from vit.model import PRESETS, build_vit, require


class ViTClassifier(L.LightningModule):
    """Train, validate and test a ViT image classifier.

    `num_classes`, `image_size` and `in_channels` come from the data module through the CLI.
    `preset` names a size in `vit.model.PRESETS`; `dim`, `depth`, `heads` and `mlp_ratio`
    override it when given.
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
        pos_embed: Literal["learned", "sincos", "none"] = "learned",
        pool: Literal["cls", "mean"] = "cls",
        dropout: float = 0.0,
        drop_path: float = 0.0,
        fused_attn: bool = True,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_fraction: float = 0.05,  # share of all optimizer steps spent warming up linearly
        min_lr_fraction: float = 0.01,  # cosine decays to lr * min_lr_fraction
        label_smoothing: float = 0.1,
    ):
        super().__init__()
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        require(lr > 0, f"lr={lr} must be positive")
        require(weight_decay >= 0, f"weight_decay={weight_decay} must be >= 0")
        require(all(0 <= b < 1 for b in betas), f"betas={betas} must lie in [0, 1)")
        require(0 <= warmup_fraction < 1, f"warmup_fraction={warmup_fraction} must lie in [0, 1)")
        require(0 <= min_lr_fraction <= 1, f"min_lr_fraction={min_lr_fraction} must lie in [0, 1]")
        require(0 <= label_smoothing < 1, f"label_smoothing={label_smoothing} must lie in [0, 1)")
        self.save_hyperparameters()
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
            dropout=dropout,
            drop_path=drop_path,
            fused_attn=fused_attn,
        )
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def _step(self, batch, stage: str, accuracy: MulticlassAccuracy) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y, label_smoothing=self.hparams.label_smoothing)
        accuracy(logits, y)
        on_step = stage == "train"
        # epoch-level losses are averaged over all processes; accuracy syncs itself (torchmetrics)
        self.log(
            f"{stage}/loss", loss, prog_bar=True, on_step=on_step, on_epoch=not on_step, sync_dist=not on_step
        )
        self.log(f"{stage}/acc", accuracy, prog_bar=True, on_step=False, on_epoch=True)
        return loss

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train", self.train_acc)

    def validation_step(self, batch, batch_idx: int) -> None:
        self._step(batch, "val", self.val_acc)

    def test_step(self, batch, batch_idx: int) -> None:
        self._step(batch, "test", self.test_acc)

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(x).softmax(dim=-1)

    def configure_optimizers(self):
        hp = self.hparams
        skip = self.model.no_weight_decay()
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            # biases and norm weights are 1-D; embeddings and the class token are named
            (no_decay if p.ndim < 2 or name in skip else decay).append(p)
        optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": hp.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=hp.lr,
            betas=hp.betas,
        )
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
