"""`vit-attention`: draw where a trained ViT looks, over test images or image files.

    vit-attention --ckpt runs/demo/train/checkpoints/best.ckpt --out attention
    vit-attention --ckpt best.ckpt --method query --query-patch 1,2 --layer -1
    vit-attention --ckpt best.ckpt --method grad-rollout --images photos/ --plots

Every check of the arguments runs before anything is computed or written; a bad one stops the
command with one line `error: ...` and a non-zero exit, and no output folder is made.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import torch
from jsonargparse import ArgumentParser, auto_cli
from PIL import Image
from torch.utils.data import DataLoader, Subset

from vit.attention import (
    HEAD_FUSIONS,
    attention_rollout,
    attention_weights,
    cls_attention_maps,
    embedding_filter_components,
    gradient_rollout,
    iter_attention,
    mean_attention_distance,
    patch_token,
    pooled_maps,
    pos_embed_similarity,
    query_attention_maps,
    select_heads,
    select_layers,
)
from vit.checkpoint import load_checkpoint
from vit.cli import OneLineErrors
from vit.evaluate import preprocess_file
from vit.images import to_float, to_pixels
from vit.model import ViT
from vit.plot import (
    batch_figure,
    embedding_filters_figure,
    layers_heads_figure,
    mean_distance_figure,
    pos_embed_similarity_figure,
    save_all,
)

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
METHOD_NAMES = {  # method -> what its maps show, for titles
    "cls": "class-token attention",
    "query": "attention of patch {patch}",
    "rollout": "attention rollout ({fusion} of heads, discard {discard})",
    "grad-rollout": "gradient-weighted rollout for the {target} class",
}

POOLED = {"cls": "class-token", "mean": "mean-pooled-token"}  # what the head reads, for titles


def spread_test_images(datamodule, n: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """`n` test images spread evenly over the test split (image folders list theirs class by
    class, so the first `n` would often be one class), their labels and their indices."""
    datamodule.setup("test")
    loader = datamodule.test_dataloader()
    size = len(loader.dataset)
    if size == 0:
        raise ValueError("the data module's test split is empty; give --images")
    indices = sorted(set(torch.linspace(0, size - 1, min(n, size)).round().long().tolist()))
    chosen = Subset(loader.dataset, indices)
    images, labels = next(iter(DataLoader(chosen, batch_size=len(indices), collate_fn=loader.collate_fn)))
    return images, labels, indices


def image_files(paths: list[Path]) -> list[Path]:
    """The files named, and the image files in the folders named (sorted), in order."""
    files = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise FileNotFoundError(f"no image files ({', '.join(sorted(IMAGE_SUFFIXES))}) in {path}")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"image not found: {path}")
    return files


def load_images(files: list[Path], model: ViT, datamodule=None) -> torch.Tensor:
    """Image files -> (N, C, H, W) in [0, 1], prepared as the checkpoint's data module prepares its
    test images (`preprocess`: Fashion-MNIST pads, folders resize); without a data module,
    converted to the model's channels and resized to its image size."""
    if hasattr(datamodule, "preprocess"):
        return torch.cat([preprocess_file(datamodule, file) for file in files])
    mode = {1: "L", 3: "RGB"}.get(model.in_channels)
    if mode is None:
        raise ValueError("image files can only feed models of 1 or 3 channels")
    images = []
    for file in files:
        try:
            with Image.open(file) as picture:
                images.append(to_pixels(picture, mode, model.image_size))
        except (OSError, Image.DecompressionBombError) as e:
            raise ValueError(f"cannot read image {file}: {e}") from e
    return to_float(torch.stack(images))


def file_tag(stem: str) -> str:
    """An image file's stem as a safe part of a file name: letters, digits, '.', '-', '_' kept,
    anything else '_', at most 40 characters."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", stem)[:40]


def _check(
    method: str, layer, head, query_patch, head_fusion: str, discard_ratio: float, num_images, batch_size
) -> None:
    """Checks that need no checkpoint."""
    if method not in METHOD_NAMES:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHOD_NAMES)}")
    if (method == "query") != (query_patch is not None):
        raise ValueError("--method query needs --query-patch ROW,COLUMN, and only it takes one")
    if head is not None and method not in ("cls", "query"):
        raise ValueError(f"--head does not apply to --method {method}: rollout combines all heads")
    if layer is not None and method == "grad-rollout":
        raise ValueError("--layer does not apply to --method grad-rollout: it uses every layer")
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"unknown head_fusion {head_fusion!r}; choose one of {', '.join(HEAD_FUSIONS)}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio={discard_ratio} must lie in [0, 1)")
    if num_images < 1 or batch_size < 1:
        raise ValueError(f"num_images={num_images} and batch_size={batch_size} must be at least 1")


def attention(
    *,
    ckpt: Path,
    images: list[Path] | None = None,
    num_images: int = 8,
    method: str = "cls",
    layer: int | None = None,
    head: int | None = None,
    query_patch: tuple[int, int] | None = None,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    target: int | None = None,
    plots: bool = False,
    out: Path = Path("attention"),
    batch_size: int = 64,
    threads: int | None = None,
) -> list[Path]:
    """Draw where a trained ViT looks, over image files or test images of its data set.

    Writes `<method>.png` (every image with its map: for cls and query the mean over the chosen
    heads of the last chosen layer) and, for cls and query with more than one layer or head, one
    `<method>_NNN_<image>.png` per image (NNN its position, <image> `test<index>` or the file's
    name) with a row per layer and a column per head. `--plots` adds the
    ViT paper's Figure 7: mean_attention_distance.png, pos_embed_similarity.png and
    embedding_filters.png.

    Args:
        ckpt: checkpoint written by vit-train (loaded without unpickling code).
        images: image files or folders of them; default: test images of the checkpoint's data set.
        num_images: how many test images to use when no files are given.
        method: cls (class token), query (one patch), rollout (Abnar & Zuidema) or grad-rollout
            (class-specific, Chefer et al.).
        layer: the block, counted from 0, negative from the last; default all (rollout: up to it).
        head: one head; default all, with their mean.
        query_patch: ROW,COLUMN of the patch whose attention --method query draws.
        head_fusion: how rollout combines heads: mean, max or min.
        discard_ratio: rollout drops this share of each row's lowest weights to patches.
        target: class that grad-rollout explains; default the predicted class.
        plots: also draw the mean attention distance, position-embedding similarity and
            patch-embedding filter plots (a bare --plots means true).
        out: folder for the PNG files.
        batch_size: images per forward pass (bounds the memory the weights take).
        threads: PyTorch CPU threads; default PyTorch's choice.
    """
    started = time.perf_counter()
    _check(method, layer, head, query_patch, head_fusion, discard_ratio, num_images, batch_size)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads={threads} must be at least 1")
        torch.set_num_threads(threads)
    classifier, datamodule = load_checkpoint(ckpt, need_data=not images)  # files need no data set
    if not isinstance(classifier.model, ViT):
        raise ValueError(f"{ckpt} holds a {type(classifier.model).__name__}, not a ViT: it has no attention")
    model: ViT = classifier.model
    layers = select_layers(model, layer)
    heads = select_heads(model, head)
    if query_patch is not None:
        patch_token(model, query_patch)  # raises if outside the grid
    num_classes = classifier.hparams.num_classes
    if target is not None and not 0 <= target < num_classes:
        raise ValueError(f"target={target} is not a class of this model (0 to {num_classes - 1})")
    names = list(getattr(datamodule, "classes", None) or [str(i) for i in range(num_classes)])

    if images:
        files = image_files(images)
        batch, labels = load_images(files, model, datamodule), None
        captions = [f.name for f in files]
        tags = [file_tag(f.stem) for f in files]
    else:
        if datamodule is None:
            raise ValueError(f"{ckpt} names no data module to take test images from; give --images")
        batch, labels, indices = spread_test_images(datamodule, num_images)
        captions = [f"test {i}" for i in indices]
        tags = [f"test{i}" for i in indices]

    # the forward pass that gives the weights gives the predictions too (grad-rollout needs its
    # own pass with gradients: one layer here is enough)
    chosen = {"rollout": list(range(layers[-1] + 1)), "grad-rollout": layers[-1:]}.get(method, layers)
    weights, logits = attention_weights(model, batch, chosen, heads, batch_size, return_logits=True)
    predicted = logits.argmax(-1)
    for i, p in enumerate(predicted.tolist()):
        truth = "" if labels is None else f"true {names[labels[i]]}\n"
        captions[i] = f"{captions[i]}\n{truth}pred {names[p]}"

    figures = {}  # file name -> figure, saved once everything is computed
    name = method.replace("-", "_")
    box = None  # the query patch, outlined in every tile
    if method in ("cls", "query"):  # weights: (L, B, H, T, T)
        if method == "cls":
            maps = cls_attention_maps(model, weights)  # (L, B, H, gh, gw)
            if model.pool == "mean":
                print(
                    "note: this model's head reads the mean of the patch tokens, not the class token; "
                    "--method rollout or grad-rollout follow what feeds the head"
                )
        else:
            maps = query_attention_maps(model, weights, query_patch)
            name = f"query_{query_patch[0]}_{query_patch[1]}"
            p = model.patch_size
            box = (query_patch[0] * p, query_patch[1] * p, p, p)
        what = METHOD_NAMES[method].format(patch=tuple(query_patch or ()))
        head_text = f"head {heads[0]}" if len(heads) == 1 else "mean of heads"
        summary = maps[-1].mean(dim=1)
        summary_title = f"{what}, layer {layers[-1]}, {head_text}"
        if len(layers) * len(heads) > 1:
            for i in range(len(batch)):
                figures[f"{name}_{i:03d}_{tags[i]}.png"] = layers_heads_figure(
                    batch[i],
                    maps[:, i],
                    layers,
                    heads,
                    title=f"{what}: {captions[i]}".replace("\n", ", "),
                    box=box,
                )
    elif method == "rollout":
        last = layers[-1]  # rollout through this layer, the last by default
        rollout = attention_rollout(weights, head_fusion, discard_ratio, model.num_prefix_tokens)
        summary = pooled_maps(model, rollout)
        what = METHOD_NAMES[method].format(fusion=head_fusion, discard=discard_ratio)
        summary_title = f"{POOLED[model.pool]} {what}, layers 0 to {last}"
    else:  # grad-rollout
        targets = predicted if target is None else target
        relevance = gradient_rollout(model, batch, targets, batch_size)
        summary = pooled_maps(model, relevance)
        what = METHOD_NAMES[method].format(target="predicted" if target is None else names[target])
        summary_title = f"{POOLED[model.pool]} {what}"
    figures[f"{name}.png"] = batch_figure(batch, summary, captions, title=summary_title, box=box)

    if plots:
        figures.update(figure_7(model, batch, batch_size))

    out = Path(out)
    # per-image figures of an earlier run into the same folder, for other images: replaced too
    stale = [p for p in out.glob(f"{name}_[0-9][0-9][0-9]_*.png") if p.name not in figures]
    written = save_all(out, figures)
    for path in stale:
        path.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    print(f"wrote {len(written)} PNG files into {out} for {len(batch)} images in {seconds:.1f} s:")
    for path in written[:3]:
        print(f"  {path}")
    if len(written) > 3:
        print(f"  ... {len(written) - 3} more")
    if stale:
        print(f"removed {len(stale)} per-image figures of an earlier run ({stale[0].name}, ...)")
    return written


def figure_7(model: ViT, images: torch.Tensor, batch_size: int) -> dict:
    """The three panels of the ViT paper's Figure 7, as figures by file name."""
    distance, count = 0.0, 0
    for weights in iter_attention(model, images, batch_size=batch_size):  # chunk by chunk
        distance = distance + mean_attention_distance(model, weights) * weights.shape[1]
        count += weights.shape[1]
    figures = {"mean_attention_distance.png": mean_distance_figure(distance / count, model.image_size)}
    if model.pos_embed is not None:
        figures["pos_embed_similarity.png"] = pos_embed_similarity_figure(pos_embed_similarity(model))
    else:
        print("no pos_embed_similarity.png: the model has no position embeddings")
    figures["embedding_filters.png"] = embedding_filters_figure(*embedding_filter_components(model))
    return figures


class OneLineParser(OneLineErrors, ArgumentParser):
    """vit-attention's parser: one-line errors, as vit-train's."""

    help_command = "vit-attention"


def shell_style(args: list[str]) -> list[str]:
    """Accept the spellings a shell user types and pass jsonargparse what it parses:
    `--query-patch` = `--query_patch`; a bare `--plots` = `--plots true`;
    `--images a.png dir/` = `--images '["a.png", "dir/"]'`; `--query_patch 1,2` = `[1, 2]`."""
    fixed: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("--"):
            fixed.append(arg)
            continue
        option, equals, value = arg.partition("=")
        option = "--" + option[2:].replace("-", "_")
        values = [value] if equals else []
        while not equals and i < len(args) and not args[i].startswith("--"):
            values.append(args[i])  # every word up to the next option
            i += 1
        if option == "--plots" and not values:
            values = ["true"]
        elif option == "--images" and values and not values[0].startswith("["):
            values = [json.dumps(values)]
        elif option == "--query_patch" and len(values) == 1 and "," in values[0] and "[" not in values[0]:
            values = [f"[{values[0]}]"]
        fixed += [option, *values]
    return fixed


def main(args: list[str] | None = None) -> None:
    args = shell_style(sys.argv[1:] if args is None else args)
    try:
        auto_cli(attention, args=args, parser_class=OneLineParser)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
