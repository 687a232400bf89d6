"""`vit-attention`: draw where a trained ViT looks, over test images or image files.

    vit-attention --ckpt runs/demo/train/checkpoints/best.ckpt --out attention
    vit-attention --ckpt best.ckpt --method query --query_patch 1,2 --layer -1
    vit-attention --ckpt best.ckpt --method grad-rollout --images photos/ --plots
    vit-attention --model timm:vit_small_patch14_reg4_dinov2 --weights reg4.safetensors --images a/
    vit-attention --ckpt best.ckpt --html            # one page: every layer, head, query and method
    vit-attention --ckpt best.ckpt --datamodule mydm.Pets --data root=photos  # your own data module

The maps come from `vit.interpret.maps.explain`; this command loads (`vit.commands.inputs`), draws
and saves. Image files need only the checkpoint (its `Preparation`: no data module is built) or a
model of another library (`--model`, `vit.pretrained`); test images come from the checkpoint's
data module. The maps, the page and the plots are computed on `--device` (the model moves there;
the library moves the images a chunk at a time and hands the results back on the CPU, where they
are drawn). Every check of the arguments runs before anything is computed or written; a bad one
stops the command with one line `error: ...` and exit status 2 (a bad option or value) or 1 (a
missing or unreadable file), and no output folder is made.

torch, Lightning and matplotlib are imported inside the functions that use them, not at the top:
importing them takes seconds, and `vit-attention --help` needs none of them.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from vit.commands.base import (
    Parser,
    add_data_argument,
    add_device_argument,
    add_images_argument,
    add_source_arguments,
    check_out_folder,
    run_parsed,
)
from vit.commands.inputs import check_counts, check_images, load_inputs, torch_device
from vit.errors import UsageError

if TYPE_CHECKING:
    import torch

    from vit.model import ViT

# The keys of `vit.interpret.maps.HEAD_FUSIONS`, named here so that --help needs no torch (a test
# checks that they match).
HEAD_FUSION_NAMES = ("mean", "max", "min")


def file_tag(stem: str) -> str:
    """An image file's stem as a safe part of a file name: letters, digits, '.', '-', '_' kept,
    anything else '_', at most 40 characters."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", stem)[:40]


def attention(
    *,
    ckpt: Path | None = None,
    model: str | None = None,
    weights: Path | None = None,
    datamodule_class: str | None = None,
    data: dict | None = None,
    images: list[Path] | None = None,
    num_images: int = 8,
    method: str = "cls",
    layer: int | None = None,
    head: int | None = None,
    query_patch: tuple[int, int] | str | None = None,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    target: int | None = None,
    plots: bool = False,
    out: Path = Path("attention"),
    batch_size: int = 64,
    device: str = "auto",
    threads: int | None = None,
    html: str | Path | None = None,
    scores: Path | None = None,
    heads: Path | None = None,
) -> list[Path]:
    """Draw where a trained ViT looks, over image files or test images of its data set.

    Writes `<method>.png` (every image with its map: for cls and query the mean over the chosen
    heads of the last chosen layer) and, for cls and query with more than one layer or head, one
    `<method>_NNN_<image>.png` per image (NNN its position, <image> `test<index>` or the file's
    name) with a row per layer and a column per head. `plots` adds the ViT paper's Figure 7:
    mean_attention_distance.png, pos_embed_similarity.png and embedding_filters.png. The
    options are those of `vit.interpret.maps.explain`, and `vit-attention --help` explains them.
    Test images come from the checkpoint's data module, built as `vit.commands.inputs.load_inputs`
    builds it (`datamodule_class`, `data`). Everything is computed on `device` (auto: cuda where
    PyTorch sees one) and drawn on the CPU.

    `html` writes one self-contained page instead (`vit.explore`: every layer, head, query and
    method, in a browser) to that file, or to `<out>/attention.html` when it is "" (a bare
    --html); the method, query patch, layer and head choose the view it opens on. `scores`: a
    scores.json of `vit-attention score`, whose figures the page shows; `heads`: a heads.json of
    `vit-attention heads`, whose mean-ablation grid the page shows (a click opens a head).
    """
    import torch

    from vit.checkpoint import check_source
    from vit.interpret.figures import batch_figure, layers_heads_figure
    from vit.interpret.maps import MapSpec, explain
    from vit.plot import save_all

    started = time.perf_counter()
    if isinstance(query_patch, str):  # as given on the command line
        query_patch = patch(query_patch)
    check_source(ckpt, model, weights, datamodule_class)
    check_images(model, images, data)
    spec = MapSpec(method, layer, head, query_patch, head_fusion, discard_ratio, target)  # checked
    check_out_folder(out)
    page = None if html is None else page_path(html, out, plots, target)
    if scores is not None:
        scores = read_scores(scores, page)
    if heads is not None:
        heads = read_heads(heads, page)
    check_counts(num_images, batch_size)
    if threads is not None:
        if threads < 1:
            raise UsageError(f"threads={threads} must be at least 1")
        torch.set_num_threads(threads)
    device = torch_device(device)
    inputs = load_inputs(ckpt, model, weights, images, num_images, data, datamodule_class)
    model: ViT = inputs.model.to(device)  # the images follow a chunk at a time, results come back
    batch, labels, names = inputs.images, inputs.labels, inputs.class_names
    if inputs.files is not None:
        captions, tags = [f.name for f in inputs.files], [file_tag(f.stem) for f in inputs.files]
    else:
        captions, tags = [f"test {i}" for i in inputs.indices], [f"test{i}" for i in inputs.indices]
    if page is not None:
        if labels is not None:
            captions = [f"{c}, true {names[y]}" for c, y in zip(captions, labels.tolist(), strict=True)]
        options = dict(scores=scores, head_effects=heads, batch_size=batch_size)
        return [write_page(page, model, batch, spec, captions, names, options, started)]

    found = explain(model, batch, spec, batch_size, names)
    if found.note:
        print(f"note: {found.note}")
    for i, p in enumerate(found.logits.argmax(-1).tolist()):
        truth = "" if labels is None else f"true {names[labels[i]]}\n"
        captions[i] = f"{captions[i]}\n{truth}pred {names[p]}"
    box = None  # the query patch, outlined in every tile
    if query_patch is not None:
        p = model.patch_size
        box = (query_patch[0] * p, query_patch[1] * p, p, p)
    figures = {}  # file name -> figure, saved once everything is computed
    if found.layer_head_maps is not None and len(found.layers) * len(found.heads) > 1:
        for i in range(len(batch)):
            figures[f"{found.name}_{i:03d}_{tags[i]}.png"] = layers_heads_figure(
                batch[i],
                found.layer_head_maps[:, i],
                found.layers,
                found.heads,
                title=f"{found.what}: {captions[i]}".replace("\n", ", "),
                box=box,
            )
    figures[f"{found.name}.png"] = batch_figure(batch, found.maps, captions, title=found.title, box=box)
    if plots:
        figures.update(figure_7(model, batch, batch_size))

    out = Path(out)
    # per-image figures of an earlier run into the same folder, for other images: replaced too
    stale = [p for p in out.glob(f"{found.name}_[0-9][0-9][0-9]_*.png") if p.name not in figures]
    written = save_all(out, figures)
    for path in stale:
        path.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    files = f"{len(written)} PNG file{'s' * (len(written) != 1)}"
    print(f"wrote {files} into {out} for {len(batch)} image{'s' * (len(batch) != 1)} in {seconds:.1f} s:")
    for path in written[:3]:
        print(f"  {path}")
    if len(written) > 3:
        print(f"  ... {len(written) - 3} more")
    if stale:
        print(f"removed {len(stale)} per-image figures of an earlier run ({stale[0].name}, ...)")
    return written


def page_path(html: str | Path, out: str | Path, plots: bool, target: int | None) -> Path:
    """Where --html writes its page (checked before any work): the file named, or
    <out>/attention.html for a bare --html."""
    if plots or target is not None:
        raise UsageError(
            "--html writes one page with every method and the top classes: no --plots or --target"
        )
    path = Path(html) if str(html) else Path(out) / "attention.html"
    if path.is_dir():
        raise UsageError(f"--html {path} is a folder; name the page's file: {path / 'attention.html'}")
    return path


def read_scores(path: str | Path, page: Path | None) -> dict:
    """The figures of a scores.json written by `vit-attention score`, for the page."""
    import json

    from vit.interpret.score import headline

    if page is None:
        raise UsageError("--scores goes with --html: the page shows them")
    try:
        return headline(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        raise FileNotFoundError(f"--scores: file not found: {path}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--scores {path} is not a scores.json of vit-attention score ({e})") from None


def read_heads(path: str | Path, page: Path | None) -> dict:
    """The mean-ablation grid of a heads.json written by `vit-attention heads`, for the page."""
    import json

    if page is None:
        raise UsageError("--heads goes with --html: the page shows them")
    try:
        cells = json.loads(Path(path).read_text())["ablation"]["mean"]["accuracy"]
        values = [[float(cell["mean"]) for cell in row] for row in cells]
        intervals = [[[float(cell["low"]), float(cell["high"])] for cell in row] for row in cells]
    except FileNotFoundError:
        raise FileNotFoundError(f"--heads: file not found: {path}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--heads {path} is not a heads.json of vit-attention heads ({e})") from None
    title = "mean ablation of each head: change in top-1 accuracy (hover: its 95% interval over images)"
    return {"title": title, "values": values, "intervals": intervals}


def write_page(path: Path, model: ViT, batch, spec, captions, names, options: dict, started) -> Path:
    """The page of `vit.explore` for `batch`, written to `path`."""
    from vit.interpret.explore import explore

    found = explore(model, batch, spec, captions, names, **options)
    path = found.save(path)
    seconds, size = time.perf_counter() - started, path.stat().st_size / 1e6
    images = f"{len(batch)} image{'s' * (len(batch) != 1)}"
    print(f"wrote {path} ({size:.1f} MB) for {images} in {seconds:.1f} s: open it in a browser")
    return path


def figure_7(model: ViT, images: torch.Tensor, batch_size: int) -> dict:
    """The three panels of the ViT paper's Figure 7, as figures by file name."""
    from vit.interpret.figures import (
        embedding_filters_figure,
        mean_distance_figure,
        pos_embed_similarity_figure,
    )
    from vit.interpret.maps import (
        embedding_filter_components,
        iter_attention,
        mean_attention_distance,
        pos_embed_similarity,
    )

    distance, count = 0.0, 0
    for weights in iter_attention(model, images, batch_size=batch_size):  # chunk by chunk
        distance = distance + mean_attention_distance(model, weights) * weights.shape[1]
        count += weights.shape[1]
    distances = (distance / count).cpu()  # computed on the model's device, drawn from the CPU
    figures = {"mean_attention_distance.png": mean_distance_figure(distances, model.image_size)}
    if model.pos_embed is not None:
        figures["pos_embed_similarity.png"] = pos_embed_similarity_figure(pos_embed_similarity(model).cpu())
    else:
        print("no pos_embed_similarity.png: the model has no position embeddings")
    if model.config.conv_stem:
        print("no embedding_filters.png: the model's conv_stem lies between pixels and patch projection")
    else:
        components, explained = embedding_filter_components(model)
        figures["embedding_filters.png"] = embedding_filters_figure(components.cpu(), explained.cpu())
    return figures


def patch(text: str) -> tuple[int, int]:
    """ROW,COLUMN -> (row, column)."""
    row, _, column = text.partition(",")
    try:
        return int(row), int(column)
    except ValueError:
        raise UsageError(f"--query_patch {text!r} is not ROW,COLUMN (two integers: 3,0)") from None


def parser() -> Parser:
    parser = Parser(
        prog="vit-attention",
        description=(
            "Draw where a trained ViT looks, over image files or test images of its data set: "
            "<method>.png (every image with its map) and, for cls and query over several layers or "
            "heads, one figure per image with a row per layer and a column per head. "
            "Checkpoints are read without unpickling code; --model draws a ViT of timm or "
            "Hugging Face (registers and other prefix tokens are reported, not drawn)."
        ),
        epilog="To score every method's maps (deletion, insertion, evidence, sanity checks): "
        "vit-attention score --help. Which heads the prediction uses (ablation, logit attribution, "
        "logit lens, high-norm tokens): vit-attention heads --help. Which heads and tokens carry "
        "the class (activation patching): vit-attention patch --help",
    )
    add = parser.add_argument
    add_source_arguments(parser)
    add_data_argument(parser)
    add_images_argument(parser)
    add(
        "--num_images",
        type=int,
        default=8,
        metavar="N",
        help="how many test images to use when no files are given",
    )
    add(
        "--method",
        default="cls",
        help="cls (class token), query (one patch), rollout (Abnar & Zuidema), grad-rollout "
        "(class-specific, Chefer et al.) or input-gradient (gradient times input, per patch)",
    )
    add(
        "--layer",
        type=int,
        default=None,
        help="the block, counted from 0, negative from the last; default all (rollout: up to it)",
    )
    add("--head", type=int, default=None, help="one head; default all, with their mean")
    add(
        "--query_patch",
        type=str,
        default=None,
        metavar="ROW,COLUMN",
        help="the patch whose attention --method query draws",
    )
    add(
        "--head_fusion",
        default="mean",
        help="how rollout combines heads: " + ", ".join(HEAD_FUSION_NAMES),
    )
    add(
        "--discard_ratio",
        type=float,
        default=0.0,
        metavar="R",
        help="rollout drops this share of each row's lowest weights to patches",
    )
    add(
        "--target",
        type=int,
        default=None,
        help="class that grad-rollout and input-gradient explain; default the predicted",
    )
    add(
        "--plots",
        action="store_true",
        help="also draw the mean attention distance, position-embedding "
        "similarity and patch-embedding filters (the ViT paper's Figure 7)",
    )
    add("--out", default="attention", metavar="DIR", help="folder for the PNG files")
    add(
        "--batch_size",
        type=int,
        default=64,
        metavar="N",
        help="images per forward pass (bounds the memory the weights take)",
    )
    add_device_argument(parser)
    add("--threads", type=int, default=None, help="PyTorch CPU threads; default PyTorch's choice")
    add(
        "--html",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="write one self-contained page instead of PNG files, to explore every layer, head, query "
        "patch and method in a browser: PATH, or <out>/attention.html for a bare --html",
    )
    add(
        "--heads",
        default=None,
        metavar="FILE",
        help="with --html: a heads.json of vit-attention heads, whose ablation grid the page shows",
    )
    add(
        "--scores",
        default=None,
        metavar="FILE",
        help="with --html: a scores.json of vit-attention score, whose figures the page shows",
    )
    return parser  # fmt: skip


def main(args: list[str] | None = None) -> None:
    args = sys.argv[1:] if args is None else [str(a) for a in args]
    if args[:1] == ["score"]:  # vit-attention score: how far each method's maps can be trusted
        from vit.commands.score import main as score

        return score(args[1:])
    if args[:1] == ["heads"]:  # vit-attention heads: which heads the prediction uses
        from vit.commands.heads import main as heads

        return heads(args[1:])
    if args[:1] == ["patch"]:  # vit-attention patch: which activations carry what decides the class
        from vit.commands.patch import main as patch

        return patch(args[1:])
    run_parsed(attention, parser(), args)


if __name__ == "__main__":
    main()
