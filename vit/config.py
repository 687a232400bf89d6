"""`ViTConfig`: every option of the ViT, declared once (nanoGPT's `GPTConfig`).

`ViT(config)` builds the model, `ViTClassifier(vit=config)` trains it (the YAML's `model.vit`,
the CLI's `--model.vit.depth 4`), fine-tuning records it and `vit-export` writes it into
`config.json`. `resolve()` fills the preset's sizes and checks every value, in one place.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Literal

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


@dataclass
class ViTConfig:
    """Every option of `vit.model.ViT`, in three groups: the ViT of the paper, the variants for
    small data and for controls, and what other libraries' ViTs need to be loaded as this one."""

    # ---- The ViT of the paper (Dosovitskiy et al. 2021) ----
    # the data: vit-train links these from the data module
    num_classes: int = 10  # 0: no head, the pooled features are the output (DINO's models)
    image_size: int | tuple[int, int] = 32
    in_channels: int = 3
    # the size: a preset, each of its values overridden when given
    preset: str = "cifar"  # a key of PRESETS
    patch_size: int = 4
    dim: int | None = None
    depth: int | None = None  # 0: no blocks, the control without attention (_check_without_blocks)
    heads: int | None = None
    mlp_ratio: float | None = None
    # positions, the class token and what the head reads
    pos_embed: Literal["learned", "sincos", "periodic", "none"] = "learned"  # periodic: wraps around
    class_token: bool = True
    pool: Literal["cls", "mean"] = "cls"  # what the head reads: the class token, or the patches' mean
    # "timm": N(0, 0.02) weights, tokens and positions; "torch": PyTorch's default linear init and
    # unit-scale tokens (vit-pytorch), which learns faster from scratch on small data here
    init: Literal["timm", "torch"] = "torch"
    # training
    dropout: float = 0.0
    drop_path: float = 0.0  # stochastic-depth rate of the last block, linear from 0
    fused_attn: bool = True  # F.scaled_dot_product_attention; False: the explicit softmax

    # ---- Variants for small data and for controls (vit/layers.py) ----
    patch_norm: bool = False  # LayerNorm before and after the patch projection (vit-pytorch)
    shifted_patches: bool = False  # Shifted Patch Tokenization: patches see their neighbours
    # channels of 3x3 convolutions (BatchNorm, ReLU) before the patch embedding (ConvStem); the
    # patch grid stays the patch size's: the patch embedding takes the rest of the stride
    conv_stem: list[int] | None = None
    conv_stem_strides: list[int] | None = None  # one per conv_stem entry, 1 or 2; default 2s
    # "airbench": each conv_stem entry is one of airbench94's blocks instead (AirbenchStem: two 3x3
    # convolutions, a max-pool of 2 between them, BatchNorm, GELU), each halving the map (its
    # conv_stem_strides, if given, 2s)
    conv_stem_block: Literal["conv", "airbench"] = "conv"
    locality_attention: bool = False  # learned temperature, no attention to oneself (LSA)
    rel_pos_bias: bool = False  # a learned bias per head and patch offset (RelativePositionBias)
    attn_window: int | None = None  # patches attend only within this Chebyshev distance (a control)
    patch_dropout: float = 0.0  # share of patch tokens dropped at random in training

    # ---- What other libraries' ViTs need (vit.load_pretrained; timm's names in brackets) ----
    num_registers: int = 0  # learned tokens that only take part in attention (Darcet et al. 2024)
    distilled: bool = False  # DeiT's distillation token and its head; inference averages both
    no_embed_class: bool = False  # position embeddings on the patches only [no_embed_class]
    fc_norm: bool = False  # the final norm after pooling instead of before [fc_norm]
    pre_norm: bool = False  # a norm before the blocks, a bias-free patch projection [pre_norm]
    layer_scale: float | None = None  # LayerScale on both branches, from this value [init_values]
    qkv_bias: bool = True
    norm_eps: float = 1e-5  # LayerNorm's; timm's ViTs use 1e-6
    # per-channel mean and std the model subtracts and divides by, for weights trained on
    # normalised images (timm's, Hugging Face's); images still come in [0, 1]. None: none
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: the class token, the distillation token, the registers."""
        return int(self.class_token) + int(self.distilled) + self.num_registers

    @property
    def stem_stride(self) -> int:
        """How much smaller the conv stem makes the image (1 without one; an 'airbench' stem's
        strides are all 2s)."""
        return math.prod(self.conv_stem_strides or [2] * len(self.conv_stem or []))

    def to_dict(self) -> dict:
        """JSON-ready values (lists for tuples): checkpoints' hparams and export's config.json."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, values: dict) -> ViTConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        require(not unknown, f"ViTConfig has no option {', '.join(unknown)}")
        return cls(**values)

    def resolve(self) -> ViTConfig:
        """This config with the preset's sizes where none is given, every value checked."""
        if self.preset not in PRESETS:
            raise UsageError(f"unknown preset {self.preset!r}; choose one of {', '.join(PRESETS)}")
        sizes = {k: v for k, v in PRESETS[self.preset].items() if getattr(self, k) is None}
        c = replace(self, **sizes)
        c.image_size = pair(c.image_size)
        c._check_sizes()
        c._check_choices()
        c._check_tokens_and_head()
        c._check_stem()
        c._check_without_blocks()
        c._check_attention()
        return c

    def _check_sizes(self) -> None:
        """Positive sizes (depth 0 allowed), heads that split the width, rates in [0, 1), patches
        that tile the image."""
        for name in ("dim", "heads", "patch_size"):
            require(getattr(self, name) >= 1, f"{name}={getattr(self, name)} must be at least 1")
        require(self.depth >= 0, f"depth={self.depth} must be at least 0 (0: no blocks)")
        require(
            self.depth == 0 or self.dim % self.heads == 0,  # without blocks no heads split it
            f"dim={self.dim} is not divisible by heads={self.heads}",
        )
        for name in ("dropout", "drop_path", "patch_dropout"):
            require(0 <= getattr(self, name) < 1, f"{name}={getattr(self, name)} must lie in [0, 1)")
        image_h, image_w = self.image_size
        if image_h % self.patch_size or image_w % self.patch_size:
            raise UsageError(
                f"image size {image_h}x{image_w} is not divisible by patch size {self.patch_size}"
            )

    def _check_choices(self) -> None:
        """The options that name one of a few choices."""
        if self.init not in ("timm", "torch"):
            raise UsageError(f"init must be 'timm' or 'torch', got {self.init!r}")
        if self.pool not in ("cls", "mean"):
            raise UsageError(f"pool must be 'cls' or 'mean', got {self.pool!r}")
        if self.pos_embed not in ("learned", "sincos", "periodic", "none"):
            raise UsageError(
                f"pos_embed must be 'learned', 'sincos', 'periodic' or 'none', got {self.pos_embed!r}"
            )

    def _check_tokens_and_head(self) -> None:
        """Prefix tokens that go together, a head that fits them, and the input's mean and std."""
        require(self.class_token or self.pool == "mean", "a model without a class token needs pool='mean'")
        require(self.class_token or not self.distilled, "a distillation token goes with a class token")
        require(self.num_registers >= 0, f"num_registers={self.num_registers} must be >= 0")
        require(not (self.distilled and self.fc_norm), "distilled and fc_norm do not combine")
        require(
            self.num_classes >= 0 and (self.num_classes or not self.distilled),
            f"num_classes={self.num_classes} must be >= 1",
        )
        require((self.mean is None) == (self.std is None), "mean and std go together")
        if self.mean is not None:
            require(
                len(self.mean) == len(self.std) == self.in_channels,
                f"mean and std need {self.in_channels} values each",
            )
            require(all(s > 0 for s in self.std), f"std={self.std} must be positive")

    def _check_stem(self) -> None:
        """A conv stem of positive widths and strides of 1 or 2, whose stride divides the patch."""
        if self.conv_stem_strides is not None:
            require(
                self.conv_stem is not None and len(self.conv_stem_strides) == len(self.conv_stem),
                f"conv_stem_strides={list(self.conv_stem_strides)} needs one stride per conv_stem entry",
            )
            require(all(s in (1, 2) for s in self.conv_stem_strides), "conv_stem_strides must be 1s and 2s")
            require(
                self.conv_stem_block == "conv" or all(s == 2 for s in self.conv_stem_strides),
                "an 'airbench' stem's blocks each halve the map: its conv_stem_strides are 2s",
            )
        require(
            self.conv_stem_block in ("conv", "airbench"),
            f"conv_stem_block must be 'conv' or 'airbench', got {self.conv_stem_block!r}",
        )
        if self.conv_stem:
            require(
                all(n >= 1 for n in self.conv_stem),
                f"conv_stem={list(self.conv_stem)} needs positive channels",
            )
            require(
                self.patch_size % self.stem_stride == 0,
                f"patch_size={self.patch_size} is not divisible by the stem's {self.stem_stride}",
            )
            require(not self.shifted_patches, "conv_stem and shifted_patches do not combine")

    def _check_without_blocks(self) -> None:
        """Depth 0, the control without attention: the stem, the patch embedding, the positions,
        the final norm, the patches' mean and the head. What only attention would read is refused;
        what shapes the blocks (heads, mlp_ratio, locality_attention, layer_scale, drop_path,
        qkv_bias, fused_attn) is ignored, so a config's control is the same command with
        `--model.vit.depth 0`; a class token, never read with pool='mean', is kept unused."""
        if self.depth:
            return
        require(
            self.pool == "mean",
            "depth 0 needs pool='mean': without blocks the class token never sees the patches, "
            "so the head would read a constant",
        )
        require(not self.distilled, "depth 0 takes no distillation token: its head would read a constant")
        require(not self.num_registers, "depth 0 takes no registers: they only take part in attention")
        require(not self.rel_pos_bias, "depth 0 takes no rel_pos_bias: it only biases attention")
        require(self.attn_window is None, "depth 0 takes no attn_window: it only limits attention")

    def _check_attention(self) -> None:
        """The attention window and relative position bias, with what each needs of the tokens."""
        if self.attn_window is not None:
            # the class token would carry global information, so it is cut off: a local model
            require(self.pool == "mean", "attn_window needs pool='mean' (the class token is cut off)")
            require(self.attn_window >= 0, f"attn_window={self.attn_window} must be >= 0")
            require(self.patch_dropout == 0, "attn_window needs every patch (patch_dropout 0)")
            require(not self.locality_attention, "attn_window and locality_attention do not combine")
            require(self.num_prefix_tokens == 1, "attn_window needs the class token as the only prefix token")
        if self.rel_pos_bias:
            require(self.attn_window is None, "rel_pos_bias and attn_window do not combine")
            require(self.patch_dropout == 0, "rel_pos_bias needs every patch (patch_dropout 0)")
            require(
                self.num_prefix_tokens == int(self.class_token),
                "rel_pos_bias takes a class token at most (no distillation token, no registers)",
            )


def pair(x: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    return (x, x) if isinstance(x, int) else (int(x[0]), int(x[1]))
