"""The looking-inside figures, drawn with matplotlib: attention overlays, the ViT paper's Figure 7,
and the figures of the maps' scores, the heads and activation patching.

No pyplot state: every function makes a `matplotlib.figure.Figure` (which a notebook shows) and
`vit.plot.save_figure` writes it as PNG. Grids of overlays are blended into one RGB mosaic with torch
and drawn with a single `imshow`, so a figure of many maps costs about as much as a figure of one.
"""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import NullFormatter, ScalarFormatter

TILE_INCHES = 1.3  # drawn size of one image tile
PAD = 2  # pixels of white between tiles of a mosaic


# The compositing below is numpy: on a busy CPU, PyTorch's thread pool makes each of these tiny
# operations cost milliseconds, numpy microseconds.


def _to_rgb(image: torch.Tensor) -> np.ndarray:
    """(C, H, W) -> (H, W, 3) in [0, 1]; one channel becomes grey, more than three keep three."""
    image = image.detach().float().cpu().numpy()
    image = image[:3] if image.shape[0] >= 3 else np.repeat(image[:1], 3, axis=0)
    lo, hi = image.min(), image.max()
    shown = (image - lo) / (hi - lo) if hi - lo > 1e-8 else image.clip(0, 1)  # a flat image stays as is
    return rearrange(shown, "c h w -> h w c")


def _normalize(maps: np.ndarray) -> np.ndarray:
    """Scale each map (..., h, w) to [0, 1] on its own, so every overlay uses the full colormap."""
    lo = maps.min(axis=(-2, -1), keepdims=True)
    hi = maps.max(axis=(-2, -1), keepdims=True)
    return (maps - lo) / np.maximum(hi - lo, 1e-12)


def _upsample(maps: np.ndarray, size: tuple[int, int], mode: str) -> np.ndarray:
    (height, width), (grid_h, grid_w) = size, maps.shape[-2:]
    if mode == "nearest" and height % grid_h == 0 and width % grid_w == 0:  # every patch a block
        return repeat(maps, "... gh gw -> ... (gh p1) (gw p2)", p1=height // grid_h, p2=width // grid_w)
    flat = torch.from_numpy(maps.reshape(-1, 1, grid_h, grid_w))
    return F.interpolate(flat, size=size, mode=mode).numpy().reshape(*maps.shape[:-2], height, width)


def overlay_rgb(
    image: torch.Tensor,
    maps: torch.Tensor,
    cmap: str = "inferno",
    alpha: float = 0.6,
    mode: str = "nearest",
) -> np.ndarray:
    """Blend patch maps (..., grid_h, grid_w) over `image` (C, H, W): (..., H, W, 3) in [0, 1].

    Each map is scaled to [0, 1], upsampled to the image size (`mode` as in F.interpolate:
    "nearest" keeps the patches visible, "bilinear" smooths), coloured with `cmap` and laid over
    the image with opacity `alpha`.
    """
    return (1 - alpha) * _to_rgb(image) + alpha * _coloured(maps, tuple(image.shape[-2:]), cmap, mode)


def _coloured(maps: torch.Tensor, size: tuple[int, int], cmap: str, mode: str) -> np.ndarray:
    """Maps (..., grid_h, grid_w), each scaled to [0, 1], upsampled to `size` and coloured: (..., H, W, 3)."""
    upsampled = _upsample(_normalize(maps.detach().float().cpu().numpy()), size, mode).clip(0, 1)
    return matplotlib.colormaps[cmap](upsampled)[..., :3]


def overlay(
    ax, image: torch.Tensor, patch_map: torch.Tensor, alpha: float = 0.6, cmap: str = "inferno"
) -> None:
    """Draw `image` (C, H, W) with `patch_map` (grid_h, grid_w) upsampled over it on `ax`."""
    ax.imshow(overlay_rgb(image, patch_map, cmap=cmap, alpha=alpha))
    ax.set_xticks([])
    ax.set_yticks([])


def mosaic(tiles: np.ndarray, fill: float = 1.0, gap_below: int = PAD) -> np.ndarray:
    """(rows, cols, H, W, ...) -> one image (rows (H + gap_below), cols (W + PAD), ...)."""
    widths = [(0, 0), (0, 0), (0, gap_below), (0, PAD)] + [(0, 0)] * (tiles.ndim - 4)
    padded = np.pad(tiles, widths, constant_values=fill)
    return rearrange(padded, "r c h w ... -> (r h) (c w) ...")


def mosaic_figure(
    tiles: np.ndarray,
    row_labels: list[str] | None = None,
    col_labels: list[str] | None = None,
    title: str | None = None,
    tile_titles: list[list[str]] | None = None,
    box: tuple[int, int, int, int] | None = None,
    boxed: np.ndarray | None = None,
) -> Figure:
    """A figure of a grid of RGB tiles (rows, cols, H, W, 3), labelled by row and column.

    `box` = (top, left, height, width) in a tile's pixels outlines the same region (a query
    patch) in every tile where the boolean grid `boxed` (rows, cols) is true (all by default).

    The margins are fixed in inches rather than found by a layout engine: drawing once instead
    of twice halves the time to save, which counts when a command writes one figure per image.
    """
    if tiles.shape[2] < 32:  # blow tiny tiles (4x4 filters) up so that gaps and captions fit
        factor = math.ceil(32 / tiles.shape[2])
        box = None if box is None else tuple(v * factor for v in box)
        tiles = repeat(tiles, "r c h w rgb -> r c (h f1) (w f2) rgb", f1=factor, f2=factor)
    rows, cols, height, width = tiles.shape[:4]
    lines = max((t.count("\n") + 1 for row in tile_titles or [] for t in row), default=0)
    caption = 0.12 * lines + 0.04 * bool(lines)  # inches under each tile for its caption
    gap_below = PAD + round(caption * width / TILE_INCHES)
    tile_h = TILE_INCHES * (height + gap_below) / width
    left, top, bottom = (0.75 if row_labels else 0.1), 0.2 + 0.2 * bool(title) + 0.2 * bool(col_labels), 0.1
    size = (left + 0.1 + TILE_INCHES * cols, top + bottom + tile_h * rows)
    fig = Figure(figsize=size)
    ax = fig.add_axes(
        (left / size[0], bottom / size[1], TILE_INCHES * cols / size[0], tile_h * rows / size[1])
    )
    ax.imshow(mosaic(tiles, gap_below=gap_below).clip(0, 1), interpolation="nearest", aspect="auto")
    step_y, step_x = height + gap_below, width + PAD
    ax.set_yticks([step_y * r + height / 2 for r in range(rows)], row_labels or [""] * rows, fontsize=8)
    ax.set_xticks([step_x * (c + 0.5) for c in range(cols)], col_labels or [""] * cols, fontsize=8)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    ax.set_frame_on(False)
    for r, row in enumerate(tile_titles or []):
        for c, text in enumerate(row):
            ax.text(step_x * c + width / 2, step_y * r + height, text, ha="center", va="top", fontsize=6.5)
    if box is not None:
        top, left, box_h, box_w = box
        for r, c in zip(*np.nonzero(np.ones((rows, cols), bool) if boxed is None else boxed), strict=True):
            corner = (step_x * c + left - 0.5, step_y * r + top - 0.5)
            ax.add_patch(Rectangle(corner, box_w, box_h, fill=False, edgecolor="cyan", linewidth=1.2))
    if title:
        fig.suptitle(title, fontsize=9, y=1 - 0.05 / size[1])
    return fig


def layers_heads_figure(
    image: torch.Tensor,
    maps: torch.Tensor,
    layers: list[int],
    heads: list[int],
    title: str | None = None,
    cmap: str = "inferno",
    alpha: float = 0.6,
    box: tuple[int, int, int, int] | None = None,
) -> Figure:
    """One image: a row per layer, the image then the mean over heads then each head.

    `maps` is (layers, heads, grid_h, grid_w); `box` (top, left, height, width) outlines a
    region, such as the query patch, in every tile.
    """
    if len(heads) > 1:
        maps = torch.cat((maps.mean(dim=1, keepdim=True), maps), dim=1)
    overlays = overlay_rgb(image, maps, cmap=cmap, alpha=alpha)  # (L, k, H, W, 3)
    first = np.ones_like(overlays[:, :1])  # the image itself, in the first row only
    first[0, 0] = _to_rgb(image)
    cols = ["image", *(["mean of heads"] if len(heads) > 1 else []), *(f"head {h}" for h in heads)]
    tiles = np.concatenate((first, overlays), axis=1)
    boxed = np.ones(tiles.shape[:2], bool)
    boxed[1:, 0] = False  # blank tiles under the image
    return mosaic_figure(tiles, [f"layer {i}" for i in layers], cols, title, box=box, boxed=boxed)


def batch_figure(
    images: torch.Tensor,
    maps: torch.Tensor,
    titles: list[str] | None = None,
    title: str | None = None,
    columns: int = 8,
    cmap: str = "inferno",
    alpha: float = 0.6,
    box: tuple[int, int, int, int] | None = None,
) -> Figure:
    """Many images in one figure, each with its map (B, grid_h, grid_w) over it, `columns` a row;
    `box` (top, left, height, width) outlines a region, such as the query patch, in each."""
    overlays = np.stack(
        [overlay_rgb(x, m, cmap=cmap, alpha=alpha) for x, m in zip(images, maps, strict=True)]
    )
    n, columns = len(overlays), min(columns, len(overlays))
    rows = math.ceil(n / columns)
    blank = np.ones((rows * columns - n, *overlays.shape[1:]))
    tiles = rearrange(np.concatenate((overlays, blank)), "(r c) h w rgb -> r c h w rgb", c=columns)
    names = [*(titles or [""] * n), *[""] * (rows * columns - n)]
    grid = [names[r * columns : (r + 1) * columns] for r in range(rows)]
    boxed = (np.arange(rows * columns) < n).reshape(rows, columns)
    return mosaic_figure(tiles, title=title, tile_titles=grid if titles else None, box=box, boxed=boxed)


def overlay_grid_figure(
    images: torch.Tensor,
    maps: torch.Tensor,
    row_titles: list[str] | None = None,
    col_titles: list[str] | None = None,
    title: str | None = None,
    alpha: float = 0.6,
) -> Figure:
    """One row per image: the image, then one overlay per map. `maps` is (images, maps, gh, gw)."""
    overlays = np.stack([overlay_rgb(x, m, alpha=alpha) for x, m in zip(images, maps, strict=True)])
    plain = np.stack([_to_rgb(x) for x in images])[:, None]
    tiles = np.concatenate((plain, overlays), axis=1)
    return mosaic_figure(tiles, row_titles, ["image", *(col_titles or [])], title)


def mean_distance_figure(distances: torch.Tensor, image_size: tuple[int, int] | None = None) -> Figure:
    """ViT paper Figure 7 (right): mean attention distance (pixels) of every head against depth.

    `distances` is (layers, heads); each head is one dot, coloured by its index.
    """
    layers, heads = distances.shape
    fig = Figure(figsize=(4.2, 3.4), layout="constrained")
    ax = fig.subplots()
    colours = matplotlib.colormaps["tab10"]
    for h in range(heads):
        ax.scatter(range(layers), distances[:, h].tolist(), s=18, color=colours(h % 10), label=f"head {h}")
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xticks(range(layers))
    if image_size is not None:
        ax.set_ylim(0, math.hypot(*image_size) / 2)  # half the diagonal: an easy scale to read
    if heads <= 12:
        ax.legend(fontsize=7, ncols=2)
    return fig


def pos_embed_similarity_figure(similarity: torch.Tensor) -> Figure:
    """ViT paper Figure 7 (centre): tile (r, c) shows the cosine similarity of the position
    embedding of the patch at row r, column c with every other patch's. `similarity` is
    (grid_h, grid_w, grid_h, grid_w)."""
    grid_h, grid_w = similarity.shape[:2]
    picture = mosaic(similarity.detach().float().cpu().numpy(), fill=float("nan"))
    fig = Figure(figsize=(0.9 + 0.45 * grid_w, 0.6 + 0.45 * grid_h), layout="constrained")
    ax = fig.subplots()
    shown = ax.imshow(picture, cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    step_y, step_x = similarity.shape[2] + PAD, similarity.shape[3] + PAD
    ax.set_xticks([step_x * (c + 0.5) for c in range(grid_w)], range(1, grid_w + 1), fontsize=7)
    ax.set_yticks([step_y * (r + 0.5) for r in range(grid_h)], range(1, grid_h + 1), fontsize=7)
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    ax.tick_params(length=0)
    fig.colorbar(shown, ax=ax, shrink=0.8, label="cosine similarity")
    return fig


def embedding_filters_figure(components: torch.Tensor, explained: torch.Tensor, columns: int = 7) -> Figure:
    """ViT paper Figure 7 (left): principal components of the patch-embedding filters as tiles,
    each scaled to [0, 1] on its own (RGB for 3 channels, grey for 1); titles give the share of
    the filters' variance each explains. `components` is (k, channels, window, window)."""
    tiles = np.stack([_to_rgb(c) for c in components])
    n, columns = len(tiles), min(columns, len(tiles))
    rows = math.ceil(n / columns)
    tiles = np.concatenate((tiles, np.ones((rows * columns - n, *tiles.shape[1:]))))
    names = [f"{100 * e:.1f}%" for e in explained.tolist()] + [""] * (rows * columns - n)
    grid = [names[r * columns : (r + 1) * columns] for r in range(rows)]
    tiles = rearrange(tiles, "(r c) h w rgb -> r c h w rgb", c=columns)
    return mosaic_figure(tiles, title="principal components of the patch-embedding filters", tile_titles=grid)


METHOD_COLOURS = {
    "cls": "tab:blue",
    "rollout": "tab:orange",
    "grad-rollout": "tab:green",
    "input-gradient": "tab:purple",
    "random": "grey",
    "evidence": "black",
}


def perturbation_figure(results: dict, measure: str = "probability") -> Figure:
    """Deletion and insertion curves of every method: `measure` (probability of the explained
    class, or accuracy) against the share of patches replaced."""
    fractions = np.array(results["counts"]) / results["patches"]
    fig = Figure(figsize=(8.4, 3.6), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for ax, curve, better in zip(axes, ("deletion", "insertion"), ("lower", "higher"), strict=True):
        for method, curves in results["curves"].items():
            auc = results["figures"][method][f"{curve}_auc_{measure}"]["mean"]
            ax.plot(fractions, curves[f"{curve}/{measure}"], marker=".", color=METHOD_COLOURS.get(method),
                    label=f"{method} ({auc:.3f})")  # fmt: skip
        order = "most" if curve == "deletion" else "least"
        ax.set_title(
            f"{curve}: {order} relevant replaced first\n(area in brackets, {better} is better)", fontsize=9
        )
        ax.set_xlabel("share of patches replaced by the mean colour")
        ax.set_xlim(0, 1)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("probability of the explained class" if measure == "probability" else "top-1 accuracy")
    return fig


def evidence_figure(results: dict) -> Figure:
    """Relevance mass, rank accuracy and pointing game per method, with their intervals and the
    share of patches that are evidence (what a map that knows nothing scores on average)."""
    names = ("relevance_mass", "rank_accuracy", "pointing_game")
    methods = [m for m in results["figures"] if "relevance_mass" in results["figures"][m]]
    fig = Figure(figsize=(9.6, 3.4), layout="constrained")
    for ax, name in zip(fig.subplots(1, 3, sharey=True), names, strict=True):
        values = [results["figures"][m][name] for m in methods]
        means = np.array([v["mean"] for v in values])
        errors = np.array([[v["mean"] - v["low"], v["high"] - v["mean"]] for v in values]).T
        ax.bar(
            methods, means, yerr=errors, capsize=3, color=[METHOD_COLOURS.get(m, "tab:cyan") for m in methods]
        )
        ax.axhline(results["evidence_share"], color="red", linestyle="--", linewidth=1, label="chance")
        ax.set_title(name.replace("_", " "), fontsize=9)
        ax.set_ylim(0, 1)
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    ax.legend(fontsize=7)
    return fig


def randomisation_figure(results: dict) -> Figure:
    """Rank correlation of each method's maps with the trained model's as the head and then the
    blocks from the last down are re-initialised (Adebayo et al. 2018's cascading randomisation)."""
    fig = Figure(figsize=(6.4, 3.8), layout="constrained")
    ax = fig.subplots()
    for method, steps in results["randomisation"].items():
        x = np.arange(len(steps) + 1)
        means = [1.0] + [s["mean"] for s in steps]
        low = [1.0] + [s["low"] for s in steps]
        high = [1.0] + [s["high"] for s in steps]
        ax.plot(x, means, marker="o", color=METHOD_COLOURS.get(method), label=method)
        ax.fill_between(x, low, high, color=METHOD_COLOURS.get(method), alpha=0.2)
    labels = ["trained"] + [s["step"] for s in next(iter(results["randomisation"].values()))]
    ax.set_xticks(np.arange(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_ylabel("Spearman correlation with the trained maps")
    ax.set_title("model-parameter randomisation: a map that explains the training falls", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def layers_heads_evidence_figure(results: dict, figure: str = "relevance_mass") -> Figure:
    """`figure` per layer (rows) and head (columns) of the class token's and the evidence
    patches' attention maps, against the share of patches that are evidence."""
    maps = [k.split("/")[0] for k in results["layers_heads"] if k.endswith(figure)]
    fig = Figure(figsize=(3.4 * len(maps) + 0.8, 3.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(maps)))
    titles = {"cls": "class token", "query": "evidence patches to the other patches"}
    for ax, name in zip(axes, maps, strict=True):
        values = np.array(
            [[h["mean"] for h in layer] for layer in results["layers_heads"][f"{name}/{figure}"]]
        )
        shown = ax.imshow(values, cmap="viridis", vmin=0, vmax=1)
        for (row, col), v in np.ndenumerate(values):
            ax.text(
                col,
                row,
                f"{v:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="white" if v < 0.6 else "black",
            )
        ax.set_xticks(range(values.shape[1]))
        ax.set_yticks(range(values.shape[0]))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{figure.replace('_', ' ')}: {titles.get(name, name)}", fontsize=9)
    fig.colorbar(shown, ax=axes, shrink=0.8, label=f"chance {results['evidence_share']:.2f}")
    return fig


# ------------------------------------------------------------------------ the heads of vit.heads


def _layers_heads_map(ax, values: np.ndarray, title: str):
    """A layers x heads map of `values`, diverging around zero, each cell written in."""
    bound = float(np.abs(values).max()) or 1.0  # all zero: a neutral map
    shown = ax.imshow(values, cmap="RdBu_r", vmin=-bound, vmax=bound)
    for (row, col), v in np.ndenumerate(values):
        ax.text(col, row, f"{v:.2f}", ha="center", va="center", fontsize=7,
                color="white" if abs(v) > 0.6 * bound else "black")  # fmt: skip
    ax.set_xticks(range(values.shape[1]))
    ax.set_yticks(range(values.shape[0]))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    return shown


def _means(table: list[list[dict]]) -> np.ndarray:
    return np.array([[cell["mean"] for cell in row] for row in table])


def ablation_figure(results: dict, kind: str) -> Figure:
    """The change in accuracy and in the log-probability of the predicted class when each head
    alone is ablated (`kind`: mean or zero), per layer (rows) and head (columns)."""
    ablation = results["ablation"][kind]
    size = (2 * (0.5 * results["heads"] + 2.4), 0.4 * results["layers"] + 1.6)
    fig = Figure(figsize=size, layout="constrained")
    for ax, measure in zip(fig.subplots(1, 2), ("accuracy", "log_probability"), strict=True):
        title = f"{kind} ablation:\nchange in {measure.replace('_', '-')}"
        fig.colorbar(_layers_heads_map(ax, _means(ablation[measure]), title), ax=ax, shrink=0.8)
    return fig


def attribution_figure(results: dict) -> Figure:
    """Each head's direct contribution to the predicted class's logit, per layer and head."""
    fig = Figure(figsize=(0.5 * results["heads"] + 3.2, 0.4 * results["layers"] + 1.6), layout="constrained")
    ax = fig.subplots()
    shown = _layers_heads_map(ax, _means(results["attribution"]["heads"]), "direct logit attribution")
    fig.colorbar(shown, ax=ax, shrink=0.8, label="added to the predicted logit")
    return fig


def logit_lens_figure(results: dict) -> Figure:
    """Accuracy of the class read from the residual stream after each block, with its interval,
    against the model's; and per patch, where the head reads the patches' mean."""
    lens = results["logit_lens"]
    patches = "patches" in lens
    fig = Figure(figsize=(8.4 if patches else 4.6, 3.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, 2 if patches else 1))
    layers = np.arange(results["layers"])
    accuracy = lens["accuracy"]
    axes[0].plot(layers, [a["mean"] for a in accuracy], marker="o", label="logit lens")
    axes[0].fill_between(layers, [a["low"] for a in accuracy], [a["high"] for a in accuracy], alpha=0.2)
    axes[0].axhline(results["accuracy"]["mean"], color="grey", linestyle="--", linewidth=1, label="the model")
    axes[0].set_xticks(layers)
    axes[0].set_xlabel("after block")
    axes[0].set_ylabel(f"top-1 accuracy (against {results['against']})")
    axes[0].set_ylim(0, 1.05)
    axes[0].set_title("logit lens", fontsize=9)
    axes[0].legend(fontsize=7)
    if patches:
        shown = axes[1].imshow(np.array(lens["patches"]), cmap="viridis", vmin=0, vmax=1, aspect="auto")
        axes[1].set_yticks(layers)
        axes[1].set_xlabel("patch")
        axes[1].set_ylabel("after block")
        axes[1].set_title("each patch token read alone", fontsize=9)
        fig.colorbar(shown, ax=axes[1], shrink=0.8, label="accuracy")
    return fig


def token_norms_figure(results: dict) -> Figure:
    """Per layer, token norms over the median patch-token norm: the largest patch's, and each kind
    of prefix token's, against the ratio above which a token counts as high-norm."""
    norms = results["norms"]
    layers = np.arange(results["layers"])
    fig = Figure(figsize=(5.2, 3.4), layout="constrained")
    ax = fig.subplots()
    lines = [("max_patch_ratio", "largest patch")] + [(f"{k}_ratio", k) for k in norms["token_kinds"]]
    for key, label in lines:
        ax.plot(layers, [row[key]["mean"] for row in norms["layers"]], marker="o", label=label)
    ax.axhline(norms["norm_ratio"], color="red", linestyle="--", linewidth=1, label="high-norm above")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_yscale("log", base=2)  # ticks at 1, 2, 4, 8, ...
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(layers)
    ax.set_xlabel("after block")
    ax.set_ylabel("norm / median patch-token norm")
    ax.set_title("token norms (mean over images)", fontsize=9)
    ax.legend(fontsize=7)
    return fig


# ----------------------------------------------------------------- activation patching (vit.patching)


def patching_figure(results: dict) -> Figure:
    """The share of the logit difference each head's output restores when patched alone, per
    layer (rows) and head (columns)."""
    fig = Figure(figsize=(0.5 * results["heads"] + 3.2, 0.4 * results["layers"] + 1.6), layout="constrained")
    ax = fig.subplots()
    shown = _layers_heads_map(ax, _means(results["restored"]["heads"]), "activation patching: heads")
    fig.colorbar(shown, ax=ax, shrink=0.8, label="share restored (1: all)")
    return fig


def patching_tokens_figure(image: torch.Tensor, results: dict) -> Figure:
    """Per layer, the share each patch token of the residual stream restores (mean over pairs)
    over `image` (C, H, W), each layer's map scaled on its own."""
    means = _means(results["restored"]["tokens"])[:, results["prefix_tokens"] :]
    maps = torch.from_numpy(np.nan_to_num(means)).view(len(means), *results["grid"])
    titles = [f"after block {layer}" for layer in range(len(means))]
    title = "activation patching: patch tokens (each layer scaled to its own range)"
    return batch_figure(image.expand(len(means), *image.shape), maps, titles, title, columns=6)


# ---- the maps while a model trains (vit.interpret.watching.AttentionMaps)


def training_maps(
    images: torch.Tensor,
    maps: dict[str, torch.Tensor],
    columns: list[str],
    title: str,
    notes: dict[str, list[str]] | None = None,
    tile: int = 96,
    alpha: float = 0.6,
) -> np.ndarray:
    """Maps while a model trains, as an RGB picture (H, W, 3) uint8: a row of `images` (B, C, H, W)
    (a validation's images, or one image at several moments) with a `columns` caption above each,
    then a row per method of `maps` ({method: (B, grid_h, grid_w)}), `title` on top; `notes`
    ({method: a short text per image}) go in a corner of the method's tiles; each map is laid over
    its image with opacity `alpha`, as `overlay_rgb` lays it. Small images are blown up to tiles of
    at least `tile` pixels. Composed with numpy and Pillow, not matplotlib:
    it is drawn at every validation, where a matplotlib figure costs ten times as much."""
    from PIL import Image, ImageDraw

    plain = np.stack([_to_rgb(x) for x in images])  # (B, H, W, 3)
    # every map coloured at once (one call of the colormap), then laid over its image as overlay_rgb does
    coloured = _coloured(torch.stack(list(maps.values())), tuple(images.shape[-2:]), "inferno", "nearest")
    rows = np.concatenate((plain[None], (1 - alpha) * plain + alpha * coloured))  # (1 + methods, B, H, W, 3)
    scale = max(1, math.ceil(tile / images.shape[-1]))
    tiles = repeat(rows, "r c h w rgb -> r c (h s1) (w s2) rgb", s1=scale, s2=scale)
    height, width = tiles.shape[2:4]
    left, top, line = 96, 30, 12  # pixels: the row names' column, the title and captions, a text line
    grid = (mosaic(tiles) * 255).round().astype(np.uint8)
    title_width = round(ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength(title)) + 8
    canvas = Image.new("RGB", (max(left + grid.shape[1], title_width), top + grid.shape[0]), "white")
    canvas.paste(Image.fromarray(grid), (left, top))
    draw = ImageDraw.Draw(canvas)
    draw.text((4, 2), title, fill="black")
    step_y, step_x = height + PAD, width + PAD
    for c, caption in enumerate(columns):
        draw.text((left + step_x * c + 2, top - line - 2), caption[: width // 6], fill="black")
    for r, name in enumerate(["image", *maps]):
        draw.text((4, top + step_y * r + height // 2 - line // 2), name, fill="black")
    for r, method in enumerate(maps, start=1):
        for c, note in enumerate((notes or {}).get(method, [])):
            corner = (left + step_x * c + 2, top + step_y * r + height - line - 2)
            draw.rectangle(draw.textbbox(corner, note), fill="black")
            draw.text(corner, note, fill="white")
    return np.asarray(canvas)
