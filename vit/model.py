"""A Vision Transformer written from scratch on plain PyTorch and einops.

Follows Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words" (ViT), with pre-norm blocks
(Xiong et al. 2020), optional fixed 2-D sin-cos position embeddings (Chen et al. 2021, MoCo v3)
and stochastic depth (Huang et al. 2016). The layout of the code follows nanoGPT and
lucidrains' vit-pytorch: helpers, FeedForward, Attention, Block, ViT.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from einops.layers.torch import Rearrange
from torch import nn

from vit.errors import UsageError, require

# One dict of sizes. "micro" keeps unit tests fast, "mini" is the two-circles demo,
# "cifar" is a width-192 depth-6 model for 32x32 images, the rest are the ViT paper's sizes.
PRESETS: dict[str, dict] = {
    "micro": dict(dim=32, depth=2, heads=2, mlp_ratio=2.0),
    "mini": dict(dim=64, depth=4, heads=4, mlp_ratio=2.0),
    "cifar": dict(dim=192, depth=6, heads=3, mlp_ratio=4.0),
    "ti": dict(dim=192, depth=12, heads=3, mlp_ratio=4.0),
    "s": dict(dim=384, depth=12, heads=6, mlp_ratio=4.0),
    "b": dict(dim=768, depth=12, heads=12, mlp_ratio=4.0),
}


def pair(x: int | tuple[int, int]) -> tuple[int, int]:
    return (x, x) if isinstance(x, int) else (int(x[0]), int(x[1]))


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
        self.gamma = nn.Parameter(torch.full((dim,), init))

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
    image reaches the patchify step prod(strides) times smaller, with channels[-1] channels."""

    def __init__(self, in_channels: int, channels: list[int], strides: Sequence[int] | None = None):
        strides = strides or [2] * len(channels)
        layers = []
        for c_in, c_out, s in zip([in_channels, *channels], channels, strides, strict=False):
            layers += [nn.Conv2d(c_in, c_out, 3, stride=s, padding=1, bias=False), nn.BatchNorm2d(c_out)]
            layers.append(nn.ReLU(inplace=True))
        super().__init__(*layers)
        self.stride = math.prod(strides)


class FeedForward(nn.Sequential):
    def __init__(self, dim: int, hidden_dim: int, dropout: float = 0.0):
        super().__init__(
            nn.Linear(dim, hidden_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden_dim, dim),
            nn.Dropout(dropout),
        )


class Attention(nn.Module):
    """Multi-head self-attention: softmax(Q K^T / sqrt(d_head)) V, heads concatenated, projected.

    `fused=True` runs `F.scaled_dot_product_attention` (fast, no weights), except in bf16 on CPU,
    where the explicit computation below is faster; `fused=False` always runs the explicit one.
    `forward(..., return_weights=True)` takes the explicit path for that call only and returns
    the weights (batch, heads, tokens, tokens).

    `mask` is boolean (True = may attend, as in SDPA) or additive (added to the scores), and
    broadcasts to (batch, heads, tokens, tokens).

    `locality=True` (Locality Self-Attention, Lee et al. 2021): the scale is a learned temperature
    (`log_scale`, starting at 1/sqrt(d_head); `scale` keeps the fixed value) and no token attends
    to itself, unless a mask leaves it nothing else.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        dropout: float = 0.0,
        fused: bool = True,
        locality: bool = False,
        qkv_bias: bool = True,
    ):
        super().__init__()
        if dim % heads:
            raise UsageError(f"dim={dim} is not divisible by heads={heads}")
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        # Locality Self-Attention (Lee et al. 2021): a learned temperature (starting at the fixed
        # scale) and no attention of a token to itself, which sharpens attention on small data
        self.locality = locality
        self.log_scale = nn.Parameter(torch.tensor(self.scale).log()) if locality else None
        self.fused = fused
        self.dropout = dropout
        # Q, K and V projections in one matmul; rows ordered [q; k; v] like nn.MultiheadAttention.
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.attn_drop = nn.Dropout(dropout)
        self.proj_drop = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, return_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        q, k, v = rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.heads)
        scale = self.scale
        if self.locality:
            scale = self.log_scale.exp()
            itself = torch.eye(q.shape[-2], dtype=torch.bool, device=q.device)
            if mask is None:
                mask = ~itself
            elif mask.dtype == torch.bool:  # a row with no other key keeps its own (no NaN)
                others = mask & ~itself
                mask = others | (itself & ~others.any(-1, keepdim=True))
            else:
                others = mask.masked_fill(itself, float("-inf"))
                mask = torch.where(itself & others.isneginf().all(-1, keepdim=True), mask, others)
        weights = None
        # On CPU in bf16 the explicit path is faster than SDPA's flash kernel for ViT-sized
        # sequences: 1.8x in training (its backward is slow), about 1.1x in inference
        # (benchmarks/README.md); in fp32 and on GPU SDPA is as fast or faster.
        cpu_bf16 = q.dtype == torch.bfloat16 and q.device.type == "cpu"
        fused = self.fused and not return_weights
        if fused and not cpu_bf16:
            p = self.dropout if self.training else 0.0
            if self.locality:  # SDPA takes its scale as a number: a learned one scales q instead
                q, scale = q * scale.to(q.dtype), 1.0
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=scale)
        else:
            scores = (q @ k.transpose(-2, -1)) * scale  # (B, heads, N, N)
            if mask is not None:
                if mask.dtype == torch.bool:
                    scores = scores.masked_fill(~mask, float("-inf"))
                else:
                    scores = scores + mask
            # The softmax is computed in fp32 and rounded once to the input's dtype. CPU's bf16
            # kernel does that inside, without an fp32 copy (faster: benchmarks/README.md); its
            # backward reads the rounded weights: gradients differ from an fp32 softmax's by
            # bf16 rounding.
            if cpu_bf16:
                weights = scores.softmax(dim=-1)
            else:
                weights = scores.softmax(dim=-1, dtype=torch.float32).to(v.dtype)
            out = self.attn_drop(weights) @ v
        out = rearrange(out, "b h n d -> b n (h d)")
        return self.proj_drop(self.proj(out)), None if fused else weights


class Block(nn.Module):
    """Pre-norm transformer block: x + Attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(
        self,
        dim: int,
        heads: int,
        mlp_ratio: float,
        dropout: float = 0.0,
        drop_path: float = 0.0,
        fused_attn: bool = True,
        locality: bool = False,
        norm_eps: float = 1e-5,
        qkv_bias: bool = True,
        layer_scale: float | None = None,
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, heads, dropout, fused_attn, locality, qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = FeedForward(dim, int(dim * mlp_ratio), dropout=dropout)
        self.drop_path = DropPath(drop_path)
        self.ls1 = nn.Identity() if layer_scale is None else LayerScale(dim, layer_scale)
        self.ls2 = nn.Identity() if layer_scale is None else LayerScale(dim, layer_scale)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, return_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        y, weights = self.attn(self.norm1(x), mask=mask, return_weights=return_weights)
        x = x + self.drop_path(self.ls1(y))
        x = x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))
        return x, weights


class ViT(nn.Module):
    def __init__(
        self,
        num_classes: int,
        image_size: int | tuple[int, int] = 32,
        patch_size: int = 4,
        in_channels: int = 3,
        dim: int = 192,
        depth: int = 6,
        heads: int = 3,
        mlp_ratio: float = 4.0,
        pos_embed: Literal["learned", "sincos", "periodic", "none"] = "learned",
        pool: Literal["cls", "mean"] = "cls",
        attn_window: int | None = None,  # patches attend only within this Chebyshev distance
        rel_pos_bias: bool = False,  # a learned bias per head and patch offset (RelativePositionBias)
        dropout: float = 0.0,
        drop_path: float = 0.0,  # stochastic-depth rate of the last block, linear from 0
        patch_dropout: float = 0.0,  # share of patch tokens dropped at random in training
        fused_attn: bool = True,
        patch_norm: bool = False,  # LayerNorm before and after the patch projection (vit-pytorch)
        shifted_patches: bool = False,  # Shifted Patch Tokenization: patches see their neighbours
        # channels of the 3x3 stride-2 convolutions before the patch embedding (ConvStem); the
        # patch grid stays the patch size's: the patch embedding takes the rest of the stride
        conv_stem: tuple[int, ...] | None = None,
        conv_stem_strides: tuple[int, ...] | None = None,  # one per conv_stem entry, 1 or 2; default 2s
        locality_attention: bool = False,  # learned temperature, no attention to oneself
        init: Literal["timm", "torch"] = "torch",
        norm_eps: float = 1e-5,  # LayerNorm's; timm's ViTs use 1e-6
        # per-channel mean and std the model subtracts and divides by, for weights trained on
        # normalised images (timm's, Hugging Face's); images still come in [0, 1]. None: none
        mean: tuple[float, ...] | None = None,
        std: tuple[float, ...] | None = None,
        # the token layout and norms of the ViTs people study (timm's names in brackets)
        class_token: bool = True,
        num_registers: int = 0,  # learned tokens that only take part in attention (Darcet et al. 2024)
        distilled: bool = False,  # DeiT's distillation token and its head; inference averages both
        no_embed_class: bool = False,  # position embeddings on the patches only [no_embed_class]
        fc_norm: bool = False,  # the final norm after pooling instead of before [fc_norm]
        pre_norm: bool = False,  # a norm before the blocks, a bias-free patch projection [pre_norm]
        layer_scale: float | None = None,  # LayerScale on both branches, from this value [init_values]
        qkv_bias: bool = True,
    ):
        super().__init__()
        # the arguments, as JSON-ready values: what vit.export writes beside the weights
        self.config = {
            name: list(value) if isinstance(value, tuple) else value
            for name, value in locals().items()
            if name not in ("self", "__class__")
        }
        image_h, image_w = pair(image_size)
        for name, value in (("dim", dim), ("depth", depth), ("heads", heads), ("patch_size", patch_size)):
            require(value >= 1, f"{name}={value} must be at least 1")
        require(0 <= dropout < 1, f"dropout={dropout} must lie in [0, 1)")
        require(0 <= drop_path < 1, f"drop_path={drop_path} must lie in [0, 1)")
        require(0 <= patch_dropout < 1, f"patch_dropout={patch_dropout} must lie in [0, 1)")
        if image_h % patch_size or image_w % patch_size:
            raise UsageError(f"image size {image_h}x{image_w} is not divisible by patch size {patch_size}")
        if init not in ("timm", "torch"):
            raise UsageError(f"init must be 'timm' or 'torch', got {init!r}")
        if pool not in ("cls", "mean"):
            raise UsageError(f"pool must be 'cls' or 'mean', got {pool!r}")
        require(class_token or pool == "mean", "a model without a class token needs pool='mean'")
        require(class_token or not distilled, "a distillation token goes with a class token")
        require(num_registers >= 0, f"num_registers={num_registers} must be >= 0")
        require(not (distilled and fc_norm), "distilled and fc_norm do not combine")
        require(
            num_classes >= 0 and (num_classes or not distilled), f"num_classes={num_classes} must be >= 1"
        )
        if pos_embed not in ("learned", "sincos", "periodic", "none"):
            raise UsageError(
                f"pos_embed must be 'learned', 'sincos', 'periodic' or 'none', got {pos_embed!r}"
            )
        self.image_size = (image_h, image_w)
        self.patch_size = patch_size
        self.grid_size = (image_h // patch_size, image_w // patch_size)
        # prefix tokens, in this order: the class token, the distillation token, the registers
        self.num_prefix_tokens = int(class_token) + int(distilled) + num_registers
        self.num_registers = num_registers
        self.pos_embed_prefix = 0 if no_embed_class else self.num_prefix_tokens  # rows before the patches'
        self.pool = pool
        num_patches = self.grid_size[0] * self.grid_size[1]

        self.in_channels = in_channels
        require((mean is None) == (std is None), "mean and std go together")
        if mean is not None:
            require(len(mean) == len(std) == in_channels, f"mean and std need {in_channels} values each")
            require(all(s > 0 for s in std), f"std={std} must be positive")
        # not in the state dict, so checkpoints written before this option still load
        for name, values in (("mean", mean), ("std", std)):
            table = None if values is None else torch.tensor(values, dtype=torch.float32)[:, None, None]
            self.register_buffer(name, table, persistent=False)
        # the stem's output is patchified with what stride remains of the patch size
        if conv_stem_strides is not None:
            require(
                conv_stem is not None and len(conv_stem_strides) == len(conv_stem),
                f"conv_stem_strides={list(conv_stem_strides)} needs one stride per conv_stem entry",
            )
            require(all(s in (1, 2) for s in conv_stem_strides), "conv_stem_strides must be 1s and 2s")
        if conv_stem:
            require(all(c >= 1 for c in conv_stem), f"conv_stem={list(conv_stem)} needs positive channels")
            self.stem = ConvStem(in_channels, list(conv_stem), conv_stem_strides)
            require(
                patch_size % self.stem.stride == 0,
                f"patch_size={patch_size} is not divisible by the stem's {self.stem.stride}",
            )
            require(not shifted_patches, "conv_stem and shifted_patches do not combine")
        else:
            self.stem = nn.Identity()
        stride = getattr(self.stem, "stride", 1)
        token_patch, token_channels = patch_size // stride, conv_stem[-1] if conv_stem else in_channels
        # the paper's shift: half a patch
        shift = [ShiftedPatches(max(patch_size // 2, 1))] if shifted_patches else []
        copies = len(shift[0].offsets) if shift else 1  # the image, and its shifted copies
        patch_dim = token_patch * token_patch * token_channels * copies
        proj = nn.Linear(patch_dim, dim, bias=not pre_norm)
        # patch_norm puts patch content on the scale of fixed position tables, whatever the pixels'
        embed = (
            [nn.LayerNorm(patch_dim, eps=norm_eps), proj, nn.LayerNorm(dim, eps=norm_eps)]
            if patch_norm
            else [proj]
        )
        patchify = Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=token_patch, p2=token_patch)
        self.to_patch_embedding = nn.Sequential(*shift, patchify, *embed)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, dim)) if distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, num_registers, dim)) if num_registers else None
        if pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, self.pos_embed_prefix + num_patches, dim))
        elif pos_embed in ("sincos", "periodic"):  # periodic: for images that wrap around
            table = sincos_2d(*self.grid_size, dim, periodic=pos_embed == "periodic")
            table = torch.cat((torch.zeros(self.pos_embed_prefix, dim), table))
            self.register_buffer("pos_embed", table[None], persistent=False)
        else:
            self.pos_embed = None
        if attn_window is not None:
            # The class token would carry global information, so it is cut off: a local model.
            require(pool == "mean", "attn_window needs pool='mean' (the class token is cut off)")
            require(attn_window >= 0, f"attn_window={attn_window} must be >= 0")
            require(patch_dropout == 0, "attn_window needs every patch (patch_dropout 0)")
            require(not locality_attention, "attn_window and locality_attention do not combine")
            require(self.num_prefix_tokens == 1, "attn_window needs the class token as the only prefix token")
        if rel_pos_bias:
            require(attn_window is None, "rel_pos_bias and attn_window do not combine")
            require(patch_dropout == 0, "rel_pos_bias needs every patch (patch_dropout 0)")
            require(
                self.num_prefix_tokens == int(class_token),
                "rel_pos_bias takes a class token at most (no distillation token, no registers)",
            )
        self.rel_pos = (
            nn.ModuleList(RelativePositionBias(self.grid_size, heads, class_token) for _ in range(depth))
            if rel_pos_bias
            else None
        )
        self.patch_dropout = patch_dropout
        mask = None if attn_window is None else window_mask(self.grid_size, attn_window)
        self.register_buffer("attn_mask", mask, persistent=False)
        self.drop = nn.Dropout(dropout)
        rates = [drop_path * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.ModuleList(
            Block(
                dim, heads, mlp_ratio, dropout, rate, fused_attn, locality_attention, norm_eps, qkv_bias,
                layer_scale,
            )
            for rate in rates
        )  # fmt: skip
        self.norm_pre = nn.LayerNorm(dim, eps=norm_eps) if pre_norm else nn.Identity()
        # the final norm: of every token (fc_norm false), or of the pooled one
        self.norm = nn.Identity() if fc_norm else nn.LayerNorm(dim, eps=norm_eps)
        self.fc_norm = nn.LayerNorm(dim, eps=norm_eps) if fc_norm else nn.Identity()
        # num_classes 0: no head, the pooled features are the output (DINO's, DINOv2's models)
        self.head = nn.Linear(dim, num_classes) if num_classes else nn.Identity()
        self.head_dist = nn.Linear(dim, num_classes) if distilled else None
        # "timm": linear weights, class token and learned positions ~ N(0, 0.02) (timm, ViT paper);
        # "torch": PyTorch's default linear init and unit-scale class token and positions
        # (vit-pytorch), which learns faster from scratch on small data in our measurements
        if init == "timm":
            self.apply(self._init_weights)
        std = 0.02 if init == "timm" else 1.0
        for token in (self.cls_token, self.dist_token, self.reg_token):
            if token is not None:
                nn.init.trunc_normal_(token, std=std)
        if isinstance(self.pos_embed, nn.Parameter):
            nn.init.trunc_normal_(self.pos_embed, std=std)

    @property
    def patch_proj(self) -> nn.Linear:
        """The linear projection of flattened (p1 p2 c) patches to tokens."""
        return next(m for m in self.to_patch_embedding if isinstance(m, nn.Linear))

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)

    def no_weight_decay(self) -> set[str]:
        """Parameters other than biases and norms that AdamW should not decay (as timm: positions,
        prefix tokens, relative position bias tables)."""
        tables = {f"rel_pos.{i}.relative_position_bias_table" for i in range(len(self.rel_pos or ()))}
        return {"cls_token", "dist_token", "reg_token", "pos_embed"} | tables

    def forward_features(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Images (B, C, H, W) -> tokens (B, prefix + patches, dim), prefix tokens first (class,
        distillation, registers), normed unless `fc_norm` (in training with `patch_dropout`, fewer
        patches, unless a `mask` is given: masks need them all).

        With `return_attention=True` every block runs the explicit attention path for this call
        and the per-block weights (B, heads, tokens, tokens) are returned too.
        """
        if self.mean is not None:
            x = (x - self.mean) / self.std
        x = self.to_patch_embedding(self.stem(x))
        tokens = (self.cls_token, self.dist_token, self.reg_token)
        prefix = [t.expand(x.shape[0], -1, -1) for t in tokens if t is not None]
        if self.pos_embed is not None and not self.pos_embed_prefix:  # positions of patches only
            x = x + self.pos_embed
        x = torch.cat((*prefix, x), dim=1)
        if self.pos_embed is not None and self.pos_embed_prefix:
            x = x + self.pos_embed
        if self.training and self.patch_dropout and mask is None:
            x = self.drop_patches(x)
        x = self.norm_pre(self.drop(x))
        if self.attn_mask is not None:
            mask = self.attn_mask if mask is None else mask & self.attn_mask
        if self.rel_pos is not None and mask is not None and mask.dtype == torch.bool:
            # the bias applies where the mask lets attention through: one additive mask for all blocks
            mask = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, float("-inf"))
        attention = []
        for i, block in enumerate(self.blocks):
            block_mask = mask
            if self.rel_pos is not None:
                block_mask = self.rel_pos[i]() if mask is None else self.rel_pos[i]() + mask
            x, weights = block(x, mask=block_mask, return_weights=return_attention)
            attention.append(weights)
        x = self.norm(x)
        return (x, attention) if return_attention else x

    def drop_patches(self, x: torch.Tensor) -> torch.Tensor:
        """PatchDropout (Liu et al., 2022): keep the class token and a random subset of the patch
        tokens, a different one per image, after their positions are added. Training sees fewer
        tokens (faster steps, a regulariser); evaluation sees them all."""
        prefix, patches = x[:, : self.num_prefix_tokens], x[:, self.num_prefix_tokens :]
        keep = max(1, round(patches.shape[1] * (1 - self.patch_dropout)))
        index = torch.rand(patches.shape[:2], device=x.device).argsort(dim=1)[:, :keep]
        patches = patches.gather(1, index[..., None].expand(-1, -1, patches.shape[2]))
        return torch.cat((prefix, patches), dim=1)

    def forward_head(self, tokens: torch.Tensor) -> torch.Tensor:
        pooled = tokens[:, 0] if self.pool == "cls" else tokens[:, self.num_prefix_tokens :].mean(1)
        logits = self.head(self.fc_norm(pooled))
        if self.head_dist is not None:  # DeiT at inference: the mean of its two heads
            logits = (logits + self.head_dist(tokens[:, 1])) / 2
        return logits

    def reset_classifier(self, num_classes: int) -> None:
        """A new head (and distillation head) of `num_classes` outputs, freshly initialised: for
        fine-tuning on other classes (timm's name). 0: no head, the pooled features out."""
        require(num_classes >= 0, f"num_classes={num_classes} must be >= 0")
        require(num_classes or self.head_dist is None, "a distilled model needs a head")
        dim = self.config["dim"]
        self.head = nn.Linear(dim, num_classes) if num_classes else nn.Identity()
        if self.head_dist is not None:
            self.head_dist = nn.Linear(dim, num_classes)
        self.config["num_classes"] = num_classes

    def layer_of(self, name: str) -> int:
        """Depth of the parameter `name`, for layer-wise learning-rate decay: 0 for the embeddings
        (patches, positions, prefix tokens, pre-norm), i + 1 for block i (and its relative position
        bias), depth + 1 for the final norms and the heads."""
        if name.startswith(("blocks.", "rel_pos.")):
            return int(name.split(".")[1]) + 1
        if name.startswith(("stem.", "to_patch_embedding.", "norm_pre.")) or name in self.no_weight_decay():
            return 0
        return len(self.blocks) + 1

    def set_image_size(self, image_size: int | tuple[int, int]) -> None:
        """Take images of another size (the patch size dividing it): learned position embeddings
        are resampled (`resample_pos_embed`); fixed tables (sincos, periodic) are refused."""
        image_h, image_w = pair(image_size)
        p = self.patch_size
        require(
            image_h % p == 0 and image_w % p == 0, f"image size {image_h}x{image_w} is not divisible by {p}"
        )
        require(self.attn_mask is None, "a model with attn_window keeps its image size")
        require(self.rel_pos is None, "a model with rel_pos_bias keeps its image size")
        old_grid, grid = self.grid_size, (image_h // p, image_w // p)
        if isinstance(self.pos_embed, nn.Parameter):
            table = resample_pos_embed(self.pos_embed.data, grid, old_grid, self.pos_embed_prefix)
            self.pos_embed = nn.Parameter(table)
        elif self.pos_embed is not None:
            raise UsageError("only learned position embeddings are resampled")
        self.image_size, self.grid_size = (image_h, image_w), grid
        self.config["image_size"] = [image_h, image_w]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward_head(self.forward_features(x, mask=mask))


def build_vit(preset: str, **overrides) -> ViT:
    """A ViT of a named size; keyword arguments that are not None override the preset."""
    if preset not in PRESETS:
        raise UsageError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    kwargs = PRESETS[preset] | {k: v for k, v in overrides.items() if v is not None}
    return ViT(**kwargs)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
