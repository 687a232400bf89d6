"""`vit-attention patch`: which activations carry what decides the class? Activation patching
(`vit.interpret.activation_patching`): pairs of images that differ in it, the corrupted one run
with one head's output or one token of the residual stream copied from the clean one's run.

    vit-attention patch --ckpt runs/demo/train/checkpoints/best.ckpt --out runs/demo/patch
    vit-attention patch --ckpt best.ckpt --corrupt random:4 --num_images 32
    vit-attention patch --model timm:deit_tiny_patch16_224 --weights deit.safetensors --pairs pairs.csv

The pairs: by default the data module's counterfactuals where it has them (two circles: one
circle moved so that the class changes, everything else identical), else each image with a
quarter of its patches, at random, taken from the same places of an image of another class
(`--corrupt resample:K`: K of them; corrupted images that stay in the data's distribution). Or
patches replaced by the images' mean colour (`--corrupt random:K`; `--corrupt evidence`: the
evidence patches, where the data knows them), or the pairs of image files a CSV lists (`--pairs`:
clean,corrupted a line). Loads as `vit-attention` does
(`vit.commands.base.Images`); prints the tables; with `--out`, writes patch.json (protocol, settings,
figures) and the figures. Bad input is one line `error: ...` (exit 2 or 1), checked before
anything is computed or written.
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vit.commands.base import Analysis, Command, option, write_outputs
from vit.errors import UsageError

if TYPE_CHECKING:
    import torch

    from vit.commands.base import Inputs
    from vit.model import ViT

CORRUPTIONS = ("counterfactual", "resample:K", "random:K", "evidence")
# vit.interpret.activation_patching.MIN_GAP, here so that --help needs no torch (a test checks them)
MIN_GAP = 0.1


def parse_corrupt(corrupt: str | None) -> tuple[str | None, int | None]:
    """--corrupt counterfactual, evidence, resample or random (a quarter of the patches), resample:K
    or random:K -> (kind, K)."""
    if corrupt is None or corrupt in ("counterfactual", "evidence"):
        return corrupt, None
    kind, colon, count = corrupt.partition(":")
    if kind in ("resample", "random") and not colon:
        return kind, None
    if kind in ("resample", "random") and count.isdigit() and int(count) >= 1:
        return kind, int(count)
    raise UsageError(f"--corrupt {corrupt!r}: choose one of {', '.join(CORRUPTIONS)} (K at least 1)")


def read_pairs(path: str | Path) -> list[tuple[Path, Path]]:
    """The (clean, corrupted) image files a CSV lists, one pair a line (a first line
    clean,corrupted is a header); relative paths are read from the CSV's folder."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--pairs: file not found: {path}")
    pairs = []
    with path.open(newline="") as file:
        for line, row in enumerate(csv.reader(file), start=1):
            fields = [field.strip() for field in row]
            if not any(fields) or (line == 1 and fields == ["clean", "corrupted"]):
                continue
            if len(fields) != 2 or not all(fields):
                raise ValueError(
                    f"--pairs {path}, line {line}: {len(fields)} fields, expected clean,corrupted"
                )
            files = tuple(path.parent / field for field in fields)
            for file_path in files:
                if not file_path.is_file():
                    raise FileNotFoundError(f"--pairs {path}, line {line}: image not found: {file_path}")
            pairs.append(files)
    if not pairs:
        raise ValueError(f"--pairs {path} lists no pairs (clean,corrupted a line)")
    return pairs


@dataclass
class PatchOptions(Analysis):
    """The options of vit-attention patch: `Analysis` (the network, the images, the seed and the
    output folder) and the pairs."""

    num_images: int = option(
        64, "how many pairs (test images, spread over the test split)", type=int, metavar="N"
    )
    batch_size: int = option(
        64, "images per forward pass, copies included (a copy of each image per token)", type=int, metavar="N"
    )
    pairs: str | None = option(
        None,
        "pairs of image files, clean,corrupted a line (paths relative to the CSV's folder; read as --images "
        "are), instead of --corrupt",
        metavar="CSV",
    )
    corrupt: str | None = option(
        None,
        "counterfactual (the data module's: two circles); resample:K (K random patches taken from the "
        "same places of an image of another class); random:K (K random patches replaced by the mean "
        "colour); evidence (the evidence patches replaced by the mean colour); default: the "
        "counterfactuals where the data module has them, else resample, a quarter of the patches",
        metavar="HOW",
    )
    min_gap: float = option(
        MIN_GAP,
        "pairs whose clean and corrupted logit differences lie closer are left out of the mean of "
        "ratios (the ratio of means keeps them)",
        type=float,
        metavar="LOGITS",
    )

    def check(self) -> None:
        super().check()
        parse_corrupt(self.corrupt)
        if not self.min_gap > 0:
            raise UsageError(f"--min_gap {self.min_gap:g} must be above 0: the share divides by the gap")

    def check_images(self) -> None:
        """--pairs lists both images of each pair; image files have no counterfactuals or evidence."""
        if self.pairs is not None:
            if self.corrupt is not None or self.images or self.data:
                raise UsageError(
                    "--pairs lists both images of each pair: not with --corrupt, --images or --data"
                )
            return
        super().check_images()
        kind, _ = parse_corrupt(self.corrupt)
        what_for = {"counterfactual": "counterfactuals", "evidence": "evidence"}
        if self.images and kind in what_for:
            raise UsageError(
                f"--corrupt {kind}: image files given with --images have no {what_for[kind]}; "
                "use --corrupt random:K or --pairs"
            )


@dataclass
class Pairs:
    """The clean and corrupted images that `vit.interpret.activation_patching.analyse` patches between."""

    network: ViT  # on its device
    device: str
    clean: torch.Tensor  # (P, C, H, W)
    corrupted: torch.Tensor  # (P, C, H, W)
    what: str  # the pairs in words, for the printout and the JSON
    classes: tuple[torch.Tensor, torch.Tensor] | None = None  # the labels of each pair, where known


def patch(options: PatchOptions) -> dict:
    """Patch every head and every residual-stream token of a checkpoint's ViT (or a `--model`'s)
    from clean into corrupted images, print the tables and, with `out`, write patch.json and the
    figures. Returns the results (`vit.interpret.activation_patching.analyse`)."""
    from vit.interpret.activation_patching import analyse
    from vit.interpret.figures import patching_figure, patching_tokens_figure

    started = time.perf_counter()
    options.check()
    pairs = listed_pairs(options) if options.pairs is not None else corrupted_pairs(options)
    results = options.measure(
        analyse, pairs.network, pairs.clean, pairs.corrupted, progress="patching", classes=pairs.classes,
        min_gap=options.min_gap,
    )  # fmt: skip
    results.pop("per_pair")
    seconds = time.perf_counter() - started
    results["pairs"] = pairs.what
    results["classes"] = "the labels of each pair" if pairs.classes is not None else "the predicted classes"
    results["settings"] = options.settings(seconds, pairs.device)
    report(results, pairs.what, seconds)
    if options.out is not None:
        files = {"patch.json": json.dumps(results, indent=1)}
        files["patch_heads.png"] = patching_figure(results)
        files["patch_tokens.png"] = patching_tokens_figure(pairs.clean[0], results)
        write_outputs(options.out, files)
    return results


def listed_pairs(options: PatchOptions) -> Pairs:
    """The pairs of image files the --pairs CSV lists, at most `num_images`."""
    from vit.preparation import read_images

    listed = read_pairs(options.pairs)[: options.num_images]
    network, preparation, device = options.load_vit()
    clean = read_images([c for c, _ in listed], preparation)
    corrupted = read_images([c for _, c in listed], preparation)
    what = f"{len(clean)} pairs of image files from {options.pairs}"
    return Pairs(network, device, clean, corrupted, what)


def corrupted_pairs(options: PatchOptions) -> Pairs:
    """The images (`Images.load`) and their corrupted copies, as --corrupt says: the data module's
    counterfactuals, or patches replaced (`replaced_patches`)."""
    inputs = options.load()
    datamodule = inputs.datamodule
    has_counterfactuals = datamodule is not None and hasattr(datamodule, "counterfactuals")
    kind, count = parse_corrupt(options.corrupt)
    kind = kind or ("counterfactual" if has_counterfactuals else "resample")
    if kind != "counterfactual":
        return replaced_patches(inputs, kind, count, options.seed)
    if not has_counterfactuals:
        raise UsageError(
            f"--corrupt counterfactual: {type(datamodule).__name__} makes no counterfactuals; use "
            "--corrupt random:K or evidence, or --pairs"
        )
    moved, labels = datamodule.counterfactuals("test")
    what = f"{inputs.description} and their counterfactuals"
    classes = (inputs.labels, labels[inputs.indices])
    return Pairs(inputs.model, inputs.device, inputs.images, moved[inputs.indices], what, classes)


def replaced_patches(inputs: Inputs, kind: str, count: int | None, seed: int) -> Pairs:
    """The images with patches replaced: the evidence patches or `count` at random (default a
    quarter) by the mean colour, or `count` at random by the same patches of an image of another
    class (resample)."""
    import torch

    from vit.interpret.activation_patching import random_patches, replace_patches, resample_patches
    from vit.interpret.evidence import patch_evidence

    network, clean, datamodule = inputs.model, inputs.images, inputs.datamodule
    patches = network.grid_size[0] * network.grid_size[1]
    if kind == "evidence":
        pixels = datamodule.evidence("test")
        if pixels is None:
            raise UsageError(
                f"--corrupt evidence: {type(datamodule).__name__} does not know which pixels carry its "
                "labels; use --corrupt random:K"
            )
        removed = patch_evidence(network, pixels[inputs.indices])
        what = f"{inputs.description}, their evidence patches"
    else:
        count = count or max(1, patches // 4)
        if count > patches:
            raise UsageError(f"--corrupt {kind}:{count}: the model's images have {patches} patches")
        what = f"{inputs.description}, {count} of {patches} patches at random"
    generator = torch.Generator().manual_seed(seed)
    if kind == "resample":
        known, whose = known_classes(inputs)
        if (known == known[0]).all():
            raise UsageError(
                f"--corrupt resample: the {len(clean)} images' {whose} are all {known[0].item()}: no "
                "image of another class to take patches from; more images, or --corrupt random:K"
            )
        corrupted = resample_patches(network, clean, known, count, generator)[0]
        what += f" taken from an image of another class (by their {whose})"
    else:
        if kind == "random":
            removed = random_patches(len(clean), patches, count, generator)
        what += " replaced by the mean colour"
        corrupted = replace_patches(network, clean, removed, clean.mean(dim=(0, 2, 3)))
    return Pairs(network, inputs.device, clean, corrupted, what)


def known_classes(inputs: Inputs) -> tuple[torch.Tensor, str]:
    """The images' labels where known, else the classes the model predicts, and which they are."""
    import torch

    if inputs.labels is not None:
        return inputs.labels, "labels"
    with torch.no_grad():
        predicted = inputs.model.eval()(inputs.images.to(inputs.device)).argmax(-1).cpu()
    return predicted, "predicted classes"


def report(results: dict, what: str, seconds: float) -> None:
    """Print what was patched, the pairs used and the tables."""
    from vit.interpret.tables import patch_table

    print(f"patched {results['layers']} layers x {results['heads']} heads and {results['tokens']} tokens "
          f"on {what} in {seconds:.1f} s")  # fmt: skip
    used, total = results["pair_counts"], results["num_pairs"]
    print(f"{used['used']} of {total} pairs used ({used['same_class']} left out: the corruption left the "
          f"class as it was); the mean of ratios over {used['in_mean_of_ratios']} "
          f"({used['gap_under_min_gap']} left out: clean and corrupted logit differences within "
          f"{results['min_gap']:g}); logit "
          f"difference ({results['classes']}): clean {results['logit_difference']['clean']['mean']:.3f}, "
          f"corrupted {results['logit_difference']['corrupted']['mean']:.3f}")  # fmt: skip
    if used["used"] == 0:
        print(
            "no pair used: every share is undefined (nan); more pairs, or a corruption that changes the class"
        )
    print(patch_table(results))


COMMAND = Command(
    prog="vit-attention patch",
    description=(
        "Activation patching: which heads and tokens carry what decides the class? Pairs of "
        "images that differ in it (clean, corrupted); the corrupted image run with one head's "
        "output, or one token of the residual stream after a block, copied from the clean "
        "image's run: the share of the clean-minus-corrupted logit difference it restores "
        "(0 none, 1 all), with a 95% bootstrap interval over pairs."
    ),
    options=PatchOptions,
    function=patch,
)
