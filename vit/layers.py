"""The variants of the ViT in vit/model.py, each chosen by an option of `ViTConfig`.

- position tables: `sincos_2d` (fixed, MoCo v3; `periodic` for images that wrap around),
  `resample_pos_embed` (learned ones for another patch grid, as timm's);
- attention: `window_mask` (a local-attention control), `RelativePositionBias` (BEiT, Swin);
  locality self-attention is a subclass of `Attention`, beside it in vit/model.py; the pieces of
  `Attention`'s two paths: `masked`, `Softmax` (fp32 weights a hook can record), `fused_attention`
  (the same maths in one SDPA kernel) and `explicit_is_faster` (CPU bf16 training: the explicit path wins);
- residual branches: `LayerScale` (CaiT, DINOv2), `DropPath` (stochastic depth);
- tokens from pixels: `ShiftedPatches` (Lee et al. 2021), `ConvStem` (Xiao et al. 2021),
  `AirbenchStem` (the blocks of airbench94's CNN, `AirbenchBlock`, which vit/cnn.py builds its
  network from) and `whiten_`, airbench's whitening initialisation of its first convolution
  (`ViTClassifier`'s `whiten_stem`);
- training: `drop_patches` (PatchDropout, Liu et al. 2022).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from vit.errors import UsageError, require
from vit.preparation import to_float


def masked(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Attention scores with a mask applied: a boolean mask (True = may attend) puts -inf where
    it is False, an additive one is added."""
    if mask is None:
        return scores
    return scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask


class Softmax(nn.Module):
    """The attention weights: softmax over the keys, in fp32 (CPU's bf16 kernel computes in fp32
    inside and returns bf16, without an fp32 copy). A module of its own so that a hook can record
    the weights (`vit.interpret.hooks.record_attention`), as vit-pytorch's recorder does."""

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        if scores.dtype == torch.bfloat16 and scores.device.type == "cpu":
            return scores.softmax(dim=-1)
        return scores.softmax(dim=-1, dtype=torch.float32)


def explicit_is_faster(x: torch.Tensor) -> bool:
    """On CPU in bf16 the explicit path beats SDPA's flash kernel in training ViT-sized sequences
    (its backward is slow: studies/cpu_throughput/README.md); without a backward (inference) the
    kernel wins (1.02-1.06x a forward pass of the cifar model, benchmarks/bf16_inference.py), as it
    does in fp32 and on GPU."""
    return x.dtype == torch.bfloat16 and x.device.type == "cpu" and x.requires_grad


def fused_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | torch.Tensor, mask, dropout: float
) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v in one kernel (`F.scaled_dot_product_attention`). SDPA
    takes its scale as a number: a learned one (LocalityAttention's) scales q instead."""
    if torch.is_tensor(scale):
        q, scale = q * scale.to(q.dtype), 1.0
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale)


def sincos_2d(
    grid_h: int, grid_w: int, dim: int, temperature: float = 10000.0, periodic: bool = False
) -> torch.Tensor:
    """Fixed 2-D sin-cos position embeddings, (grid_h * grid_w, dim), as in MoCo v3.

    With `periodic`, the frequencies are whole turns per grid width (1, 2, ... grid/2, repeated),
    so the table wraps around like a torus: the embedding of a patch one step past the right edge
    is that of the first column, and a relative offset means the same thing across the edge.
    """
    if dim % 4:
        raise UsageError(f"sin-cos position embeddings need dim divisible by 4, got dim={dim}")
    y, x = torch.meshgrid(torch.arange(grid_h), torch.arange(grid_w), indexing="ij")
    k = torch.arange(dim // 4)
    if periodic:
        omega_y = 2 * torch.pi * (k % max(grid_h // 2, 1) + 1) / grid_h
        omega_x = 2 * torch.pi * (k % max(grid_w // 2, 1) + 1) / grid_w
    else:
        omega_y = omega_x = 1.0 / temperature ** (k / (dim // 4 - 1 or 1))
    y = y.flatten()[:, None] * omega_y[None, :]
    x = x.flatten()[:, None] * omega_x[None, :]
    return torch.cat((x.sin(), x.cos(), y.sin(), y.cos()), dim=1)


def window_mask(grid: tuple[int, int], window: int) -> torch.Tensor:
    """(1 + N, 1 + N) boolean mask, True where attention is allowed: patches within `window`
    rows and columns of each other; the class token (index 0) only to itself."""
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    rows, cols = rows.flatten(), cols.flatten()
    near = ((rows[:, None] - rows[None, :]).abs() <= window) & (
        (cols[:, None] - cols[None, :]).abs() <= window
    )
    mask = torch.zeros(1 + len(rows), 1 + len(rows), dtype=torch.bool)
    mask[0, 0] = True
    mask[1:, 1:] = near
    return mask


class RelativePositionBias(nn.Module):
    """A learned bias on the attention scores of each pair of patches by their offset in rows and
    columns, one table of (2H - 1)(2W - 1) offsets per head, from zero (Swin; BEiT's
    `relative_position_bias_table` and `relative_position_index`): attention can prefer an offset
    wherever the two patches are, positions without the translation that absolute ones must learn.
    A class token in front takes three more entries, BEiT's: its row, its column, itself."""

    def __init__(self, grid: tuple[int, int], heads: int, class_token: bool):
        super().__init__()
        h, w = grid
        rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        rows, cols = rows.flatten(), cols.flatten()
        # offsets shifted to start at 0, row-major over the (2h - 1) x (2w - 1) table
        index = (rows[:, None] - rows + h - 1) * (2 * w - 1) + (cols[:, None] - cols + w - 1)
        size = (2 * h - 1) * (2 * w - 1)
        if class_token:
            index = F.pad(index, (1, 0, 1, 0))
            index[0, :], index[:, 0], index[0, 0] = size, size + 1, size + 2
            size += 3
        self.relative_position_bias_table = nn.Parameter(torch.zeros(size, heads))
        self.register_buffer("relative_position_index", index, persistent=False)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.relative_position_bias_table)

    def forward(self) -> torch.Tensor:
        """The bias (heads, tokens, tokens), to add to the attention scores."""
        return rearrange(self.relative_position_bias_table[self.relative_position_index], "n m h -> h n m")


def resample_pos_embed(
    pos_embed: torch.Tensor, new_grid: tuple[int, int], old_grid: tuple[int, int], num_prefix_tokens: int
) -> torch.Tensor:
    """Position embeddings (1, prefix + old_h * old_w, dim) for another patch grid: the patch part
    resampled as an image (bicubic, antialiased, as timm's `resample_abs_pos_embed`), the rows of
    the prefix tokens kept."""
    if tuple(new_grid) == tuple(old_grid):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    grid = rearrange(grid.float(), "1 (h w) d -> 1 d h w", h=old_grid[0], w=old_grid[1])
    grid = F.interpolate(grid, size=tuple(new_grid), mode="bicubic", antialias=True, align_corners=False)
    grid = rearrange(grid, "1 d h w -> 1 (h w) d").to(pos_embed.dtype)
    return torch.cat((prefix, grid), dim=1)


class LayerScale(nn.Module):
    """A learned per-channel scale of a residual branch (Touvron et al. 2021, CaiT; DINOv2)."""

    def __init__(self, dim: int, init: float):
        super().__init__()
        self.init = init
        self.gamma = nn.Parameter(torch.full((dim,), init))

    def reset_parameters(self) -> None:
        nn.init.constant_(self.gamma, self.init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class DropPath(nn.Module):
    """Stochastic depth: drop the whole residual branch for a random subset of samples."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = torch.empty(x.shape[0], *([1] * (x.ndim - 1)), device=x.device, dtype=x.dtype)
        return x * keep.bernoulli_(1.0 - self.p) / (1.0 - self.p)


class ShiftedPatches(nn.Module):
    """Shifted Patch Tokenization (Lee et al. 2021, "Vision Transformer for Small-Size Datasets"):
    the image and four copies of it moved `shift` pixels diagonally (zeros fill the gap), stacked
    as channels, so that each patch also sees a border of its neighbours' pixels."""

    def __init__(self, shift: int):
        super().__init__()
        self.shift = shift
        # (dy, dx) per copy: copy[y, x] = image[y - dy, x - dx]; the image itself first
        self.offsets = [(0, 0)] + [(dy, dx) for dy in (shift, -shift) for dx in (shift, -shift)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([F.pad(x, (dx, -dx, dy, -dy)) for dy, dx in self.offsets], dim=1)


class ConvStem(nn.Sequential):
    """A convolutional stem in front of the patch embedding (Xiao et al. 2021, "Early
    Convolutions Help Transformers See Better"): one 3x3 convolution per entry of `channels`,
    of stride 2 unless `strides` says otherwise, each followed by BatchNorm and ReLU, so the
    image reaches the patchify step prod(strides) times smaller (`ViTConfig.stem_stride`), with
    channels[-1] channels."""

    def __init__(self, in_channels: int, channels: list[int], strides: Sequence[int] | None = None):
        strides = strides or [2] * len(channels)
        layers = []
        for c_in, c_out, s in zip([in_channels, *channels], channels, strides, strict=False):
            layers += [nn.Conv2d(c_in, c_out, 3, stride=s, padding=1, bias=False), nn.BatchNorm2d(c_out)]
            layers.append(nn.ReLU(inplace=True))
        super().__init__(*layers)


def airbench_conv(c_in: int, c_out: int) -> nn.Conv2d:
    """airbench's 3x3 convolution: zero padding, no bias, its first `c_in` filters starting as the
    identity (Dirac)."""
    conv = nn.Conv2d(c_in, c_out, 3, padding="same", bias=False)
    nn.init.dirac_(conv.weight.data[:c_in])
    return conv


def airbench_norm(channels: int) -> nn.BatchNorm2d:
    """airbench's BatchNorm: statistics moving fast (its momentum 0.6 is PyTorch's 0.4), a scale
    fixed at 1: only the bias learns."""
    norm = nn.BatchNorm2d(channels, eps=1e-12, momentum=0.4)
    norm.weight.requires_grad_(False)
    return norm


class AirbenchBlock(nn.Sequential):
    """airbench's ConvGroup: conv, max-pool 2, BN, GELU, conv, BN, GELU (half the size out)."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__(
            airbench_conv(c_in, c_out), nn.MaxPool2d(2), airbench_norm(c_out), nn.GELU(),
            airbench_conv(c_out, c_out), airbench_norm(c_out), nn.GELU(),
        )  # fmt: skip


class AirbenchStem(nn.Sequential):
    """airbench94's blocks (`AirbenchBlock`) as a stem in front of the patch embedding, one per
    entry of `channels`, each halving the map: `[64, 256]` makes a 32x32 image an 8x8 map of 256
    channels, as the first two of airbench's three blocks do. airbench's own first layer, a 2x2
    convolution without padding, is left out (it would make 32 pixels 31, off the patch grid):
    `whiten_stem` whitens the first block's first 3x3 convolution, as it does `ConvStem`'s."""

    def __init__(self, in_channels: int, channels: list[int]):
        super().__init__(
            *(AirbenchBlock(a, b) for a, b in zip([in_channels, *channels], channels, strict=False))
        )


# airbench's eps (5e-4) is for images normalised per channel; pixels in [0, 1] have about 1/16 of
# that variance (CIFAR-10's standard deviation is about 0.25)
WHITEN_EPS = 3e-5


def whitening_filters(
    images: torch.Tensor, kernel_size: tuple[int, int], eps: float = WHITEN_EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """Filters (C*kh*kw, C, kh, kw) that whiten the kh x kw patches of `images` (N, C, H, W), and
    the patches' mean (C*kh*kw,), which a bias of -filters @ mean takes off: the
    eigenvectors of the patches' covariance, largest eigenvalue first, each divided by
    sqrt(eigenvalue + eps), so each filter's response has variance eigenvalue / (eigenvalue + eps)
    (about 1) and the responses are uncorrelated (airbench's `init_whiten`, which takes the second
    moment of normalised images; here the patches' mean is taken off, as images in [0, 1] are
    not centred). Accumulated in float64, a few hundred images at a time."""
    kh, kw = kernel_size
    size = images.shape[1] * kh * kw
    total = torch.zeros(size, dtype=torch.float64, device=images.device)
    products = torch.zeros(size, size, dtype=torch.float64, device=images.device)
    for chunk in images.split(256):
        patches = F.unfold(chunk.double(), (kh, kw)).transpose(1, 2).reshape(-1, size)  # (patches, c kh kw)
        total += patches.sum(0)
        products += patches.T @ patches
    count = images.shape[0] * (images.shape[2] - kh + 1) * (images.shape[3] - kw + 1)
    mean = total / count
    eigenvalues, eigenvectors = torch.linalg.eigh(products / count - mean[:, None] * mean)  # ascending
    filters = (eigenvectors.T / (eigenvalues[:, None] + eps).sqrt()).flip(0)
    return filters.reshape(size, images.shape[1], kh, kw), mean


def first_conv(stem: nn.Module) -> nn.Conv2d:
    """The first convolution of a stem (`ConvStem`'s first layer, `AirbenchStem`'s first block's)."""
    return next(m for m in stem.modules() if isinstance(m, nn.Conv2d))


@torch.no_grad()
def whiten_(conv: nn.Conv2d, images: torch.Tensor, eps: float = WHITEN_EPS) -> int:
    """Set the first filters of `conv` to `whitening_filters` of `images`, each with its negative
    (airbench's pairs: a ReLU after keeps both halves), as many pairs as its filters have room for,
    largest eigenvalue first; the filters beyond them are left as they are. Returns how many were set."""
    filters = whitening_filters(images, conv.kernel_size, eps)[0][: conv.out_channels // 2]
    conv.weight[: 2 * len(filters)] = torch.cat((filters, -filters)).to(conv.weight.dtype)
    return 2 * len(filters)


WHITEN_SAMPLE = 5000  # training images whose patches a classifier's whiten_stem measures (airbench's)


def whitening_images(datamodule, device: torch.device) -> torch.Tensor:
    """Up to WHITEN_SAMPLE training images spread over `datamodule`'s train split, float in [0, 1]
    on `device`: those whose patches `whiten_` whitens a classifier's first convolution for."""
    train = datamodule.split("train") if hasattr(datamodule, "split") else None
    images = getattr(train, "images", None)
    require(torch.is_tensor(images), "whiten_stem needs a data module whose train split is in memory")
    return to_float(images[:: max(len(images) // WHITEN_SAMPLE, 1)][:WHITEN_SAMPLE].to(device))


def drop_patches(x: torch.Tensor, num_prefix_tokens: int, rate: float) -> torch.Tensor:
    """PatchDropout (Liu et al., 2022): keep the prefix tokens and a random subset of the patch
    tokens, a different one per image, after their positions are added. Training sees fewer
    tokens (faster steps, a regulariser); evaluation sees them all."""
    prefix, patches = x[:, :num_prefix_tokens], x[:, num_prefix_tokens:]
    keep = max(1, round(patches.shape[1] * (1 - rate)))
    index = torch.rand(patches.shape[:2], device=x.device).argsort(dim=1)[:, :keep]
    patches = patches.gather(1, index[..., None].expand(-1, -1, patches.shape[2]))
    return torch.cat((prefix, patches), dim=1)
