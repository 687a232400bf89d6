"""`vit-attention`: draw where a trained ViT looks, over test images or image files.

    vit-attention --ckpt runs/demo/train/checkpoints/best.ckpt --out attention
    vit-attention --ckpt best.ckpt --method query --query_patch 1,2 --layer -1
    vit-attention --ckpt best.ckpt --method grad-rollout --images photos/ --plots
    vit-attention --model timm:vit_small_patch14_reg4_dinov2 --weights reg4.safetensors --images a/
    vit-attention --ckpt best.ckpt --html            # one page: every layer, head, query and method
    vit-attention --ckpt best.ckpt --datamodule mydm.Pets --data root=photos  # your own data module

The maps come from `vit.interpret.maps.explain`; this command loads (`vit.commands.base.Images`), draws
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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vit.commands import heads, score
from vit.commands import patch as patch_command
from vit.commands.base import Command, Images, check_out_folder, option, out_option
from vit.errors import UsageError

if TYPE_CHECKING:
    import torch

    from vit.commands.base import Inputs
    from vit.interpret.maps import Explanation, MapSpec
    from vit.model import ViT

# The keys of `vit.interpret.maps.HEAD_FUSIONS`, named here so that --help needs no torch (a test
# checks that they match).
HEAD_FUSION_NAMES = ("mean", "max", "min")


def file_tag(stem: str) -> str:
    """An image file's stem as a safe part of a file name: letters, digits, '.', '-', '_' kept,
    anything else '_', at most 40 characters."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", stem)[:40]


def patch(text: str) -> tuple[int, int]:
    """ROW,COLUMN -> (row, column)."""
    row, _, column = text.partition(",")
    try:
        return int(row), int(column)
    except ValueError:
        raise UsageError(f"--query_patch {text!r} is not ROW,COLUMN (two integers: 3,0)") from None


@dataclass
class AttentionOptions(Images):
    """The options of vit-attention: `Images` (the network and the images) and the map to draw,
    the options of `vit.interpret.maps.MapSpec`, which `vit-attention --help` explains."""

    num_images: int = option(8, "how many test images to use when no files are given", type=int, metavar="N")
    batch_size: int = option(
        64, "images per forward pass (bounds the memory the weights take)", type=int, metavar="N"
    )
    method: str = option(
        "cls",
        "cls (class token), query (one patch), rollout (Abnar & Zuidema), grad-rollout "
        "(class-specific, Chefer et al.) or input-gradient (gradient times input, per patch)",
    )
    layer: int | None = option(
        None, "the block, counted from 0, negative from the last; default all (rollout: up to it)", type=int
    )
    head: int | None = option(None, "one head; default all, with their mean", type=int)
    query_patch: tuple[int, int] | str | None = option(
        None, "the patch whose attention --method query draws", type=str, metavar="ROW,COLUMN"
    )
    head_fusion: str = option("mean", "how rollout combines heads: " + ", ".join(HEAD_FUSION_NAMES))
    discard_ratio: float = option(
        0.0, "rollout drops this share of each row's lowest weights to patches", type=float, metavar="R"
    )
    target: int | None = option(
        None, "class that grad-rollout and input-gradient explain; default the predicted", type=int
    )
    plots: bool = option(
        False,
        "also draw the mean attention distance, position-embedding similarity and patch-embedding "
        "filters (the ViT paper's Figure 7)",
        action="store_true",
    )
    out: str = out_option("attention", "the PNG files")
    threads: int | None = option(None, "PyTorch CPU threads; default PyTorch's choice", type=int)
    html: str | None = option(
        None,
        "write one self-contained page instead of PNG files, to explore every layer, head, query "
        "patch and method in a browser: PATH, or <out>/attention.html for a bare --html",
        nargs="?",
        const="",
        metavar="PATH",
    )
    heads: str | None = option(
        None, "with --html: a heads.json of vit-attention heads to show", metavar="FILE"
    )
    scores: str | None = option(
        None, "with --html: a scores.json of vit-attention score to show", metavar="FILE"
    )

    def spec(self) -> MapSpec:
        """The map to draw, checked for what needs no model (`MapSpec`)."""
        from vit.interpret.maps import MapSpec

        query = patch(self.query_patch) if isinstance(self.query_patch, str) else self.query_patch
        return MapSpec(
            self.method, self.layer, self.head, query, self.head_fusion, self.discard_ratio, self.target
        )


@dataclass
class Page:
    """What --html writes: the page's path, and the tables of --scores and --heads it shows."""

    path: Path
    scores: dict | None
    heads: dict | None


def attention(options: AttentionOptions) -> list[Path]:
    """Draw where a trained ViT looks, over image files or test images of its data set.

    Writes `<method>.png` (every image with its map: for cls and query the mean over the chosen
    heads of the last chosen layer) and, for cls and query with more than one layer or head, one
    `<method>_NNN_<image>.png` per image (NNN its position, <image> `test<index>` or the file's
    name) with a row per layer and a column per head. `plots` adds the ViT paper's Figure 7:
    mean_attention_distance.png, pos_embed_similarity.png and embedding_filters.png. Everything
    is computed on the options' device (auto: cuda where PyTorch sees one) and drawn on the CPU.

    `html` writes one self-contained page instead (`vit.explore`: every layer, head, query and
    method, in a browser) to that file, or to `<out>/attention.html` when it is "" (a bare
    --html); the method, query patch, layer and head choose the view it opens on. `scores`: a
    scores.json of `vit-attention score`, whose figures the page shows; `heads`: a heads.json of
    `vit-attention heads`, whose mean-ablation grid the page shows (a click opens a head).
    """
    from vit.interpret.maps import explain

    started = time.perf_counter()
    options.check()
    spec = options.spec()
    check_out_folder(options.out)
    page = page_of(options)
    set_threads(options.threads)
    inputs = options.load()
    captions, tags = image_names(inputs)
    if page is not None:
        return [write_page(page, inputs, spec, captions, options.batch_size, started)]
    found = explain(
        inputs.model, inputs.images, spec, batch_size=options.batch_size, class_names=inputs.class_names
    )
    if found.note:
        print(f"note: {found.note}")
    figures = draw(found, inputs, spec, captions, tags)
    if options.plots:
        figures.update(figure_7(inputs.model, inputs.images, options.batch_size))
    return save(figures, Path(options.out), found.name, len(inputs.images), started)


def set_threads(threads: int | None) -> None:
    if threads is not None:
        import torch

        if threads < 1:
            raise UsageError(f"threads={threads} must be at least 1")
        torch.set_num_threads(threads)


def image_names(inputs: Inputs) -> tuple[list[str], list[str]]:
    """Each image's caption (its file's name, or `test <index>`) and its tag in file names."""
    if inputs.files is not None:
        return [f.name for f in inputs.files], [file_tag(f.stem) for f in inputs.files]
    return [f"test {i}" for i in inputs.indices], [f"test{i}" for i in inputs.indices]


def draw(found: Explanation, inputs: Inputs, spec: MapSpec, captions: list[str], tags: list[str]) -> dict:
    """The figures of `found` by file name: every image with its map and, for cls and query over
    several layers or heads, one figure per image with a row per layer and a column per head."""
    from vit.interpret.figures import batch_figure, layers_heads_figure

    batch, labels, names = inputs.images, inputs.labels, inputs.class_names
    predicted = found.logits.argmax(-1).tolist()
    truths = [""] * len(predicted) if labels is None else [f"true {names[y]}\n" for y in labels.tolist()]
    captions = [f"{c}\n{t}pred {names[p]}" for c, t, p in zip(captions, truths, predicted, strict=True)]
    box = None  # the query patch, outlined in every tile
    if spec.query_patch is not None:
        p = inputs.model.patch_size
        box = (spec.query_patch[0] * p, spec.query_patch[1] * p, p, p)
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
    return figures


def save(figures: dict, out: Path, name: str, images: int, started: float) -> list[Path]:
    """Save `figures` into `out`, replacing the per-image figures an earlier run left there for
    other images, and say what was written."""
    from vit.plot import save_all

    stale = [p for p in out.glob(f"{name}_[0-9][0-9][0-9]_*.png") if p.name not in figures]
    written = save_all(out, figures)
    for path in stale:
        path.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    files = f"{len(written)} PNG file{'s' * (len(written) != 1)}"
    print(f"wrote {files} into {out} for {images} image{'s' * (images != 1)} in {seconds:.1f} s:")
    for path in written[:3]:
        print(f"  {path}")
    if len(written) > 3:
        print(f"  ... {len(written) - 3} more")
    if stale:
        print(f"removed {len(stale)} per-image figures of an earlier run ({stale[0].name}, ...)")
    return written


def page_of(options: AttentionOptions) -> Page | None:
    """What --html writes, checked before any work: None without --html; --scores and --heads
    only with it."""
    if options.html is None:
        for name in ("scores", "heads"):
            if getattr(options, name) is not None:
                raise UsageError(f"--{name} goes with --html: the page shows them")
        return None
    path = page_path(options.html, options.out, options.plots, options.target)
    scores = None if options.scores is None else read_scores(options.scores)
    heads = None if options.heads is None else read_heads(options.heads)
    return Page(path, scores, heads)


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


def read_scores(path: str | Path) -> dict:
    """The figures of a scores.json written by `vit-attention score`, for the page."""
    import json

    from vit.interpret.score import headline

    try:
        return headline(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        raise FileNotFoundError(f"--scores: file not found: {path}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--scores {path} is not a scores.json of vit-attention score ({e})") from None


def read_heads(path: str | Path) -> dict:
    """The mean-ablation grid of a heads.json written by `vit-attention heads`, for the page."""
    import json

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


def write_page(
    page: Page, inputs: Inputs, spec: MapSpec, captions: list[str], batch_size: int, started
) -> Path:
    """The page of `vit.explore` for the images, written to `page.path`."""
    from vit.interpret.explore import explore

    batch, labels, names = inputs.images, inputs.labels, inputs.class_names
    if labels is not None:
        captions = [f"{c}, true {names[y]}" for c, y in zip(captions, labels.tolist(), strict=True)]
    found = explore(
        inputs.model,
        batch,
        spec,
        captions,
        names,
        scores=page.scores,
        head_effects=page.heads,
        batch_size=batch_size,
    )
    path = found.save(page.path)
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


COMMAND = Command(
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
    options=AttentionOptions,
    function=attention,
    subcommands={"score": score.COMMAND, "heads": heads.COMMAND, "patch": patch_command.COMMAND},
)
main = COMMAND.main

if __name__ == "__main__":
    main()
