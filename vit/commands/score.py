"""`vit-attention score`: which map tells the truth? Every method's maps scored by deletion and
insertion, against the evidence where the data knows it, and by sanity checks (`vit.interpret.score`).

    vit-attention score --ckpt runs/demo/train/checkpoints/best.ckpt --out runs/demo/scores
    vit-attention score --ckpt best.ckpt --methods rollout grad-rollout random --num_images 128
    vit-attention score --model timm:deit_small_patch16_224 --weights deit.safetensors --images photos/
    vit-attention score --ckpt best.ckpt --datamodule mydm.Pets     # a data module of your own

Loads as `vit-attention` does (`vit.commands.inputs`); prints the tables; with `--out`, writes
scores.json (protocol, settings, figures, curves) and the figures. Bad input is one line
`error: ...` (exit 2 or 1), checked before anything is computed or written.
"""

from __future__ import annotations

import json
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

# The keys of `vit.interpret.score.METHODS`, here so that --help needs no torch (a test checks them).
METHOD_NAMES = ("cls", "rollout", "grad-rollout", "input-gradient", "random", "evidence")


def table(results: dict) -> str:
    """The figures of `vit.interpret.score.score` as text tables: perturbation, evidence, sanity."""
    from vit.interpret.stats import as_text as cell

    figures = results["figures"]
    width = max(len(m) for m in figures) + 2
    columns = [
        ("deletion_auc_accuracy", "deletion, accuracy ↓"),
        ("deletion_auc_probability", "deletion, probability ↓"),
        ("insertion_auc_accuracy", "insertion, accuracy ↑"),
        ("insertion_auc_probability", "insertion, probability ↑"),
    ]
    sections = [("area under the curve, patches replaced by the mean colour (mean [95% interval])", columns)]
    if results["evidence_share"] is not None:
        evidence = [("relevance_mass", "relevance mass ↑"), ("rank_accuracy", "rank accuracy ↑"),
                    ("pointing_game", "pointing game ↑")]  # fmt: skip
        share = results["evidence_share"]
        sections.append(
            (f"against the evidence ({share:.0%} of the patches: a map that knows nothing)", evidence)
        )
    lines = []
    for title, cols in sections:
        lines += ["", title, "method".ljust(width) + "".join(name.ljust(26) for _, name in cols)]
        for method, found in figures.items():
            if cols[0][0] in found:
                lines.append(method.ljust(width) + "".join(cell(found[key]).ljust(26) for key, _ in cols))
    if "randomisation" in results:
        lines += ["", "sanity checks: Spearman rank correlation with the trained model's maps (1: unchanged)"]
        lines.append("method".ljust(width) + "head random".ljust(26) + "all random".ljust(26)
                     + "runner-up class".ljust(26))  # fmt: skip
        for method, steps in results["randomisation"].items():
            sensitivity = results["target_sensitivity"][method]
            lines.append(method.ljust(width) + cell(steps[0]).ljust(26) + cell(steps[-1]).ljust(26)
                         + cell(sensitivity).ljust(26))  # fmt: skip
    return "\n".join(line.rstrip() for line in lines)


def score(
    *,
    ckpt: Path | None = None,
    model: str | None = None,
    weights: Path | None = None,
    datamodule_class: str | None = None,
    data: dict | None = None,
    images: list[Path] | None = None,
    num_images: int = 512,
    methods: list[str] | None = None,
    sanity: bool = True,
    out: Path | None = None,
    batch_size: int = 64,
    device: str = "auto",
    seed: int = 0,
) -> dict:
    """Score the maps of a checkpoint's ViT (or a `--model`'s) on test images or image files, print
    the tables and, with `out`, write scores.json and the figures. Returns the results. Test
    images come from the checkpoint's data module, built as `vit.commands.inputs.load_inputs`
    builds it (`datamodule_class`, `data`)."""

    from vit.checkpoint import check_source
    from vit.interpret.figures import (
        evidence_figure,
        layers_heads_evidence_figure,
        perturbation_figure,
        randomisation_figure,
    )
    from vit.interpret.score import METHODS, current_names, score

    started = time.perf_counter()
    check_source(ckpt, model, weights, datamodule_class)
    methods = current_names(methods) if methods else None
    unknown = [m for m in methods or [] if m not in METHODS]
    if unknown:
        raise UsageError(f"unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
    check_counts(num_images, batch_size)
    check_images(model, images, data)
    check_out_folder(out)
    device = torch_device(device)
    inputs = load_inputs(ckpt, model, weights, images, num_images, data, datamodule_class)
    network, batch, labels = inputs.model, inputs.images, inputs.labels
    evidence, why = inputs.evidence()
    what = inputs.description
    if methods and "evidence" in methods and evidence is None:
        raise UsageError(f"--methods evidence needs data with evidence: {why}")
    network.to(device)

    results = score(
        network, batch, labels, evidence, methods, batch_size, seed, sanity, progress_bar("scoring")
    )
    seconds = time.perf_counter() - started
    grid = "x".join(map(str, network.grid_size))
    results["settings"] = settings(
        ckpt or model, seconds, images=what, batch_size=batch_size, seed=seed, device=device
    )
    print(f"scored {what} ({grid} patches) in {seconds:.1f} s")
    if why is not None:
        print(f"no evidence figures: {why}")
    print(table(results))
    if out is not None:
        files = {"scores.json": json.dumps(results, indent=1)}
        files["perturbation.png"] = perturbation_figure(results)
        files["perturbation_accuracy.png"] = perturbation_figure(results, "accuracy")
        if evidence is not None:
            files["evidence.png"] = evidence_figure(results)
            files["layers_heads.png"] = layers_heads_evidence_figure(results)
        if "randomisation" in results:
            files["randomisation.png"] = randomisation_figure(results)
        write_outputs(out, files)
    return results


def parser() -> Parser:
    parser = Parser(
        prog="vit-attention score",
        description=(
            "Score every attention method's maps: deletion and insertion (patches replaced by the "
            "mean colour, most or least relevant first), against the evidence where the data knows "
            "it (relevance mass, rank accuracy, pointing game), and sanity checks (parameter "
            "randomisation, target sensitivity), each with a 95% bootstrap interval over images."
        ),
    )
    add = parser.add_argument
    add_source_arguments(parser)
    add_data_argument(parser)
    add_images_argument(parser)
    add("--num_images", type=int, default=512, metavar="N",
        help="how many test images, spread over the test split")  # fmt: skip
    add("--methods", nargs="+", default=None, metavar="METHOD",
        help=f"default all: {', '.join(METHOD_NAMES)} (evidence where the data knows it)")  # fmt: skip
    add("--no_sanity", action="store_true",
        help="leave out the sanity checks (randomisation: a pass of every method per block)")  # fmt: skip
    add(
        "--out",
        default=None,
        metavar="DIR",
        help="folder for scores.json and the figures; default: print only",
    )
    add("--batch_size", type=int, default=64, metavar="N", help="images per forward pass")
    add_device_argument(parser)
    add("--seed", type=int, default=0, help="the random map, tie-breaking and re-initialisation")
    return parser


def main(args: list[str]) -> None:
    run_parsed(score, parser(), args, no_sanity=lambda off: ("sanity", not off))
