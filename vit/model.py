"""A Vision Transformer written from scratch on plain PyTorch and einops.

Follows Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words" (ViT), with pre-norm blocks
(Xiong et al. 2020). Read top to bottom it is the paper: the image cut into patches, each
flattened and projected to a token; position embeddings added; a class token (and any other
prefix tokens) in front; blocks of multi-head self-attention and an MLP; the head reads the
class token (or the patches' mean). Every option is a field of `vit.config.ViTConfig`; the
variants they switch on (position tables, masks, relative position bias, LayerScale, DropPath,
shifted patches, the conv stem) are in vit/layers.py. The layout follows nanoGPT and
lucidrains' vit-pytorch: FeedForward, Attention, Block, ViT.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from einops import rearrange
from einops.layers.torch import Rearrange
from torch import nn

from vit.config import ViTConfig, pair
from vit.errors import UsageError, require
from vit.layers import (
    AirbenchStem,
    ConvStem,
    DropPath,
    LayerScale,
    RelativePositionBias,
    ShiftedPatches,
    Softmax,
    drop_patches,
    explicit_is_faster,
    fused_attention,
    masked,
    resample_pos_embed,
    sincos_2d,
    window_mask,
)


class FeedForward(nn.Module):
    def __init__(self, config: ViTConfig):
        super().__init__()
        hidden = int(config.dim * config.mlp_ratio)
        self.fc1 = nn.Linear(config.dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, config.dim)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Attention(nn.Module):
    """Multi-head self-attention: softmax(Q K^T / sqrt(d_head)) V, heads concatenated, projected.

    `fused` (ViTConfig.fused_attn) runs the same maths in one kernel,
    `F.scaled_dot_product_attention`, which keeps no weights; the explicit path passes its weights
    through `attend`, where a hook can record them. `mask` is boolean (True = may attend, as in
    SDPA) or additive, broadcast to (batch, heads, tokens, tokens).
    """

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.heads = config.heads
        self.scale = (config.dim // config.heads) ** -0.5
        self.fused = config.fused_attn
        self.dropout = config.dropout
        # Q, K and V projections in one matmul; rows ordered [q; k; v] like nn.MultiheadAttention.
        self.qkv = nn.Linear(config.dim, 3 * config.dim, bias=config.qkv_bias)
        self.attend = Softmax()
        self.attn_drop = nn.Dropout(config.dropout)
        self.proj = nn.Linear(config.dim, config.dim)
        self.proj_drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.heads)
        scale, mask = self.scale_and_mask(mask, x.shape[1])
        if not self.fused or explicit_is_faster(q):
            scores = (q @ k.transpose(-2, -1)) * scale  # (B, heads, N, N)
            weights = self.attend(masked(scores, mask)).to(v.dtype)  # softmax over the keys
            out = self.attn_drop(weights) @ v  # (B, heads, N, d_head)
        else:  # the same maths, fused
            out = fused_attention(q, k, v, scale, mask, self.dropout if self.training else 0.0)
        out = rearrange(out, "b h n d -> b n (h d)")  # heads concatenated
        return self.proj_drop(self.proj(out))

    def scale_and_mask(
        self, mask: torch.Tensor | None, tokens: int
    ) -> tuple[float | torch.Tensor, torch.Tensor]:
        return self.scale, mask  # LocalityAttention learns the one and changes the other


class LocalityAttention(Attention):
    """Locality Self-Attention (Lee et al. 2021, "Vision Transformer for Small-Size Datasets"): a
    learned temperature (`log_scale`, from 1/sqrt(d_head)) and no token attending to itself,
    unless a mask leaves it nothing else; both sharpen attention on small data."""

    def __init__(self, config: ViTConfig):
        super().__init__(config)
        self.log_scale = nn.Parameter(torch.tensor(self.scale).log())

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.log_scale.copy_(torch.tensor(self.scale).log())

    def scale_and_mask(self, mask: torch.Tensor | None, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        itself = torch.eye(tokens, dtype=torch.bool, device=self.log_scale.device)
        if mask is None:
            mask = ~itself
        elif mask.dtype == torch.bool:  # a row with no other key keeps its own (no NaN)
            others = mask & ~itself
            mask = others | (itself & ~others.any(-1, keepdim=True))
        else:
            others = mask.masked_fill(itself, float("-inf"))
            mask = torch.where(itself & others.isneginf().all(-1, keepdim=True), mask, others)
        return self.log_scale.exp(), mask


class Block(nn.Module):
    """Pre-norm transformer block: x + Attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, config: ViTConfig, drop_path: float = 0.0):
        super().__init__()
        dim, eps = config.dim, config.norm_eps
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = (LocalityAttention if config.locality_attention else Attention)(config)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = FeedForward(config)
        self.drop_path = DropPath(drop_path)
        scale = config.layer_scale
        self.ls1 = nn.Identity() if scale is None else LayerScale(dim, scale)
        self.ls2 = nn.Identity() if scale is None else LayerScale(dim, scale)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.drop_path(self.ls1(self.attn(self.norm1(x), mask=mask)))
        return x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))


class PatchEmbed(nn.Module):
    """Cut (B, C, H, W) images into patches of p x p pixels, flatten each, project it to a token:
    (B, patches, dim). `shift` stacks shifted copies first (ShiftedPatches); `norm` puts patch
    content on the scale of fixed position tables, whatever the pixels' (vit-pytorch)."""

    def __init__(self, patch: int, channels: int, dim: int, shift: int, norm: bool, bias: bool, eps: float):
        super().__init__()
        self.shift = ShiftedPatches(shift) if shift else None
        patch_dim = patch * patch * channels * (len(self.shift.offsets) if shift else 1)
        self.patchify = Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=patch, p2=patch)
        self.norm_in = nn.LayerNorm(patch_dim, eps=eps) if norm else nn.Identity()
        self.proj = nn.Linear(patch_dim, dim, bias=bias)
        self.norm_out = nn.LayerNorm(dim, eps=eps) if norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patchify(x if self.shift is None else self.shift(x))
        return self.norm_out(self.proj(self.norm_in(x)))


class ViT(nn.Module):
    """A ViT of `config` (`ViT(ViTConfig(preset="mini"))`, or the same as `ViT(preset="mini")`).
    `depth=0` is the control without attention: no blocks, the head reads the normed patches' mean."""

    # One piece by choice (about 70 lines): the layers are built in the order `forward` uses them,
    # to be read top to bottom beside the paper, as nanoGPT's GPT.__init__ is; that order is also
    # the order of the initialisation's random draws (a seeded run's weights depend on it).
    def __init__(self, config: ViTConfig | None = None, **options):
        super().__init__()
        require(config is None or not options, "give a ViTConfig or options, not both")
        self.config = c = (config or ViTConfig(**options)).resolve()
        self.image_size, self.patch_size, self.in_channels = c.image_size, c.patch_size, c.in_channels
        self.grid_size = (c.image_size[0] // c.patch_size, c.image_size[1] // c.patch_size)
        num_patches = self.grid_size[0] * self.grid_size[1]
        # prefix tokens, in this order: the class token, the distillation token, the registers
        self.num_prefix_tokens = c.num_prefix_tokens
        self.num_registers = c.num_registers
        self.pos_embed_prefix = 0 if c.no_embed_class else self.num_prefix_tokens  # rows before the patches'
        self.pool = c.pool
        # not in the state dict: the config says them
        for name, values in (("mean", c.mean), ("std", c.std)):
            table = None if values is None else torch.tensor(values, dtype=torch.float32)[:, None, None]
            self.register_buffer(name, table, persistent=False)

        # patches -> tokens; the stem's output is patchified with what stride remains of the patch
        if not c.conv_stem:
            self.stem = nn.Identity()
        elif c.conv_stem_block == "airbench":
            self.stem = AirbenchStem(c.in_channels, list(c.conv_stem))
        else:
            self.stem = ConvStem(c.in_channels, list(c.conv_stem), c.conv_stem_strides)
        token_patch = c.patch_size // c.stem_stride
        channels = c.conv_stem[-1] if c.conv_stem else c.in_channels
        shift = max(c.patch_size // 2, 1) if c.shifted_patches else 0  # the paper's: half a patch
        self.patch_embed = PatchEmbed(
            token_patch, channels, c.dim, shift, c.patch_norm, bias=not c.pre_norm, eps=c.norm_eps
        )
        # prefix tokens and position embeddings
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.dim)) if c.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, c.dim)) if c.distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, c.num_registers, c.dim)) if c.num_registers else None
        if c.pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, self.pos_embed_prefix + num_patches, c.dim))
        elif c.pos_embed in ("sincos", "periodic"):  # periodic: for images that wrap around
            table = sincos_2d(*self.grid_size, c.dim, periodic=c.pos_embed == "periodic")
            table = torch.cat((torch.zeros(self.pos_embed_prefix, c.dim), table))
            self.register_buffer("pos_embed", table[None], persistent=False)
        else:
            self.pos_embed = None
        self.rel_pos = (
            nn.ModuleList(
                RelativePositionBias(self.grid_size, c.heads, c.class_token) for _ in range(c.depth)
            )
            if c.rel_pos_bias
            else None
        )
        self.patch_dropout = c.patch_dropout
        mask = None if c.attn_window is None else window_mask(self.grid_size, c.attn_window)
        self.register_buffer("attn_mask", mask, persistent=False)
        self.drop = nn.Dropout(c.dropout)

        # the blocks, stochastic depth rising linearly to drop_path
        rates = [c.drop_path * i / max(c.depth - 1, 1) for i in range(c.depth)]
        self.blocks = nn.ModuleList(Block(c, rate) for rate in rates)
        self.norm_pre = nn.LayerNorm(c.dim, eps=c.norm_eps) if c.pre_norm else nn.Identity()
        # the final norm: of every token (fc_norm false), or of the pooled one
        self.norm = nn.Identity() if c.fc_norm else nn.LayerNorm(c.dim, eps=c.norm_eps)
        self.fc_norm = nn.LayerNorm(c.dim, eps=c.norm_eps) if c.fc_norm else nn.Identity()
        # the head; num_classes 0: none, the pooled features are the output
        self.head = nn.Linear(c.dim, c.num_classes) if c.num_classes else nn.Identity()
        self.head_dist = nn.Linear(c.dim, c.num_classes) if c.distilled else None
        if c.init == "timm":
            self.apply(self._init_weights)
        std = 0.02 if c.init == "timm" else 1.0
        for token in (self.cls_token, self.dist_token, self.reg_token):
            if token is not None:
                nn.init.trunc_normal_(token, std=std)
        if isinstance(self.pos_embed, nn.Parameter):
            nn.init.trunc_normal_(self.pos_embed, std=std)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Images (B, C, H, W) -> tokens (B, prefix + patches, dim), prefix tokens first (class,
        distillation, registers), normed unless `fc_norm` (in training with `patch_dropout`, fewer
        patches, unless a `mask` is given: masks need them all)."""
        if self.mean is not None:
            x = (x - self.mean) / self.std
        x = self.patch_embed(self.stem(x))
        tokens = (self.cls_token, self.dist_token, self.reg_token)
        prefix = [t.expand(x.shape[0], -1, -1) for t in tokens if t is not None]
        if self.pos_embed is not None and not self.pos_embed_prefix:  # positions of patches only
            x = x + self.pos_embed
        x = torch.cat((*prefix, x), dim=1)
        if self.pos_embed is not None and self.pos_embed_prefix:
            x = x + self.pos_embed
        if self.training and self.patch_dropout and mask is None:
            x = drop_patches(x, self.num_prefix_tokens, self.patch_dropout)
        x = self.norm_pre(self.drop(x))
        if self.attn_mask is not None:
            mask = self.attn_mask if mask is None else mask & self.attn_mask
        if self.rel_pos is not None and mask is not None and mask.dtype == torch.bool:
            # the bias applies where the mask lets attention through: one additive mask for all blocks
            mask = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, float("-inf"))
        for i, block in enumerate(self.blocks):
            bias = None if self.rel_pos is None else self.rel_pos[i]()
            x = block(x, mask=mask if bias is None else bias if mask is None else bias + mask)
        return self.norm(x)

    def forward_heads(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The class head's logits and the distillation head's (None without a distillation
        token): DeiT trains each against its own target (`ViTClassifier`'s `teacher`)."""
        pooled = tokens[:, 0] if self.pool == "cls" else tokens[:, self.num_prefix_tokens :].mean(1)
        logits = self.head(self.fc_norm(pooled))
        return logits, None if self.head_dist is None else self.head_dist(tokens[:, 1])

    def forward_head(self, tokens: torch.Tensor) -> torch.Tensor:
        logits, distilled = self.forward_heads(tokens)
        # DeiT at inference: the mean of its two heads
        return logits if distilled is None else (logits + distilled) / 2

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward_head(self.forward_features(x, mask=mask))

    # What training, fine-tuning and analysis ask of a ViT beyond its forward pass.

    def token_names(self) -> list[str]:
        """A name for each token position, in order: "class token", "distillation token",
        "register i", then "patch (row, column)" row by row."""
        names = ["class token"] if self.cls_token is not None else []
        names += ["distillation token"] if self.dist_token is not None else []
        names += [f"register {i}" for i in range(self.num_registers)]
        rows, columns = self.grid_size
        return names + [f"patch ({r}, {c})" for r in range(rows) for c in range(columns)]

    @property
    def patch_proj(self) -> nn.Linear:
        """The linear projection of flattened (p1 p2 c) patches to tokens."""
        return self.patch_embed.proj

    def no_weight_decay(self) -> set[str]:
        """Parameters other than biases and norms that AdamW should not decay (as timm: positions,
        prefix tokens, relative position bias tables)."""
        tables = {f"rel_pos.{i}.relative_position_bias_table" for i in range(len(self.rel_pos or ()))}
        return {"cls_token", "dist_token", "reg_token", "pos_embed"} | tables

    def layer_of(self, name: str) -> int:
        """Depth of the parameter `name`, for layer-wise learning-rate decay: 0 for the embeddings
        (patches, positions, prefix tokens, pre-norm), i + 1 for block i (and its relative position
        bias), depth + 1 for the final norms and the heads."""
        if name.startswith(("blocks.", "rel_pos.")):
            return int(name.split(".")[1]) + 1
        if name.startswith(("stem.", "patch_embed.", "norm_pre.")) or name in self.no_weight_decay():
            return 0
        return len(self.blocks) + 1

    def reset_classifier(self, num_classes: int) -> None:
        """A new head (and distillation head) of `num_classes` outputs, freshly initialised: for
        fine-tuning on other classes (timm's name). 0: no head, the pooled features out."""
        require(num_classes >= 0, f"num_classes={num_classes} must be >= 0")
        require(num_classes or self.head_dist is None, "a distilled model needs a head")
        dim = self.config.dim
        self.head = nn.Linear(dim, num_classes) if num_classes else nn.Identity()
        if self.head_dist is not None:
            self.head_dist = nn.Linear(dim, num_classes)
        self.config = replace(self.config, num_classes=num_classes)

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
        self.config = replace(self.config, image_size=(image_h, image_w))


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
