"""Attention weights of a trained ViT and the maps and statistics computed from them.

- `attention_weights`: every block's weights (layers, batch, heads, tokens, tokens), in chunks,
  for chosen layers and heads, even when the model runs the fused path (hooks for one call).
- `cls_attention_maps`, `query_attention_maps`: one row of the weights laid out on the patch grid;
  `pooled_maps`: the rows the head reads (the class token's, with a distilled model also the
  distillation token's, or the patch tokens' mean).
- `attention_rollout`: Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers".
- `gradient_rollout`: Chefer, Gur & Wolf 2021, "Generic Attention-model Explainability for
  Interpreting Bi-Modal and Encoder-Decoder Transformers" (gradient-weighted attention, R += A R).
- `mean_attention_distance`, `pos_embed_similarity`, `embedding_filter_components`: the three
  panels of Figure 7 of the ViT paper (Dosovitskiy et al. 2021).
- `MAP_METHODS`: every map method (class token, one patch, rollout, gradient rollout, input
  gradient), once; `MapSpec`: one map, checked (the options of vit-attention); `method_maps`: the
  maps of a spec; `explain`: those maps with their titles and the predictions, and for cls and
  query every layer's and head's. vit-attention draws what `explain` returns, `vit-attention
  score` scores what `method_maps` gives.

The number of prefix tokens and the patch grid are read from the model, so non-square images
and other token layouts work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from vit.errors import UsageError
from vit.interpret.hooks import (
    device_of,
    explicit_attention,
    model_outputs,
    record_attention,
    require_attention,
)
from vit.model import ViT

# How `attention_rollout` fuses the heads of one layer.
HEAD_FUSIONS = {
    "mean": lambda w: w.mean(dim=-3),
    "max": lambda w: w.amax(dim=-3),
    "min": lambda w: w.amin(dim=-3),
}


def check_head_fusion(head_fusion: str) -> None:
    """A UsageError unless `head_fusion` names one of `HEAD_FUSIONS`."""
    if head_fusion not in HEAD_FUSIONS:
        raise UsageError(f"unknown head_fusion {head_fusion!r}; choose one of {', '.join(HEAD_FUSIONS)}")


def _resolve(index: int | Sequence[int] | None, size: int, what: str) -> list[int]:
    """None -> all of range(size); an int or ints (negative counts from the end) -> checked list."""
    if index is None:
        return list(range(size))
    indices = [index] if isinstance(index, int) else list(index)
    for i in indices:
        if not -size <= i < size:
            raise UsageError(f"{what}={i} is out of range for a model with {size} {what}s")
    return [i % size for i in indices]


def select_layers(model: ViT, layers: int | Sequence[int] | None) -> list[int]:
    require_attention(model)  # every map, and MapSpec.check, start here
    return _resolve(layers, len(model.blocks), "layer")


def select_heads(model: ViT, heads: int | Sequence[int] | None) -> list[int]:
    return _resolve(heads, model.blocks[0].attn.heads, "head")


def _chunks(model: ViT, images: torch.Tensor, layers, heads, batch_size: int):
    """(weights of the chosen layers and heads, logits) for each chunk of `batch_size` images."""
    if batch_size < 1:
        raise UsageError(f"batch_size={batch_size} must be at least 1")
    layers, heads = select_layers(model, layers), select_heads(model, heads)
    device = device_of(model)
    for chunk in images.split(batch_size):
        with torch.no_grad(), record_attention(model, layers, lambda w: w[:, heads].float()) as captured:
            logits = model(chunk.to(device))
        yield torch.stack([captured[i][0] for i in layers]), logits


def iter_attention(
    model: ViT,
    images: torch.Tensor,
    layers: int | Sequence[int] | None = None,
    heads: int | Sequence[int] | None = None,
    batch_size: int = 64,
) -> Iterator[torch.Tensor]:
    """Attention weights chunk by chunk: (chosen layers, chunk, chosen heads, tokens, tokens).

    Only the chosen layers run the explicit path and only the chosen heads are kept, so peak
    memory is one chunk's worth; statistics over many images can be accumulated chunk by chunk.
    """
    for weights, _ in _chunks(model, images, layers, heads, batch_size):
        yield weights


def attention_weights(
    model: ViT,
    images: torch.Tensor,
    layers: int | Sequence[int] | None = None,
    heads: int | Sequence[int] | None = None,
    batch_size: int = 64,
    return_logits: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Weights of the chosen blocks (all by default), (layers, batch, heads, tokens, tokens), fp32.

    The model may normally run the fused path; only this call computes the weights, `batch_size`
    images at a time. Layers and heads are counted from 0; negative ones count from the end.
    With `return_logits=True` the logits (batch, classes) of the same forward pass come too.
    """
    weights, logits = zip(*_chunks(model, images, layers, heads, batch_size), strict=True)
    weights = torch.cat(weights, dim=1).cpu()
    return (weights, torch.cat(logits).cpu()) if return_logits else weights


def to_patch_grid(model: ViT, rows: torch.Tensor) -> torch.Tensor:
    """Rows over all tokens (..., tokens) -> the patch tokens' values on the grid (..., gh, gw)."""
    patches = rows[..., model.num_prefix_tokens :]
    return rearrange(patches, "... (gh gw) -> ... gh gw", gh=model.grid_size[0], gw=model.grid_size[1])


def cls_attention_maps(model: ViT, weights: torch.Tensor) -> torch.Tensor:
    """Class-token attention to each patch, laid out on the patch grid: (..., grid_h, grid_w).

    `weights` is (..., tokens, tokens), for example one layer (batch, heads, tokens, tokens), all
    layers (layers, batch, heads, tokens, tokens) or a rollout (batch, tokens, tokens).
    """
    return to_patch_grid(model, weights[..., 0, :])  # what the class token looks at


def pooled_maps(model: ViT, relevance: torch.Tensor) -> torch.Tensor:
    """The rows of a rollout or relevance matrix (..., T, T) that feed the model's head, on the
    patch grid (..., grid_h, grid_w): the class token's row (`pool: cls`), or the mean of the
    patch tokens' rows (`pool: mean`: the head reads their mean, never the class token). With
    `pool: mean` the identity a rollout starts from adds the same 1/patches to every patch (with
    `pool: cls` it falls on the class token's own column, which the grid leaves out). A distilled
    model (DeiT) averages the logits of two heads, on the class and the distillation token: the
    mean of their two rows."""
    if model.head_dist is not None:
        return to_patch_grid(model, relevance[..., :2, :].mean(dim=-2))
    if model.pool == "mean":
        return to_patch_grid(model, relevance[..., model.num_prefix_tokens :, :].mean(dim=-2))
    return cls_attention_maps(model, relevance)


def patch_token(model: ViT, patch: tuple[int, int]) -> int:
    """Token index of the patch at (row, column) of the grid."""
    (row, col), (grid_h, grid_w) = patch, model.grid_size
    if not (0 <= row < grid_h and 0 <= col < grid_w):
        raise UsageError(f"patch ({row}, {col}) is outside the {grid_h}x{grid_w} patch grid")
    return model.num_prefix_tokens + row * grid_w + col


def query_attention_maps(model: ViT, weights: torch.Tensor, patch: tuple[int, int]) -> torch.Tensor:
    """Where the patch at (row, column) looks, on the patch grid: (..., grid_h, grid_w)."""
    return to_patch_grid(model, weights[..., patch_token(model, patch), :])


def _row_normalize(a: torch.Tensor) -> torch.Tensor:
    # rows are the queries: each must stay a distribution over keys (divide by ROW sums)
    return a / a.sum(dim=-1, keepdim=True).clamp_min(1e-12)


def discard_lowest(fused: torch.Tensor, ratio: float, num_prefix_tokens: int = 1) -> torch.Tensor:
    """Zero the lowest `ratio` of each row's weights to patch keys; weights to prefix-token keys
    (the class-token column, including the class token's attention to itself) are never dropped."""
    if not 0.0 <= ratio < 1.0:
        raise UsageError(f"discard_ratio={ratio} must lie in [0, 1)")
    patches = fused[..., num_prefix_tokens:]
    k = int(patches.shape[-1] * ratio)
    if k == 0:
        return fused
    lowest = patches.topk(k, dim=-1, largest=False).indices
    dropped = patches.scatter(-1, lowest, 0.0)
    return torch.cat((fused[..., :num_prefix_tokens], dropped), dim=-1)


def attention_rollout(
    weights: torch.Tensor, head_fusion: str = "mean", discard_ratio: float = 0.0, num_prefix_tokens: int = 1
) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020): (layers, batch, heads, T, T) -> (batch, T, T).

    Per layer: fuse the heads (mean, max or min), optionally discard the lowest weights, add the
    identity for the residual connection, divide every row by its sum (0.5 W + 0.5 I for the
    mean without discarding); then multiply the layers, later ones on the left:
    R = A_L ... A_2 A_1. Row i of R says how much of token i's final representation flows from
    each input token.
    """
    check_head_fusion(head_fusion)
    tokens = weights.shape[-1]
    eye = torch.eye(tokens, dtype=weights.dtype, device=weights.device)
    rollout = eye.expand(weights.shape[1], tokens, tokens)
    for layer in weights:  # (batch, heads, T, T), first layer first
        fused = discard_lowest(HEAD_FUSIONS[head_fusion](layer), discard_ratio, num_prefix_tokens)
        a = _row_normalize(fused + eye)  # the residual connection carries each token on
        rollout = a @ rollout
    return rollout


def gradient_rollout(
    model: ViT,
    images: torch.Tensor,
    targets: int | torch.Tensor | None = None,
    batch_size: int = 64,
) -> torch.Tensor:
    """Class-specific gradient-weighted rollout (Chefer et al. 2021): (batch, T, T).

    For each layer, A = mean over heads of (dScore/dA * A)^+, the positive part of gradient times
    attention; from R = I, accumulate R <- R + A R, first layer first. `targets` is the class
    to explain per image (an int for all, a tensor of one per image, None for the predicted one).
    Row 0 is the class token's relevance map (`pooled_maps` picks the rows the head reads).
    """
    if batch_size < 1:
        raise UsageError(f"batch_size={batch_size} must be at least 1")
    layers = list(range(len(model.blocks)))
    device = device_of(model)
    if isinstance(targets, int):
        targets = torch.full((len(images),), targets)
    results = []
    for start in range(0, len(images), batch_size):
        chunk = images[start : start + batch_size].to(device)
        with torch.enable_grad(), record_attention(model, layers, keep=lambda w: w) as captured:
            logits = model(chunk)
            if targets is None:
                chosen = logits.argmax(-1)
            else:
                chosen = targets[start : start + batch_size].to(device)
            num_classes = logits.shape[-1]
            if ((chosen < 0) | (chosen >= num_classes)).any():
                raise UsageError(f"target classes must lie in [0, {num_classes}), got {chosen.tolist()}")
            score = logits.gather(1, chosen[:, None]).sum()  # images are independent: sum is fine
            attn = [captured[i][0] for i in layers]
            grads = torch.autograd.grad(score, attn)
        tokens = attn[0].shape[-1]
        relevance = torch.eye(tokens, device=device).expand(len(chunk), tokens, tokens)
        for a, g in zip(attn, grads, strict=True):
            cam = (g * a).detach().float().clamp(min=0).mean(dim=1)  # (B, T, T), heads averaged
            relevance = relevance + cam @ relevance
        results.append(relevance.cpu())
    return torch.cat(results)


def patch_distances(model: ViT) -> torch.Tensor:
    """Distance in pixels between the centres of every two patches: (patches, patches)."""
    grid_h, grid_w = model.grid_size
    rows, cols = torch.meshgrid(torch.arange(grid_h), torch.arange(grid_w), indexing="ij")
    centres = torch.stack((rows.flatten(), cols.flatten()), dim=-1).float() * model.patch_size
    return torch.cdist(centres, centres)


def mean_attention_distance(model: ViT, weights: torch.Tensor) -> torch.Tensor:
    """The ViT paper's attention distance (Figure 7, right): (layers, batch, heads, T, T) ->
    (layers, heads), in pixels.

    For each patch query, the pixel distance to each patch key weighted by the attention to it
    (renormalized over the patch keys: the class token has no position), then averaged over the
    queries and the images. 0 when every patch attends only to itself.
    """
    prefix = model.num_prefix_tokens
    patches = _row_normalize(weights[..., prefix:, prefix:])  # (L, B, H, N, N)
    per_query = (patches * patch_distances(model).to(weights.device)).sum(-1)  # (L, B, H, N)
    return per_query.mean(dim=(1, 3))


def pos_embed_similarity(model: ViT) -> torch.Tensor:
    """Cosine similarity of each patch's position embedding with every other's (Figure 7, centre):
    (grid_h, grid_w, grid_h, grid_w); [r, c] is the tile of the patch at row r, column c."""
    if model.pos_embed is None:
        raise UsageError("the model has no position embeddings (pos_embed: none)")
    table = model.pos_embed.detach().float()[0, model.pos_embed_prefix :]  # (patches, dim)
    table = F.normalize(table, dim=-1)
    grid_h, grid_w = model.grid_size
    return rearrange(table @ table.T, "(h w) (h2 w2) -> h w h2 w2", h=grid_h, h2=grid_h, w=grid_w, w2=grid_w)


def embedding_filters(model: ViT) -> torch.Tensor:
    """The patch projection's rows as filters over the pixels a patch token reads, (dim, channels,
    window, window): without shifted patches the patch itself (window p); with them the patch
    and half a patch around it (window p + 2 shift), each shifted copy's weights added at the
    pixels they read. A token is its filters applied to that window (zeros outside the image),
    plus the bias, when there is no patch norm."""
    if model.config.conv_stem:
        raise UsageError("a model with a conv_stem has no patch filters over pixels to show")
    p, c = model.patch_size, model.in_channels
    weight = model.patch_proj.weight.detach().float()  # (dim, p*p*copies*c), laid out (p1 p2 copies c)
    copies = rearrange(weight, "d (p1 p2 copies c) -> copies d c p1 p2", p1=p, p2=p, c=c)
    shifted = model.patch_embed.shift
    if shifted is None:
        return copies[0]
    m = shifted.shift  # copy[y, x] = image[y - dy, x - dx]: its weight at (y, x) reads pixel
    window = copies.new_zeros(*copies.shape[1:3], p + 2 * m, p + 2 * m)  # (m + y - dy, m + x - dx)
    for copy, (dy, dx) in zip(copies, shifted.offsets, strict=True):
        window[..., m - dy : m - dy + p, m - dx : m - dx + p] += copy
    return window


def embedding_filter_components(model: ViT, k: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """Principal components of the patch-embedding filters (Figure 7, left).

    Each of the `dim` rows of the patch projection is a filter over the pixels its patch token
    reads (`embedding_filters`); the principal directions of those filters are images of that
    window. Returns the first `k` components (k, channels, window, window) and the share of the
    variance each explains (k,).
    """
    filters = embedding_filters(model)
    size = filters.shape[-1]
    filters = filters.flatten(1)
    centred = filters - filters.mean(dim=0, keepdim=True)
    _, s, vh = torch.linalg.svd(centred, full_matrices=False)
    k = min(k, vh.shape[0])
    explained = (s**2 / (s**2).sum())[:k]
    components = rearrange(vh[:k], "k (c h w) -> k c h w", h=size, w=size)
    return components, explained


def attention_share(
    weights: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor, num_prefix_tokens: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """How much attention patches put on other patches, against chance.

    `weights` (layers, batch, heads, T, T); `queries` and `keys` (batch, patches) boolean masks,
    for example the patches of one circle and of the other. Returns, per layer and head, the mean
    over images and query patches of the attention mass on the key patches (layers, heads), and
    the mass that uniform attention over all T tokens would put there (a scalar: the chance level).
    """
    prefix = num_prefix_tokens
    on_keys = (weights[..., prefix:, prefix:] * keys[None, :, None, None, :]).sum(-1)  # (L, B, H, N)
    q = queries[None, :, None, :].float()
    per_image = (on_keys * q).sum(-1) / q.sum(-1).clamp_min(1)  # (L, B, H)
    used = queries.any(dim=-1)  # images with at least one query patch
    chance = (keys.sum(-1).float() / weights.shape[-1])[used].mean()
    return per_image[:, used].mean(dim=1), chance


# ------------------------------------------------------------------ input gradient (not attention)


def input_gradient(model: nn.Module, images: torch.Tensor, targets: torch.Tensor, grid: tuple[int, int]):
    """Gradient of the target logit times the input, summed over channels and each patch's pixels:
    (B, patches)."""
    device = device_of(model)
    images = images.to(device).requires_grad_(True)
    with torch.enable_grad():
        logits = model(images)
        (grad,) = torch.autograd.grad(logits.gather(1, targets.to(device)[:, None]).sum(), images)
    saliency = (grad * images).detach().sum(dim=1, keepdim=True)  # (B, 1, H, W)
    pixels_per_patch = saliency[0, 0].numel() / (grid[0] * grid[1])
    return (F.adaptive_avg_pool2d(saliency, grid).flatten(1) * pixels_per_patch).cpu()


# ------------------------------------------------------------- one registry, one spec, one entry point


def _attention_maps(model: ViT, images, spec: MapSpec, targets, batch_size: int) -> torch.Tensor:
    """cls and query: the row of the class token (of the query patch) in the last chosen layer, mean
    of the chosen heads."""
    weights = attention_weights(model, images, select_layers(model, spec.layer)[-1:], spec.head, batch_size)
    if spec.method == "query":
        return query_attention_maps(model, weights[0], spec.query_patch).mean(dim=1)
    return cls_attention_maps(model, weights[0]).mean(dim=1)


def _rollout_maps(model: ViT, images, spec: MapSpec, targets, batch_size: int) -> torch.Tensor:
    layers = list(range(select_layers(model, spec.layer)[-1] + 1))
    weights = attention_weights(model, images, layers, batch_size=batch_size)
    rollout = attention_rollout(weights, spec.head_fusion, spec.discard_ratio, model.num_prefix_tokens)
    return pooled_maps(model, rollout)


def _grad_rollout_maps(model: ViT, images, spec: MapSpec, targets, batch_size: int) -> torch.Tensor:
    return pooled_maps(model, gradient_rollout(model, images, targets, batch_size))


def _input_gradient_maps(model: ViT, images, spec: MapSpec, targets, batch_size: int) -> torch.Tensor:
    pairs = zip(images.split(batch_size), targets.split(batch_size), strict=True)
    maps = [input_gradient(model, x, t, model.grid_size) for x, t in pairs]
    return torch.cat(maps).unflatten(-1, model.grid_size)


@dataclass(frozen=True)
class MapMethod:
    """One way to say where a ViT looks at an image: a map over its patches."""

    title: str  # what its maps show, for titles ({patch}, {fusion}, {discard}, {target} filled in)
    scored: str | None  # what `vit-attention score` calls its map (None: not scored)
    layer: bool  # takes a layer: the one drawn, or the last one a rollout goes through
    head: bool  # takes a head
    maps: Callable  # (model, images, spec, targets, batch_size) -> (B, grid_h, grid_w)


MAP_METHODS = {
    "cls": MapMethod(
        "class-token attention", "class-token attention of the last layer, mean of heads",
        layer=True, head=True, maps=_attention_maps,
    ),
    "query": MapMethod("attention of patch {patch}", None, layer=True, head=True, maps=_attention_maps),
    "rollout": MapMethod(
        "attention rollout ({fusion} of heads, discard {discard})",
        "attention rollout (Abnar & Zuidema 2020), mean of heads, rows the head reads",
        layer=True, head=False, maps=_rollout_maps,
    ),
    "grad-rollout": MapMethod(
        "gradient-weighted rollout for the {target} class",
        "gradient-weighted rollout (Chefer et al. 2021) for the predicted class",
        layer=False, head=False, maps=_grad_rollout_maps,
    ),
    "input-gradient": MapMethod(
        "gradient times input for the {target} class",
        "gradient times input, summed over channels and over each patch's pixels",
        layer=False, head=False, maps=_input_gradient_maps,
    ),
}  # fmt: skip
POOLED = {"cls": "class-token", "mean": "mean-pooled-token"}  # what the head reads, for titles


@dataclass(frozen=True)
class MapSpec:
    """Which map: a method of `MAP_METHODS` and its choices (the options of `vit-attention`).
    Made, it is checked for what needs no model; `check(model)` checks it against a model.

    - layer, head: one of each (counted from 0, negative from the last) or None for all (cls and
      query: the map drawn is the last chosen layer's mean over the chosen heads); rollout goes
      through the layers up to `layer`;
    - query_patch: (row, column) of the patch whose attention `query` maps;
    - head_fusion, discard_ratio: how rollout fuses a layer's heads, and the share of each row's
      lowest weights to patches it drops;
    - target: the class grad-rollout and input-gradient explain (None: the predicted one).
    """

    method: str = "cls"
    layer: int | None = None
    head: int | None = None
    query_patch: tuple[int, int] | None = None
    head_fusion: str = "mean"
    discard_ratio: float = 0.0
    target: int | None = None

    def __post_init__(self):
        if self.method not in MAP_METHODS:
            raise UsageError(f"unknown method {self.method!r}; choose one of {', '.join(MAP_METHODS)}")
        if (self.method == "query") != (self.query_patch is not None):
            raise UsageError("--method query needs --query_patch ROW,COLUMN, and only it takes one")
        if self.head is not None and not MAP_METHODS[self.method].head:
            raise UsageError(f"--head does not apply to --method {self.method}: it combines all heads")
        if self.layer is not None and not MAP_METHODS[self.method].layer:
            raise UsageError(f"--layer does not apply to --method {self.method}: it uses every layer")
        check_head_fusion(self.head_fusion)
        if not 0.0 <= self.discard_ratio < 1.0:
            raise UsageError(f"discard_ratio={self.discard_ratio} must lie in [0, 1)")
        if self.query_patch is not None:
            object.__setattr__(self, "query_patch", tuple(self.query_patch))

    def check(self, model: ViT) -> MapSpec:
        """This spec, if `model` has what it names (a class token, the layer, head, patch, class)."""
        if self.method == "cls" and model.cls_token is None:
            others = ", ".join(m for m in MAP_METHODS if m != "cls")
            raise UsageError(f"this model has no class token: use another method ({others})")
        select_layers(model, self.layer), select_heads(model, self.head)  # raise if out of range
        if self.query_patch is not None:
            patch_token(model, self.query_patch)  # raises if outside the grid
        num_classes = getattr(model.head, "out_features", 0)  # 0: a model without a head
        if self.target is not None and not 0 <= self.target < num_classes:
            raise UsageError(f"target={self.target} is not a class of this model (0 to {num_classes - 1})")
        return self


def predicted_classes(model: ViT, images: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """The class the model predicts for each of `images` (B,), in eval mode (no dropout)."""
    with explicit_attention(model, []):  # eval mode, put back afterwards
        return model_outputs(model, images, batch_size).argmax(-1)


def method_maps(
    model: ViT, images: torch.Tensor, spec: MapSpec, targets: torch.Tensor | None = None, batch_size: int = 64
) -> torch.Tensor:
    """The map of `spec` for each of `images` (B, C, H, W): (B, grid_h, grid_w). `targets` (B,): the
    class each image's map explains where the method reads one (grad-rollout, input-gradient);
    None: `spec.target`, else the predicted class."""
    spec.check(model)
    if targets is None:
        if spec.target is not None:
            targets = torch.full((len(images),), spec.target)
        else:
            targets = predicted_classes(model, images, batch_size)
    return MAP_METHODS[spec.method].maps(model, images, spec, targets, batch_size)


@dataclass
class Explanation:
    """What `explain` computed for a batch of images."""

    name: str  # a file stem for the method: cls, query_1_2, rollout, grad_rollout, input_gradient
    maps: torch.Tensor  # (B, grid_h, grid_w): one map per image, the one to draw over it
    title: str  # what `maps` shows
    logits: torch.Tensor  # (B, classes)
    layers: list[int]  # the layers chosen
    heads: list[int]  # the heads chosen
    # cls and query: (layers, B, heads, grid_h, grid_w), a map per layer and head; else None
    layer_head_maps: torch.Tensor | None = None
    what: str = ""  # the method in words, for titles of the per-layer maps
    note: str | None = None  # something the user should know about these maps


def register_share(
    model: ViT, weights: torch.Tensor, layers: list[int], query_patch: tuple[int, int] | None
) -> str:
    """How much of its attention the class token (or the query patch) gives the register tokens
    in the last chosen layer (mean over the heads and images): registers are not patches, so the
    maps leave them out, and this says what they hold."""
    query = 0 if query_patch is None else patch_token(model, query_patch)
    registers = slice(model.num_prefix_tokens - model.num_registers, model.num_prefix_tokens)
    share = float(weights[-1][:, :, query, registers].sum(-1).mean())
    who = "the class token" if query_patch is None else f"patch {tuple(query_patch)}"
    return (
        f"{who} gives {share:.0%} of its attention in layer {layers[-1]} to the "
        f"{model.num_registers} register tokens, which the maps (patches only) leave out"
    )


def explain(
    model: ViT,
    images: torch.Tensor,
    spec: MapSpec = MapSpec(),
    batch_size: int = 64,
    class_names: Sequence[str] | None = None,
) -> Explanation:
    """Where `model` looks in `images` (B, C, H, W), by the map `spec` names (`MapSpec`), with
    titles and the logits. For cls and query also the map of every chosen layer and head, from
    the forward pass that gives the logits; rollouts follow the tokens the head reads
    (`pooled_maps`)."""
    spec.check(model)
    layers, heads = select_layers(model, spec.layer), select_heads(model, spec.head)
    num_classes = getattr(model.head, "out_features", 0)
    names = list(class_names or [str(i) for i in range(num_classes)])
    name, method = spec.method.replace("-", "_"), MAP_METHODS[spec.method]
    if spec.method not in ("cls", "query"):
        with explicit_attention(model, []):  # eval mode, as the attention's forward pass below
            logits = model_outputs(model, images, batch_size)
        targets = logits.argmax(-1) if spec.target is None else torch.full((len(images),), spec.target)
        what = method.title.format(
            fusion=spec.head_fusion,
            discard=spec.discard_ratio,
            target="predicted" if spec.target is None else names[spec.target],
        )
        title = f"{POOLED[model.pool]} {what}" if spec.method != "input-gradient" else what
        if spec.method == "rollout":
            title += f", layers 0 to {layers[-1]}"
        maps = method.maps(model, images, spec, targets, batch_size)
        return Explanation(name, maps, title, logits, layers, heads, what=what)

    # cls and query: every chosen layer and head, and the logits, from one forward pass
    weights, logits = attention_weights(model, images, layers, heads, batch_size, return_logits=True)
    note = None
    if spec.method == "cls":
        per_layer = cls_attention_maps(model, weights)  # (L, B, H, gh, gw)
        if model.pool == "mean":
            note = (
                "this model's head reads the mean of the patch tokens, not the class token; "
                "--method rollout or grad-rollout follow what feeds the head"
            )
    else:
        per_layer = query_attention_maps(model, weights, spec.query_patch)
        name = f"query_{spec.query_patch[0]}_{spec.query_patch[1]}"
    if model.num_registers:
        note = "; ".join(filter(None, [note, register_share(model, weights, layers, spec.query_patch)]))
    what = method.title.format(patch=tuple(spec.query_patch or ()))
    head_text = f"head {heads[0]}" if len(heads) == 1 else "mean of heads"
    return Explanation(
        name, per_layer[-1].mean(dim=1), f"{what}, layer {layers[-1]}, {head_text}", logits,
        layers, heads, per_layer, what, note,
    )  # fmt: skip
