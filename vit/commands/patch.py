"""`vit-attention patch`: which activations carry what decides the class? Activation patching
(`vit.interpret.patching`): pairs of images that differ in it, the corrupted one run with one head's output
or one token of the residual stream copied from the clean one's run.

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
(`vit.commands.inputs`); prints the tables; with `--out`, writes patch.json (protocol, settings,
figures) and the figures. Bad input is one line `error: ...` (exit 2 or 1), checked before
anything is computed or written.
"""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

from vit.commands.base import (
    Parser,
    add_data_argument,
    add_device_argument,
    add_images_argument,
    add_source_arguments,
    check_out_folder,
    progress_bar,
    run_parsed,
    settings,
    write_outputs,
)
from vit.commands.inputs import check_counts, check_images, load_inputs, torch_device
from vit.errors import UsageError

CORRUPTIONS = ("counterfactual", "resample:K", "random:K", "evidence")
MIN_GAP = 0.1  # vit.interpret.patching.MIN_GAP, here so that --help needs no torch (a test checks them)


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


def table(results: dict, top: int = 3) -> str:
    """The figures of `vit.interpret.patching.analyse` as text tables: heads by layer (the ratio of means,
    the mean of ratios beside it), and per layer the tokens that restore the most."""
    from vit.interpret.stats import as_text as cell

    heads, tokens = results["restored"]["heads"], results["restored"]["tokens"]
    beside = results["mean_of_ratios"]
    lines = [
        "",
        "share of the logit difference restored by each head's output patched alone: the ratio of means "
        "[95% interval]; the mean of ratios below it",
        "layer".ljust(13) + "".join(f"head {h}".ljust(24) for h in range(results["heads"])),
    ]
    for layer, row in enumerate(heads):
        lines.append(f"{layer}".ljust(13) + "".join(cell(c).ljust(24) for c in row))
        lines.append("  of ratios".ljust(13) + "".join(cell(c).ljust(24) for c in beside["heads"][layer]))
    lines += [
        "",
        f"the {top} tokens of the residual stream after each block that restore the most (ratio of means)",
    ]
    lines.append("after block".ljust(13) + "token".ljust(18) + "restored".ljust(24) + "mean of ratios")
    for layer, row in enumerate(tokens):
        means = [-math.inf if math.isnan(c["mean"]) else c["mean"] for c in row]  # NaN: no pair used
        order = sorted(range(len(row)), key=lambda t: -means[t])
        for rank, token in enumerate(order[:top]):
            name = results["token_names"][token]
            cells = cell(row[token]).ljust(24) + cell(beside["tokens"][layer][token])
            lines.append((f"{layer}" if rank == 0 else "").ljust(13) + name.ljust(18) + cells)
    return "\n".join(line.rstrip() for line in lines)


def patch(
    *,
    ckpt: Path | None = None,
    model: str | None = None,
    weights: Path | None = None,
    datamodule_class: str | None = None,
    data: dict | None = None,
    images: list[Path] | None = None,
    pairs: Path | None = None,
    corrupt: str | None = None,
    num_images: int = 64,
    min_gap: float = MIN_GAP,
    out: Path | None = None,
    batch_size: int = 64,
    device: str = "auto",
    seed: int = 0,
) -> dict:
    """Patch every head and every residual-stream token of a checkpoint's ViT (or a `--model`'s)
    from clean into corrupted images, print the tables and, with `out`, write patch.json and the
    figures. Returns the results (`vit.interpret.patching.analyse`)."""
    import torch

    from vit.checkpoint import check_source
    from vit.interpret.figures import patching_figure, patching_tokens_figure

    started = time.perf_counter()
    check_source(ckpt, model, weights, datamodule_class)
    check_counts(num_images, batch_size)
    kind, count = parse_corrupt(corrupt)
    if not min_gap > 0:
        raise UsageError(f"--min_gap {min_gap:g} must be above 0: the share divides by the gap")
    listed = None
    if pairs is not None:
        if corrupt is not None or images or data:
            raise UsageError("--pairs lists both images of each pair: not with --corrupt, --images or --data")
        listed = read_pairs(pairs)[:num_images]
    else:
        check_images(model, images, data)
        what_for = {"counterfactual": "counterfactuals", "evidence": "evidence"}
        if images and kind in what_for:
            raise UsageError(f"--corrupt {kind}: image files given with --images have no {what_for[kind]}; "
                             "use --corrupt random:K or --pairs")  # fmt: skip
    check_out_folder(out)
    device = torch_device(device)

    from vit.interpret.evidence import patch_evidence
    from vit.interpret.patching import analyse, random_patches, replace_patches, resample_patches

    classes = None
    if listed is not None:
        from vit.checkpoint import load_network
        from vit.model import ViT
        from vit.preparation import read_images

        network, preparation = load_network(ckpt, model, weights, datamodule_class)
        if not isinstance(network, ViT):
            raise ValueError(f"{ckpt} holds a {type(network).__name__}, not a ViT: it has no heads")
        clean = read_images([c for c, _ in listed], preparation)
        corrupted = read_images([c for _, c in listed], preparation)
        what = f"{len(clean)} pairs of image files from {pairs}"
    else:
        inputs = load_inputs(ckpt, model, weights, images, num_images, data, datamodule_class)
        network, clean, datamodule = inputs.model, inputs.images, inputs.datamodule
        has_counterfactuals = datamodule is not None and hasattr(datamodule, "counterfactuals")
        kind = kind or ("counterfactual" if has_counterfactuals else "resample")
        if kind == "counterfactual":
            if not has_counterfactuals:
                name = type(datamodule).__name__
                raise UsageError(f"--corrupt counterfactual: {name} makes no counterfactuals; use "
                                 "--corrupt random:K or evidence, or --pairs")  # fmt: skip
            moved, labels = datamodule.counterfactuals("test")
            corrupted, classes = moved[inputs.indices], (inputs.labels, labels[inputs.indices])
            what = f"{inputs.description} and their counterfactuals"
        else:
            patches = network.grid_size[0] * network.grid_size[1]
            if kind == "evidence":
                pixels = datamodule.evidence("test")
                if pixels is None:
                    raise UsageError(f"--corrupt evidence: {type(datamodule).__name__} does not know which "
                                     "pixels carry its labels; use --corrupt random:K")  # fmt: skip
                removed = patch_evidence(network, pixels[inputs.indices])
                what = f"{inputs.description}, their evidence patches"
            else:
                count = count or max(1, patches // 4)
                if count > patches:
                    raise UsageError(f"--corrupt {kind}:{count}: the model's images have {patches} patches")
                what = f"{inputs.description}, {count} of {patches} patches at random"
            generator = torch.Generator().manual_seed(seed)
            if kind == "resample":
                if inputs.labels is not None:
                    known, whose = inputs.labels, "labels"
                else:
                    with torch.no_grad():
                        known, whose = network.eval()(clean).argmax(-1), "predicted classes"
                if (known == known[0]).all():
                    raise UsageError(f"--corrupt resample: the {len(clean)} images' {whose} are all "
                                     f"{known[0].item()}: no image of another class to take patches from; "
                                     "more images, or --corrupt random:K")  # fmt: skip
                corrupted = resample_patches(network, clean, known, count, generator)[0]
                what += f" taken from an image of another class (by their {whose})"
            else:
                if kind == "random":
                    removed = random_patches(len(clean), patches, count, generator)
                what += " replaced by the mean colour"
                corrupted = replace_patches(network, clean, removed, clean.mean(dim=(0, 2, 3)))
    network.to(device)

    results = analyse(network, clean, corrupted, classes, batch_size, min_gap, seed, progress_bar("patching"))
    results.pop("per_pair")
    seconds = time.perf_counter() - started
    results["pairs"] = what
    results["classes"] = "the labels of each pair" if classes is not None else "the predicted classes"
    results["settings"] = settings(ckpt or model, seconds, batch_size=batch_size, seed=seed, device=device)
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
    print(table(results))
    if out is not None:
        files = {"patch.json": json.dumps(results, indent=1)}
        files["patch_heads.png"] = patching_figure(results)
        files["patch_tokens.png"] = patching_tokens_figure(clean[0], results)
        write_outputs(out, files)
    return results


def parser() -> Parser:
    parser = Parser(
        prog="vit-attention patch",
        description=(
            "Activation patching: which heads and tokens carry what decides the class? Pairs of "
            "images that differ in it (clean, corrupted); the corrupted image run with one head's "
            "output, or one token of the residual stream after a block, copied from the clean "
            "image's run: the share of the clean-minus-corrupted logit difference it restores "
            "(0 none, 1 all), with a 95% bootstrap interval over pairs."
        ),
    )
    add = parser.add_argument
    add_source_arguments(parser)
    add_data_argument(parser)
    add_images_argument(parser)
    add("--pairs", default=None, metavar="CSV",
        help="pairs of image files, clean,corrupted a line (paths relative to the CSV's folder), "
        "read as --images are; instead of --corrupt")  # fmt: skip
    add("--corrupt", default=None, metavar="HOW",
        help="counterfactual (the data module's: two circles); resample:K (K random patches taken "
        "from the same places of an image of another class); random:K (K random patches replaced "
        "by the mean colour); evidence (the evidence patches replaced by the mean colour); default: "
        "the counterfactuals where the data module has them, else resample, a quarter of the "
        "patches")  # fmt: skip
    add("--num_images", type=int, default=64, metavar="N",
        help="how many pairs (test images, spread over the test split)")  # fmt: skip
    add("--min_gap", type=float, default=MIN_GAP, metavar="LOGITS",
        help="pairs whose clean and corrupted logit differences lie closer are left out of the mean "
        "of ratios (the ratio of means keeps them)")  # fmt: skip
    add(
        "--out",
        default=None,
        metavar="DIR",
        help="folder for patch.json and the figures; default: print only",
    )
    add("--batch_size", type=int, default=64, metavar="N",
        help="images per forward pass, copies included (a copy of each image per token)")  # fmt: skip
    add_device_argument(parser)
    add("--seed", type=int, default=0, help="the random patches and the bootstrap's resampling")
    return parser


def main(args: list[str]) -> None:
    run_parsed(patch, parser(), args)
