"""The ViTs people study, as this project's from-scratch `ViT`, with outputs proven equal.

    model = vit.load_pretrained("timm:vit_tiny_patch16_224", weights="vit_tiny.safetensors")

`source` names a model of another library: `timm:<model name>`, or `hf:<repo id or a folder written
by transformers' save_pretrained>` (ViTForImageClassification, ViTModel, Dinov2Model), or a folder
written by vit-export. The source's own code builds its model (with `weights`, from that file and
nothing downloaded; without, fetching its weights as the library normally does), then its weights
are copied into a `ViT` of the same architecture (class, distillation and register tokens,
positions on the patches only, average pooling with fc_norm, pre_norm, LayerScale), which takes
images in [0, 1] and applies the source's mean/std itself. A feature the source model has and
`ViT` does not (qk-norm, attention pooling, ...) is refused with one line naming it, never mapped
into a different model. `load_source` also returns the `Preparation` that goes with the model
(its input size, the source's resize, its class names: ImageNet's from timm's class-info data,
or the Hugging Face config's labels). `tests/test_pretrained.py` checks the outputs against the
source's on random inputs.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from einops import rearrange
from torch import nn

from vit.config import pair
from vit.errors import UsageError, one_line
from vit.export import is_exported, read_folder
from vit.model import ViT
from vit.preparation import Preparation

SOURCES = ("timm", "hf")
HF_ARCHITECTURES = ("ViTForImageClassification", "ViTModel", "Dinov2Model")


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


def fetched(source: str, fetch: Callable[[], nn.Module]) -> nn.Module:
    """The model `fetch` builds with the library's own download; failing that (no network, no
    cached weights), one line saying how to give the weights as a file instead."""
    try:
        return fetch()
    except Exception as e:  # the libraries' many ways of failing to download
        raise ValueError(
            f"cannot fetch the weights of {source} ({type(e).__name__}: {one_line(e)[:150]}); "
            f"give a file with weights=FILE (.safetensors, .pth or .bin)"
        ) from e


def _timm_model(name: str, weights: str | Path | None) -> nn.Module:
    import timm

    if name not in timm.list_models(pretrained=False) and name not in timm.list_models(pretrained=True):
        raise UsageError(f"timm has no model {name!r}")
    if weights is None:
        return fetched(f"timm:{name}", lambda: timm.create_model(name, pretrained=True))
    state = read_state_dict(weights)
    head = state.get("head.weight")
    model = timm.create_model(name, pretrained=False, num_classes=0 if head is None else head.shape[0])
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        text = one_line(e)
        raise ValueError(f"{weights} does not fit timm:{name}: {text[:300]}") from e
    return model


def refuse(source: str, unsupported: dict[str, bool]) -> None:
    """One line naming every feature of `source` that `ViT` does not express (those whose value
    is true), if any."""
    found = [feature for feature, present in unsupported.items() if present]
    if found:
        raise UsageError(f"{source} has {', '.join(found)}, which vit.ViT does not express")


def patch_projection(conv_weight: torch.Tensor) -> torch.Tensor:
    """The weight of a patch embedding written as a convolution (stride = kernel = patch size),
    (dim, c, p, p), as the weight of ours: a linear map of the (p1 p2 c)-flattened patch."""
    return rearrange(conv_weight, "d c p1 p2 -> d (p1 p2 c)")


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
    refuse(f"timm:{name}", unsupported)


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
    # ours <- timm's: the same names; the patch projection a convolution there
    source = model.state_dict()
    state = {"patch_embed.proj.weight": patch_projection(source.pop("patch_embed.proj.weight"))}
    for key in ours.state_dict():
        if key not in state:
            state[key] = source.pop(key)
    ours.load_state_dict(state)
    return ours.eval()


def short_names(descriptions: list[str], synsets: list[str]) -> list[str]:
    """ImageNet's "tench, Tinca tinca" -> "tench"; a name that two classes share ("crane", the
    bird and the machine) says its synset too: "crane (n02012849)"."""
    short = [d.split(",")[0].strip() for d in descriptions]
    counts = {name: short.count(name) for name in short}
    return [name if counts[name] == 1 else f"{name} ({s})" for name, s in zip(short, synsets, strict=True)]


def _timm_preparation(model: nn.Module, ours: ViT) -> Preparation:
    """timm's input size and crop, and the head's class names: ImageNet's (from timm's own
    class-info data) when the head is ImageNet's, else numbered."""
    from timm.data import ImageNetInfo, infer_imagenet_subset

    classes, ids = [str(i) for i in range(ours.config.num_classes)], []
    subset = infer_imagenet_subset(model) if ours.config.num_classes else None
    if subset:
        info = ImageNetInfo(subset)
        if info.num_classes() == ours.config.num_classes:
            ids = info.label_names()
            classes = short_names(info.label_descriptions(), ids)
    squash = model.pretrained_cfg.get("crop_mode") == "squash"
    return Preparation(
        channels=ours.in_channels,
        size=ours.image_size,
        resize="stretch" if squash else "center_crop",
        classes=classes,
        class_ids=ids,
    )


def _hf_model(name: str, weights: str | Path | None) -> tuple[nn.Module, object]:
    """The transformers model `name` names (a Hub repo id, or a folder written by save_pretrained)
    and its image processor."""
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(name)
        processor = transformers.AutoImageProcessor.from_pretrained(name)
    except Exception as e:  # no such folder, no network, no preprocessor_config.json
        raise ValueError(
            f"cannot read the config and image processor of hf:{name} ({type(e).__name__}: "
            f"{one_line(e)[:150]}); give a folder written by save_pretrained (with the image "
            f"processor's preprocessor_config.json)"
        ) from e
    architecture = (config.architectures or [type(config).__name__.replace("Config", "Model")])[0]
    if architecture not in HF_ARCHITECTURES:
        raise UsageError(f"hf:{name} is a {architecture}; vit.ViT reads {', '.join(HF_ARCHITECTURES)}")
    model_class = getattr(transformers, architecture)
    if weights is None:
        return fetched(f"hf:{name}", lambda: model_class.from_pretrained(name)), processor
    state = read_state_dict(weights)
    head = state.get("classifier.weight")
    if architecture == "ViTForImageClassification" and head is not None:
        config.num_labels = head.shape[0]
    model = model_class(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("mask_token")]  # for masked training only
    if missing or unexpected:
        text = f"missing {', '.join(missing) or 'none'}; unexpected {', '.join(unexpected) or 'none'}"
        raise ValueError(f"{weights} does not fit hf:{name}: {text[:300]}")
    return model, processor


def _check_hf_features(model: nn.Module, name: str) -> None:
    config = model.config
    unsupported = {
        f"hidden_act={config.hidden_act!r} (not exact GELU)": config.hidden_act != "gelu",
        "a SwiGLU MLP": getattr(config, "use_swiglu_ffn", False),
        "no final layer norm": not getattr(config, "apply_layernorm", True),
    }
    refuse(f"hf:{name}", unsupported)


def _first(module: nn.Module, *names: str) -> nn.Module:
    """The first of `names` that `module` has (transformers names a norm differently per model)."""
    return next(getattr(module, n) for n in names if hasattr(module, n))


def _from_hf(model: nn.Module, processor, name: str) -> tuple[ViT, Preparation]:
    _check_hf_features(model, name)
    ours = _hf_architecture(model, processor)
    ours.load_state_dict({k: v.detach().clone() for k, v in _hf_state(model).items()})
    return ours.eval(), _hf_preparation(model.config, processor, ours)


def _hf_parts(model: nn.Module) -> tuple[nn.Module, nn.ModuleList, nn.Module | None]:
    """The transformers model's base (ViTForImageClassification wraps a ViTModel), its layers and
    its classifier head (None without one)."""
    base = getattr(model, "vit", model)
    layers = base.layers if hasattr(base, "layers") else base.encoder.layer
    return base, layers, getattr(model, "classifier", None)


def _hf_architecture(model: nn.Module, processor) -> ViT:
    """A `ViT` of the transformers model's architecture, its mean and std the image processor's."""
    config = model.config
    base, layers, head = _hf_parts(model)
    proj = base.embeddings.patch_embeddings.projection
    dim = config.hidden_size
    return ViT(
        num_classes=head.out_features if head is not None else 0,
        image_size=config.image_size,
        patch_size=proj.kernel_size[0],
        in_channels=proj.in_channels,
        dim=dim,
        depth=len(layers),
        heads=config.num_attention_heads,
        mlp_ratio=layers[0].mlp.fc1.out_features / dim,
        pool="cls",
        norm_eps=config.layer_norm_eps,
        mean=tuple(processor.image_mean),
        std=tuple(processor.image_std),
        layer_scale=1.0 if hasattr(layers[0], "layer_scale1") else None,  # the values come with the weights
        qkv_bias=config.qkv_bias,
    )


def _hf_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The transformers model's weights under our names, module by module (transformers renames
    its keys between versions)."""
    base, layers, head = _hf_parts(model)
    embeddings = base.embeddings
    proj = embeddings.patch_embeddings.projection
    layer_scale = hasattr(layers[0], "layer_scale1")
    state = {
        "cls_token": embeddings.cls_token,
        "pos_embed": embeddings.position_embeddings,
        "patch_embed.proj.weight": patch_projection(proj.weight),
        "patch_embed.proj.bias": proj.bias,
    }

    def take(prefix: str, module: nn.Module) -> None:
        for kind in ("weight", "bias"):
            if getattr(module, kind, None) is not None:
                state[f"{prefix}.{kind}"] = getattr(module, kind)

    for i, layer in enumerate(layers):
        attention = layer.attention
        q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
        state[f"blocks.{i}.attn.qkv.weight"] = torch.cat([q.weight, k.weight, v.weight])
        if q.bias is not None:
            state[f"blocks.{i}.attn.qkv.bias"] = torch.cat([q.bias, k.bias, v.bias])
        take(f"blocks.{i}.attn.proj", attention.o_proj)
        take(f"blocks.{i}.norm1", _first(layer, "layernorm_before", "norm1"))
        take(f"blocks.{i}.norm2", _first(layer, "layernorm_after", "norm2"))
        take(f"blocks.{i}.mlp.fc1", layer.mlp.fc1)
        take(f"blocks.{i}.mlp.fc2", layer.mlp.fc2)
        if layer_scale:
            state[f"blocks.{i}.ls1.gamma"] = layer.layer_scale1.lambda1
            state[f"blocks.{i}.ls2.gamma"] = layer.layer_scale2.lambda1
    take("norm", base.layernorm)
    if head is not None:
        take("head", head)
    return state


def _hf_preparation(config, processor, ours: ViT) -> Preparation:
    """The image processor's resize (centre crop or not) and the config's class names."""
    labels = getattr(config, "id2label", None) or {}
    classes = [labels.get(i, str(i)) for i in range(ours.config.num_classes)]
    crop = getattr(processor, "do_center_crop", False)
    return Preparation(
        channels=ours.in_channels, size=ours.image_size, resize="center_crop" if crop else "stretch",
        classes=classes,
    )  # fmt: skip


def load_source(source: str, weights: str | Path | None = None) -> tuple[ViT, Preparation]:
    """`load_pretrained`'s model, and the `Preparation` that goes with it: how image files become
    its input (the source's size and resize) and the names of its outputs."""
    if is_exported(source):
        if weights is not None:
            raise UsageError(f"{source} holds its own weights; give no weights file with it")
        return read_folder(source)
    kind, _, name = str(source).partition(":")
    if not name and Path(source).is_dir():
        raise ValueError(f"{source} holds no config.json written by vit-export")
    if kind not in SOURCES or not name:
        raise UsageError(
            f"unknown model source {source!r}; give timm:<model name>, hf:<repo id or folder> "
            f"or a folder written by vit-export"
        )
    if kind == "hf":
        return _from_hf(*_hf_model(name, weights), name)
    model = _timm_model(name, weights)
    ours = _from_timm(model, name)
    return ours, _timm_preparation(model, ours)


def load_pretrained(source: str, weights: str | Path | None = None) -> ViT:
    """A `ViT` that computes what `source`'s model computes: `timm:<model name>`,
    `hf:<repo id or save_pretrained folder>`, or a folder written by vit-export (`vit.export`).
    With `weights` (.safetensors, or a .pth/.bin state dict), nothing is downloaded and the head
    (its class count, or none) is read from the file; without, the library fetches its weights."""
    return load_source(source, weights)[0]


def for_finetuning(
    source: str,
    weights: str | Path | None,
    num_classes: int,
    image_size: int | tuple[int, int],
    in_channels: int,
    **training,
) -> ViT:
    """`load_pretrained(source, weights)` made ready for other data: a new head when the class
    count differs, position embeddings resampled to `image_size`, and the training
    options given (`dropout`, `drop_path`, `patch_dropout`, `fused_attn`: how it trains, not
    what it computes in eval mode) set. The image channels must be the source's."""
    source_model = load_pretrained(source, weights)
    config = source_model.config
    if config.in_channels != in_channels:
        raise UsageError(
            f"{source} takes {config.in_channels}-channel images and the data has {in_channels} channels"
        )
    model = ViT(replace(config, **training))
    model.load_state_dict(source_model.state_dict())
    if num_classes != config.num_classes:
        model.reset_classifier(num_classes)
    if tuple(pair(image_size)) != tuple(model.image_size):
        model.set_image_size(image_size)
    return model
