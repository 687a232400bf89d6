"""`vit-attention score`: which map tells the truth? Every method's maps scored by deletion and
insertion, against the evidence where the data knows it, and by sanity checks (`vit.interpret.score`).

    vit-attention score --ckpt runs/demo/train/checkpoints/best.ckpt --out runs/demo/scores
    vit-attention score --ckpt best.ckpt --methods rollout grad-rollout random --num_images 128
    vit-attention score --model timm:deit_small_patch16_224 --weights deit.safetensors --images photos/
    vit-attention score --ckpt best.ckpt --datamodule mydm.Pets     # a data module of your own

Loads as `vit-attention` does (`vit.commands.base.Images`); prints the tables; with `--out`, writes
scores.json (protocol, settings, figures, curves) and the figures. Bad input is one line
`error: ...` (exit 2 or 1), checked before anything is computed or written.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from vit.commands.base import Analysis, Command, option, write_outputs
from vit.errors import UsageError

# The keys of `vit.interpret.score.METHODS`, here so that --help needs no torch (a test checks them).
METHOD_NAMES = ("cls", "rollout", "grad-rollout", "input-gradient", "random", "evidence")


@dataclass
class ScoreOptions(Analysis):
    """The options of vit-attention score: `Analysis` (the network, the images, the seed and the
    output folder), the methods and the sanity checks."""

    methods: list[str] | None = option(
        None,
        f"default all: {', '.join(METHOD_NAMES)} (evidence where the data knows it)",
        nargs="+",
        metavar="METHOD",
    )
    sanity: bool = option(
        True,
        "leave out the sanity checks (randomisation: a pass of every method per block)",
        flag="--no_sanity",
        action="store_false",
    )


def score(options: ScoreOptions) -> dict:
    """Score the maps of a checkpoint's ViT (or a `--model`'s) on test images or image files, print
    the tables and, with `out`, write scores.json and the figures. Returns the results."""
    from vit.interpret.score import METHODS, current_names, score
    from vit.interpret.tables import score_table

    started = time.perf_counter()
    options.check()
    methods = current_names(options.methods) if options.methods else None
    unknown = [m for m in methods or [] if m not in METHODS]
    if unknown:
        raise UsageError(f"unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
    inputs = options.load()
    network, what = inputs.model, inputs.description
    evidence, why = inputs.evidence()
    if methods and "evidence" in methods and evidence is None:
        raise UsageError(f"--methods evidence needs data with evidence: {why}")
    results = options.measure(
        score, network, inputs.images, progress="scoring", labels=inputs.labels, evidence=evidence,
        methods=methods, sanity=options.sanity,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    grid = "x".join(map(str, network.grid_size))
    results["settings"] = options.settings(seconds, inputs.device, images=what)
    print(f"scored {what} ({grid} patches) in {seconds:.1f} s")
    if why is not None:
        print(f"no evidence figures: {why}")
    print(score_table(results))
    if options.out is not None:
        write_outputs(options.out, figures(results, evidence is not None))
    return results


def figures(results: dict, evidence: bool) -> dict:
    """scores.json and the figures, by file name."""
    from vit.interpret.figures import (
        evidence_figure,
        layers_heads_evidence_figure,
        perturbation_figure,
        randomisation_figure,
    )

    files = {"scores.json": json.dumps(results, indent=1)}
    files["perturbation.png"] = perturbation_figure(results)
    files["perturbation_accuracy.png"] = perturbation_figure(results, "accuracy")
    if evidence:
        files["evidence.png"] = evidence_figure(results)
        files["layers_heads.png"] = layers_heads_evidence_figure(results)
    if "randomisation" in results:
        files["randomisation.png"] = randomisation_figure(results)
    return files


COMMAND = Command(
    prog="vit-attention score",
    description=(
        "Score every attention method's maps: deletion and insertion (patches replaced by the "
        "mean colour, most or least relevant first), against the evidence where the data knows "
        "it (relevance mass, rank accuracy, pointing game), and sanity checks (parameter "
        "randomisation, target sensitivity), each with a 95% bootstrap interval over images."
    ),
    options=ScoreOptions,
    function=score,
)
