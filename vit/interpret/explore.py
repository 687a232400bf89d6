"""Explore a ViT's attention in the browser: one self-contained page, every layer and head at once.

    page = vit.explore(model, images)   # in Jupyter, `page` shows itself inline
    page.save("attention.html")         # the same page as a file: opens offline, can be mailed

The page (the template `vit/interpret/page.html`: markup, style and one small script, no framework, no
network) holds the images and, per image, every layer's and head's attention weights, the
attention rollout through each layer and the gradient-weighted rollout for the top classes. The
user picks an image, hovers or clicks a patch or a prefix token (class, distillation, register:
listed beside the grid, never drawn as patches) and sees where that query looks in every layer
and head; arrow keys move it. Everything is computed here with `vit.interpret.maps`; the page
only reads rows out of the matrices, averages heads (and, for a `pool: mean` model, the patch
rows the head reads) and draws.

Size: the weights go into the page as 8-bit codes, one scale per row (value = code x the row's
largest / 255; each token's weight on itself, the diagonal, as a float), compressed with zlib and written
in base85 (5 characters for 4 bytes, where base64 takes 5.33); the browser inflates them with
its own `DecompressionStream`. The page states the largest error the codes introduce.
"""

from __future__ import annotations

import base64
import html
import io
import json
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib.resources import files
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit.errors import UsageError
from vit.interpret.hooks import require_attention
from vit.interpret.maps import (
    MapSpec,
    attention_rollout,
    attention_weights,
    gradient_rollout,
    patch_token,
    select_heads,
    select_layers,
)
from vit.model import ViT

# The page's views, by the method names of `vit-attention --method`.
VIEWS = {"cls": "attention", "query": "attention", "rollout": "rollout", "grad-rollout": "grad-rollout"}
COLORMAPS = ("viridis", "magma", "gray")
LEVELS = 255  # 8-bit codes: 0 .. 255
PLACEHOLDER = "__EXPLORE_DATA__"  # where the template takes its data
QUANTISATION = (
    "8-bit codes per row with the row's scale (value = code x the row's largest / 255), "
    "a token's weight on itself as a float"
)


def quantise(matrices: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Non-negative matrices (..., T, T), row by row: each row's diagonal entry (a token's weight
    on itself, which the identity of a rollout inflates) kept as a float32, the rest as 8-bit
    codes with one float32 scale per row (the largest of them over 255), so a row's small weights
    are not lost under a large diagonal. A value is off by at most half its row's scale. Returns
    the codes (..., T, T), the scales (..., T), the diagonals (..., T) and the largest error."""
    matrices = matrices.float().clamp_min(0)
    eye = torch.eye(matrices.shape[-1], dtype=torch.bool)
    diagonal = matrices.diagonal(dim1=-2, dim2=-1)
    rest = matrices.masked_fill(eye, 0.0)
    scale = (rest.amax(dim=-1, keepdim=True) / LEVELS).clamp_min(1e-30)
    codes = (rest / scale).round().clamp(0, LEVELS).to(torch.uint8)
    restored = (codes.float() * scale).masked_fill(eye, 0.0) + torch.diag_embed(diagonal)
    error = float((restored - matrices).abs().max()) if matrices.numel() else 0.0
    as_float32 = lambda t: t.numpy().astype("<f4")  # noqa: E731
    return codes.masked_fill(eye, 0).numpy(), as_float32(scale[..., 0]), as_float32(diagonal), error


def image_data_uri(image: torch.Tensor) -> str:
    """An image (C, H, W) in [0, 1] as a data URI: PNG, or JPEG (quality 90) where that is smaller,
    as it is for photographs: the page only draws it under the maps."""
    pixels = (image.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    picture = Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels)
    encoded = {}
    for kind, options in (("png", {}), ("jpeg", {"quality": 90})):
        buffer = io.BytesIO()
        picture.save(buffer, format=kind.upper(), **options)
        encoded[kind] = buffer.getvalue()
    kind = min(encoded, key=lambda k: len(encoded[k]))
    return f"data:image/{kind};base64," + base64.b64encode(encoded[kind]).decode("ascii")


def colormap_tables() -> dict[str, str]:
    """Each colormap as 256 RGB triples (768 bytes, base64): the page looks colours up in them."""
    from matplotlib import colormaps

    tables = {}
    for name in COLORMAPS:
        rgb = (colormaps[name](np.linspace(0, 1, 256))[:, :3] * 255).round().astype(np.uint8)
        tables[name] = base64.b64encode(rgb.tobytes()).decode("ascii")
    return tables


@dataclass
class Explorer:
    """The page `explore` built: `save(path)` writes it; Jupyter shows it inline (in an iframe,
    so that its script and style stay its own)."""

    data: dict  # what the page shows (JSON)
    html: str  # the page itself

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        if path.is_dir():
            raise UsageError(f"{path} is a folder; give a file name such as {path / 'attention.html'}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.html, encoding="utf-8")
        return path

    def _repr_html_(self) -> str:
        height = 560 + 90 * self.data["model"]["layers"]
        return (
            f'<iframe srcdoc="{html.escape(self.html, quote=True)}" '
            f'style="width: 100%; height: {min(height, 1400)}px; border: 0"></iframe>'
        )


def explore(
    model: ViT,
    images: torch.Tensor,
    spec: MapSpec | None = None,
    captions: Sequence[str] | None = None,
    class_names: Sequence[str] | None = None,
    top_k: int = 5,
    batch_size: int = 64,
    scores: dict | None = None,
    head_effects: dict | None = None,
    title: str = "Where a ViT looks",
) -> Explorer:
    """The page for `images` (B, C, H, W) in [0, 1] as `model` sees them.

    `spec` (a `MapSpec`: its method, query patch, layer and head) chooses the view it opens on (cls
    or query for attention, rollout, grad-rollout; default the class token, the last layer, the
    mean of its heads); the page switches between them. A model without a class token (`pool:
    mean`) opens on the mean of the patch rows, what its head reads. The spec's `head_fusion` and
    `discard_ratio` are the rollout's (`attention_rollout`); the gradient-weighted rollout is
    computed for each image's `top_k` classes. `captions` label the images, `class_names` the
    classes. `scores` (method -> {measure: value}) are shown as a table when given; `head_effects`
    ({"title": ..., "values": [layer][head]}, and optionally "intervals": [layer][head] [low, high],
    such as a `vit-attention heads` ablation) as a layers x heads grid whose heads open their
    attention when clicked, each head's interval shown when hovered.
    """
    spec = _checked_spec(model, images, spec, captions=captions, top_k=top_k, head_effects=head_effects)
    start = _start_view(model, spec)
    maps = _page_maps(model, images, spec, top_k=top_k, batch_size=batch_size)
    encoded = _encoded_images(images, maps, captions=captions)
    data = {
        "title": title,
        "model": _model_facts(model, tokens=maps.weights.shape[-1]),
        "rollout": {"head_fusion": spec.head_fusion, "discard_ratio": spec.discard_ratio},
        "quantisation": {"scheme": QUANTISATION, "max_error": encoded.errors},
        "classes": list(class_names or [str(i) for i in range(maps.num_classes)]),
        "images": encoded.entries,
        "start": asdict(start),
        "colormaps": colormap_tables(),
        "scores": scores,  # "Which map tells the truth?": per-method scores, when measured
        "head_effects": head_effects,  # which heads the prediction uses, when measured
    }
    return Explorer(data, page_html(data))


def _checked_spec(
    model: ViT,
    images: torch.Tensor,
    spec: MapSpec | None,
    *,
    captions: Sequence[str] | None,
    top_k: int,
    head_effects: dict | None,
) -> MapSpec:
    """`explore`'s arguments checked, each fault one `UsageError`; the view to open on (`spec`, or
    by default the class token's attention, or without one what the head reads)."""
    if not isinstance(model, ViT):
        raise UsageError(f"explore takes a vit.ViT, not a {type(model).__name__}")
    require_attention(model)
    if head_effects is not None:
        layers, per_layer = len(model.blocks), model.config.heads
        grids = [head_effects[k] for k in ("values", "intervals") if k in head_effects]
        for grid in grids:
            if len(grid) != layers or any(len(row) != per_layer for row in grid):
                raise UsageError(
                    f"the heads' figures are not of this model's {layers} layers x {per_layer} heads"
                )
    if images.ndim != 4 or len(images) == 0:
        raise UsageError(f"explore takes a batch of images (B, C, H, W), got shape {tuple(images.shape)}")
    if spec is None:  # the class token's attention, or (none) the head's input's
        spec = MapSpec("cls" if model.cls_token is not None else "rollout")
    if spec.method not in VIEWS:
        raise UsageError(f"the page shows the methods {', '.join(VIEWS)}, not {spec.method}")
    spec.check(model)
    if top_k < 1:
        raise UsageError(f"top_k={top_k} must be at least 1")
    if captions is not None and len(captions) != len(images):
        raise UsageError(f"{len(captions)} captions for {len(images)} images")
    return spec


@dataclass
class StartView:
    """What the page shows when it opens (its `start`)."""

    view: str  # "attention", "rollout" or "grad-rollout"
    query: int  # the query token; -1: the mean of the patch rows
    layer: int
    head: int  # -1: the mean of the heads


def _start_view(model: ViT, spec: MapSpec) -> StartView:
    """The view, query token, layer and head of `spec`, as the page indexes them."""
    if spec.query_patch is not None:
        query = patch_token(model, spec.query_patch)
    elif model.cls_token is not None:
        query = 0
    else:  # -1: the mean of the patch rows, what a `pool: mean` head reads; else the centre patch
        centre = (model.grid_size[0] // 2, model.grid_size[1] // 2)
        query = -1 if model.pool == "mean" else patch_token(model, centre)
    return StartView(
        view=VIEWS[spec.method],
        query=query,
        layer=select_layers(model, spec.layer)[-1],
        head=-1 if spec.head is None else select_heads(model, spec.head)[0],
    )


@dataclass
class PageMaps:
    """Every matrix the page draws, for a batch of B images of T tokens."""

    weights: torch.Tensor  # attention weights (layers, B, heads, T, T)
    rollouts: torch.Tensor  # the rollout through layers 0 to l, for every l: (layers, B, T, T)
    relevance: torch.Tensor  # the gradient-weighted rollout of each image's top classes (B, K, T, T)
    top: torch.return_types.topk | None  # those classes and their probabilities (B, K); None: no head
    num_classes: int  # 0: the model has no head


def _page_maps(model: ViT, images: torch.Tensor, spec: MapSpec, *, top_k: int, batch_size: int) -> PageMaps:
    """The attention weights, the rollouts through every layer (with `spec`'s head fusion and
    discard ratio) and the gradient-weighted rollout of each image's `top_k` classes."""
    weights, logits = attention_weights(model, images, batch_size=batch_size, return_logits=True)
    prefix = model.num_prefix_tokens
    rollouts = torch.stack(
        [
            attention_rollout(weights[: i + 1], spec.head_fusion, spec.discard_ratio, prefix)
            for i in range(len(model.blocks))
        ]
    )
    num_classes = logits.shape[-1] if getattr(model.head, "out_features", 0) else 0
    if not num_classes:  # no head: nothing to explain a class of
        relevance = torch.zeros(len(images), 0, weights.shape[-1], weights.shape[-1])
        return PageMaps(weights, rollouts, relevance, top=None, num_classes=0)
    top = logits.softmax(-1).topk(min(top_k, num_classes), dim=-1)
    relevance = torch.stack(
        [gradient_rollout(model, images, top.indices[:, k], batch_size) for k in range(top.indices.shape[1])],
        dim=1,
    )  # (B, K, T, T)
    return PageMaps(weights, rollouts, relevance, top=top, num_classes=num_classes)


@dataclass
class EncodedImages:
    """The images as the page holds them, and the largest error the 8-bit codes made, by view."""

    entries: list[dict]  # per image: caption, picture, top classes, the compressed matrices
    errors: dict[str, float]


def _encoded_images(images: torch.Tensor, maps: PageMaps, *, captions: Sequence[str] | None) -> EncodedImages:
    """Each image's picture, top classes and matrices (`quantise`d, zlib-compressed, base85)."""
    errors = {"attention": 0.0, "rollout": 0.0, "grad-rollout": 0.0}
    entries = []
    for b in range(len(images)):
        parts = {  # kind -> rows (..., T, T), in the order the page reads them
            "attention": maps.weights[:, b],  # (L, H, T, T)
            "rollout": maps.rollouts[:, b],  # (L, T, T)
            "grad-rollout": maps.relevance[b],  # (K, T, T)
        }
        scales, diagonals, codes = [], [], []
        for kind, matrices in parts.items():
            c, s, d, error = quantise(matrices)
            errors[kind] = max(errors[kind], error)
            scales.append(s.tobytes())
            diagonals.append(d.tobytes())
            codes.append(c.tobytes())
        blob = zlib.compress(b"".join(scales + diagonals + codes), 6)  # float32s first: aligned
        top = maps.top
        entry = {
            "caption": captions[b] if captions is not None else f"image {b}",
            "src": image_data_uri(images[b].cpu()),
            "top": [] if top is None else [
                [int(i), round(float(p), 4)] for i, p in zip(top.indices[b], top.values[b], strict=True)
            ],
            "data": base64.b85encode(blob).decode("ascii"),  # 5 characters for 4 bytes
        }  # fmt: skip
        entries.append(entry)
    return EncodedImages(entries, errors)


def _model_facts(model: ViT, *, tokens: int) -> dict:
    """What the page needs to know of the model to lay out its matrices of `tokens` tokens."""
    return {
        "layers": len(model.blocks),
        "heads": model.blocks[0].attn.heads,
        "grid": list(model.grid_size),
        "patch": model.patch_size,
        "tokens": tokens,
        "prefix": model.token_names()[: model.num_prefix_tokens],  # the tokens before the patches
        "pool": model.pool,
    }


def page_html(data: dict) -> str:
    """The page: the template with `data` in it as JSON."""
    template = files("vit.interpret").joinpath("page.html").read_text(encoding="utf-8")
    # inside <script type="application/json">, "</" would end it and "<!--" change how it ends
    text = json.dumps(data, separators=(",", ":")).replace("</", "<\\/").replace("<!--", "<\\u0021--")
    return template.replace(PLACEHOLDER, text)
