"""Convolutional baselines for the two-circles comparison.

`BagCNN`: stacked 3x3 convolutions whose receptive field is `receptive_field` pixels square, then
global average pooling: a bag of local features (as in BagNet, Brendel & Bethge 2019). It can
only relate two circles that one receptive field covers. With `downsample`, every other 3x3
convolution has stride 2, so the field grows geometrically with depth instead of by 2 pixels.
`ResNet`: a small ResNet (He et al. 2016) whose receptive field covers the whole image.
`AirbenchCNN`: the network of Keller Jordan's airbench94, a fast CIFAR-10 CNN, here a teacher for
the ViT's distillation token (`vit.teacher`).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from vit.errors import require
from vit.layers import AirbenchBlock, whitening_filters

# "circular" wraps like the wrap-around canvas; "zeros" lets a unit see the image border (a
# position cue); "valid" drops the border, so no unit sees it.
PADDING = {
    "circular": dict(padding=1, padding_mode="circular"),
    "zeros": dict(padding=1, padding_mode="zeros"),
    "valid": dict(padding=0),
}


def conv_bn(c_in: int, c_out: int, padding: str, stride: int = 1, relu: bool = True) -> nn.Sequential:
    layers = [nn.Conv2d(c_in, c_out, 3, stride, bias=False, **PADDING[padding]), nn.BatchNorm2d(c_out)]
    return nn.Sequential(*layers, nn.ReLU(inplace=True)) if relu else nn.Sequential(*layers)


class BagCNN(nn.Module):
    def __init__(
        self,
        num_classes: int,
        in_channels: int = 1,
        receptive_field: int = 7,
        width: int = 64,
        padding: Literal["circular", "zeros", "valid"] = "circular",
        pointwise: int = 2,  # 1x1 layers after the 3x3 ones: capacity without a wider field
        depth: int | None = None,  # 3x3 layers; by default (receptive_field - 1) / 2
        downsample: bool = False,  # stride 2 in the 1st, 3rd, 5th... 3x3 layer
        mlp_head: bool = False,  # a hidden layer after pooling, as a transformer block has an MLP
    ):
        super().__init__()
        require(
            receptive_field >= 3 and receptive_field % 2 == 1,
            f"receptive_field={receptive_field} must be odd, >= 3",
        )
        require(padding in PADDING, f"padding must be one of {', '.join(PADDING)}, got {padding!r}")
        require(depth is None or depth >= 1, f"depth={depth} must be at least 1")
        if depth is None:
            depth = (receptive_field - 1) // 2  # each 3x3 convolution widens the field by 2 pixels
        layers = [
            conv_bn(
                in_channels if i == 0 else width, width, padding, stride=2 if downsample and i % 2 == 0 else 1
            )
            for i in range(depth)
        ]
        for _ in range(pointwise):
            layers += [nn.Conv2d(width, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.receptive_field = receptive_field_of(self.features)
        self.head = nn.Linear(width, num_classes)
        if mlp_head:
            self.head = nn.Sequential(nn.Linear(width, width), nn.ReLU(inplace=True), self.head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))  # global average pooling


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, padding: str):
        super().__init__()
        self.body = nn.Sequential(
            conv_bn(c_in, c_out, padding, stride), conv_bn(c_out, c_out, padding, relu=False)
        )
        self.shortcut = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(
        self,
        num_classes: int,
        in_channels: int = 1,
        widths: tuple[int, ...] = (16, 32, 64),
        blocks: int = 2,
        padding: Literal["circular", "zeros"] = "circular",
    ):
        super().__init__()
        require(padding in ("circular", "zeros"), f"a ResNet pads 'circular' or 'zeros', not {padding!r}")
        layers = [conv_bn(in_channels, widths[0], padding)]
        c_in = widths[0]
        for stage, width in enumerate(widths):
            for block in range(blocks):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(BasicBlock(c_in, width, stride, padding))
                c_in = width
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class AirbenchCNN(nn.Module):
    """Keller Jordan's airbench94 network (github.com/KellerJordan/cifar10-airbench,
    legacy/airbench94.py, `make_net`; airbench/lib_airbench94.py `make_net94`): a 2x2 convolution
    without padding (24 channels for RGB: each of the 12 directions of a 2x2x3 patch and its
    negative) then GELU, three `AirbenchBlock`s of `widths` (airbench's 64, 256, 256), a global
    max-pool and a linear head without bias whose logits are scaled by 1/9. 32x32 images become
    maps of 31, 15, 7 and 3 pixels.

    airbench sets the stem from the data and freezes it (`whiten`); until `whiten` is called the
    stem is an ordinary convolution that learns. Left out here: airbench's fp16 weights (the
    trainer's precision decides), its Lookahead and its test-time augmentation."""

    def __init__(self, num_classes: int, in_channels: int = 3, widths: tuple[int, int, int] = (64, 256, 256)):
        super().__init__()
        self.stem = nn.Conv2d(in_channels, 2 * in_channels * 2 * 2, kernel_size=2, bias=True)
        c_in = (self.stem.out_channels, *widths[:-1])
        self.blocks = nn.Sequential(*(AirbenchBlock(a, b) for a, b in zip(c_in, widths, strict=True)))
        self.head = nn.Linear(widths[-1], num_classes, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(F.gelu(self.stem(x)))
        return self.head(x.amax(dim=(2, 3))) / 9  # global max-pool; airbench's scaling_factor 1/9

    @torch.no_grad()
    def whiten(self, images: torch.Tensor, eps: float = 5e-4) -> None:
        """Set the stem from `images` (float (N, C, H, W), training images) and freeze its weights,
        as airbench's `init_whitening_conv` does: the filters are the eigenvectors of the 2x2
        patches' covariance, each divided by sqrt(eigenvalue + eps), and their negatives. airbench's
        images are normalised; these are in [0, 1], so the patches are centred first and the bias
        subtracts the mean patch (airbench trains the bias for 3 epochs; `vit.teacher` does too)."""
        filters, mean = whitening_filters(images, self.stem.kernel_size, eps)  # largest first
        weight = torch.cat((filters, -filters)).to(self.stem.weight.dtype)
        self.stem.weight.copy_(weight)
        self.stem.bias.copy_(-weight.flatten(1) @ mean.to(weight.dtype))
        self.stem.weight.requires_grad_(False)

    def freeze_stem(self, epoch: int, bias_epochs: int) -> None:
        """The whitened stem as airbench trains it in `epoch`: its filters frozen, its bias learning
        in the first `bias_epochs` epochs only. Set every epoch: a checkpoint does not keep
        requires_grad, so a resumed run gets it back here."""
        self.stem.weight.requires_grad_(False)
        self.stem.bias.requires_grad_(epoch < bias_epochs)


def receptive_field_of(model: nn.Module) -> int:
    """Receptive field in pixels of the last feature map, from the convolutions in order."""
    field, jump = 1, 1
    for m in model.modules():
        if isinstance(m, nn.Conv2d) and m.kernel_size[0] > 1:
            field += (m.kernel_size[0] - 1) * jump
            jump *= m.stride[0]
    return field
