"""The ViTs people study, as this project's from-scratch `ViT`, with outputs proven equal.

    model = vit.load_pretrained("timm:vit_tiny_patch16_224", weights="vit_tiny.safetensors")

`source` names a model of another library: `timm:<model name>` for now. The source's own code
builds its model (with `weights`, from that file and nothing downloaded; without, fetching its
weights as the library normally does), then its weights are copied into a `ViT` of the same
architecture (class, distillation and register tokens, positions on the patches only, average
pooling with fc_norm, pre_norm, LayerScale), which takes images in [0, 1] and applies the source's
mean/std itself. A feature the source model has and `ViT` does not (qk-norm, attention pooling,
...) is refused with one line naming it, never mapped into a different model.
`tests/test_pretrained.py` checks the logits against the source's on random inputs.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from einops import rearrange
from torch import nn

from vit.errors import UsageError, one_line
from vit.export import is_exported, read_folder
from vit.model import ViT

SOURCES = ("timm",)


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors by name from a `.safetensors` file or a `.pth`/`.bin` state dict (read without
    unpickling code; a checkpoint that wraps its weights in "model" or "state_dict" is unwrapped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights not found: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(path)
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(f"refusing {path}: it holds more than tensors ({one_line(e)[:200]})") from e
    except Exception as e:  # safetensors' and torch's many ways of saying "not this format"
        raise ValueError(f"{path} is not a weights file ({type(e).__name__}: {one_line(e)[:200]})") from e
    for key in ("model", "state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} is not a state dict (a dict of tensors)")
    return state


def _timm_model(name: str, weights: str | Path | None) -> nn.Module:
    import timm

    if name not in timm.list_models(pretrained=False) and name not in timm.list_models(pretrained=True):
        raise UsageError(f"timm has no model {name!r}")
    if weights is None:
        try:
            return timm.create_model(name, pretrained=True)
        except Exception as e:  # no network, no cached weights
            raise ValueError(
                f"cannot fetch the weights of timm:{name} ({type(e).__name__}: {one_line(e)[:150]}); "
                f"give a file with weights=FILE (.safetensors or .pth)"
            ) from e
    state = read_state_dict(weights)
    head = state.get("head.weight")
    model = timm.create_model(name, pretrained=False, num_classes=0 if head is None else head.shape[0])
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        text = one_line(e)
        raise ValueError(f"{weights} does not fit timm:{name}: {text[:300]}") from e
    return model


def _check_timm_features(model: nn.Module, name: str) -> None:
    """Refuse, naming it, what a timm VisionTransformer has and `ViT` cannot express."""
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(model, VisionTransformer):
        raise UsageError(f"timm:{name} is a {type(model).__name__}, not a VisionTransformer")
    block = model.blocks[0]
    unsupported = {
        "attention pooling": getattr(model, "attn_pool", None) is not None,
        f"global_pool={model.global_pool!r}": model.global_pool not in ("token", "avg", "map"),
        "qk-norm": not isinstance(block.attn.q_norm, nn.Identity),
        "a norm inside the MLP": not isinstance(getattr(block.mlp, "norm", nn.Identity()), nn.Identity),
        "an activation other than exact GELU": not (
            isinstance(block.mlp.act, nn.GELU) and block.mlp.act.approximate == "none"
        ),
        "a bias-free patch projection without pre_norm": (
            model.patch_embed.proj.bias is None and isinstance(model.norm_pre, nn.Identity)
        ),
        "no position embeddings": model.pos_embed is None,
    }
    found = [feature for feature, present in unsupported.items() if present]
    if found:
        raise UsageError(f"timm:{name} has {', '.join(found)}, which vit.ViT does not express")


def _from_timm(model: nn.Module, name: str) -> ViT:
    _check_timm_features(model, name)
    proj = model.patch_embed.proj  # a convolution with stride = kernel = patch size
    cfg, block = model.pretrained_cfg, model.blocks[0]
    dim, num_classes = model.embed_dim, getattr(model.head, "out_features", 0)
    distilled = getattr(model, "dist_token", None) is not None
    fc_norm = not isinstance(model.fc_norm, nn.Identity)
    layer_scale = not isinstance(block.ls1, nn.Identity)
    ours = ViT(
        num_classes=num_classes,
        image_size=tuple(model.patch_embed.img_size),
        patch_size=proj.kernel_size[0],
        in_channels=proj.in_channels,
        dim=dim,
        depth=len(model.blocks),
        heads=block.attn.num_heads,
        mlp_ratio=block.mlp.fc1.out_features / dim,
        pool="cls" if model.global_pool == "token" else "mean",
        norm_eps=(model.fc_norm if fc_norm else model.norm).eps,
        mean=tuple(cfg.get("mean", (0.0,) * proj.in_channels)),
        std=tuple(cfg.get("std", (1.0,) * proj.in_channels)),
        class_token=model.has_class_token,
        num_registers=model.num_reg_tokens,
        distilled=distilled,
        no_embed_class=model.no_embed_class,
        fc_norm=fc_norm,
        pre_norm=not isinstance(model.norm_pre, nn.Identity),
        layer_scale=1.0 if layer_scale else None,  # the values come with the weights
        qkv_bias=block.attn.qkv.bias is not None,
    )
    source = model.state_dict()
    # ours -> timm's; a convolution over (c, p1, p2) is a linear map of the (p1 p2 c)-flattened patch
    state = {
        "to_patch_embedding.1.weight": rearrange(
            source.pop("patch_embed.proj.weight"), "d c p1 p2 -> d (p1 p2 c)"
        )
    }
    renames = {"to_patch_embedding.1.bias": "patch_embed.proj.bias"}
    for i in range(len(model.blocks)):
        for mine, theirs in (("mlp.0", "mlp.fc1"), ("mlp.3", "mlp.fc2")):
            for kind in ("weight", "bias"):
                renames[f"blocks.{i}.{mine}.{kind}"] = f"blocks.{i}.{theirs}.{kind}"
    for key in ours.state_dict():
        if key not in state:
            state[key] = source.pop(renames.get(key, key))
    ours.load_state_dict(state)
    return ours.eval()


def load_pretrained(source: str, weights: str | Path | None = None) -> ViT:
    """A `ViT` that computes what `source`'s model computes: `timm:<model name>`, or a folder
    written by vit-export (`vit.export`). With `weights` (.safetensors, or a .pth/.bin state
    dict), nothing is downloaded and the head (its class count, or none) is read from the file;
    without, the library fetches its weights."""
    if is_exported(source):
        if weights is not None:
            raise UsageError(f"{source} holds its own weights; give no weights file with it")
        return read_folder(source)[0]
    kind, _, name = source.partition(":")
    if kind not in SOURCES or not name:
        raise UsageError(f"unknown model source {source!r}; give timm:<model name> or a vit-export folder")
    return _from_timm(_timm_model(name, weights), name)
