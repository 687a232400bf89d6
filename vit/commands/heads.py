"""`vit-attention heads`: which heads does the model use? Each head ablated alone (by its mean and
by zero), each head's direct contribution to the predicted logit, the logit lens after each block,
the high-norm tokens of each layer and, where the data knows its evidence, each head's attention
on it beside its ablation (`vit.interpret.head_analysis`).

    vit-attention heads --ckpt runs/demo/train/checkpoints/best.ckpt --out runs/demo/heads
    vit-attention heads --ckpt best.ckpt --num_images 128 --norm_ratio 8
    vit-attention heads --model timm:vit_small_patch14_reg4_dinov2 --weights reg4.safetensors --images photos/

Loads as `vit-attention` does (`vit.commands.base.Images`); prints the tables; with `--out`, writes
heads.json (protocol, settings, figures) and the figures. Bad input is one line `error: ...`
(exit 2 or 1), checked before anything is computed or written.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from vit.commands.base import Analysis, Command, option, write_outputs
from vit.errors import UsageError

# vit.interpret.head_analysis's NORM_RATIO and ATTRIBUTIONS (the first the default), here so that
# --help needs no torch (a test checks them)
NORM_RATIO = 4.0
ATTRIBUTIONS = ("difference", "centred", "logit")


@dataclass
class HeadsOptions(Analysis):
    """The options of vit-attention heads: `Analysis` (the network, the images, the seed and the
    output folder), the high-norm threshold and what the attribution splits."""

    batch_size: int = option(
        64,
        "images per forward pass, copies included (ablation: 2 x heads + 1 copies of each)",
        type=int,
        metavar="N",
    )
    norm_ratio: float = option(
        NORM_RATIO,
        "a token is high-norm above R times its image's median patch-token norm there",
        type=float,
        metavar="R",
    )
    attribute: str = option(
        ATTRIBUTIONS[0],
        "what the direct attribution splits: the logit difference between the predicted class and the "
        "runner-up (default; only what tells them apart), the predicted logit less the mean logit "
        "(centred), or the raw logit (parts common to every class get credit too)",
        choices=ATTRIBUTIONS,
    )

    def check(self) -> None:
        super().check()
        if not self.norm_ratio > 1:
            raise UsageError(
                f"--norm_ratio {self.norm_ratio:g} must be above 1: the median token's ratio is 1"
            )


def heads(options: HeadsOptions) -> dict:
    """Analyse the heads of a checkpoint's ViT (or a `--model`'s) on test images or image files,
    print the tables and, with `out`, write heads.json and the figures. Returns the results
    (`vit.interpret.head_analysis.analyse`)."""
    from vit.interpret.head_analysis import analyse
    from vit.interpret.tables import heads_table

    started = time.perf_counter()
    options.check()
    inputs = options.load()
    evidence, _ = inputs.evidence()
    results = options.measure(
        analyse, inputs.model, inputs.images, progress="heads", labels=inputs.labels, evidence=evidence,
        norm_ratio=options.norm_ratio, attribute=options.attribute,
    )  # fmt: skip
    results.pop("per_image")
    seconds, what = time.perf_counter() - started, inputs.description
    results["settings"] = options.settings(seconds, inputs.device, images=what)
    print(f"analysed {results['layers']} layers x {results['heads']} heads on {what} in {seconds:.1f} s")
    print(heads_table(results))
    if options.out is not None:
        write_outputs(options.out, figures(results))
    return results


def figures(results: dict) -> dict:
    """heads.json and the figures, by file name."""
    from vit.interpret.figures import (
        ablation_figure,
        attribution_figure,
        logit_lens_figure,
        token_norms_figure,
    )
    from vit.interpret.head_analysis import ABLATIONS

    files = {"heads.json": json.dumps(results, indent=1)}
    files.update({f"ablation_{kind}.png": ablation_figure(results, kind) for kind in ABLATIONS})
    files["attribution.png"] = attribution_figure(results)
    files["logit_lens.png"] = logit_lens_figure(results)
    files["token_norms.png"] = token_norms_figure(results)
    return files


COMMAND = Command(
    prog="vit-attention heads",
    description=(
        "Which heads does the model use? Each head ablated alone (replaced by its mean over the "
        "images, per token, and by zero): the change in accuracy and in the log-probability of "
        "the predicted class; each head's direct contribution to the logit difference between "
        "the predicted class and the runner-up (--attribute); the logit "
        "lens after each block; high-norm tokens per layer; where the data knows its evidence, "
        "each head's attention mass on it beside its ablation. Each with a 95% bootstrap "
        "interval over images."
    ),
    options=HeadsOptions,
    function=heads,
)
