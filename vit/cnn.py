"""Convolutional baselines for the two-circles comparison.

`BagCNN`: stacked 3x3 convolutions whose receptive field is `receptive_field` pixels square, then
global average pooling: a bag of local features (as in BagNet, Brendel & Bethge 2019). It can
only relate two circles that one receptive field covers. With `downsample`, every other 3x3
convolution has stride 2, so the field grows geometrically with depth instead of by 2 pixels.
`ResNet`: a small ResNet (He et al. 2016) whose receptive field covers the whole image.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from vit.errors import require

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


def receptive_field_of(model: nn.Module) -> int:
    """Receptive field in pixels of the last feature map, from the convolutions in order."""
    field, jump = 1, 1
    for m in model.modules():
        if isinstance(m, nn.Conv2d) and m.kernel_size[0] > 1:
            field += (m.kernel_size[0] - 1) * jump
            jump *= m.stride[0]
    return field
