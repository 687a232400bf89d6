"""`vit-attention heads`: which heads does the model use? Each head ablated alone (by its mean and
by zero), each head's direct contribution to the predicted logit, the logit lens after each block,
the high-norm tokens of each layer and, where the data knows its evidence, each head's attention
on it beside its ablation (`vit.interpret.heads`).

    vit-attention heads --ckpt runs/demo/train/checkpoints/best.ckpt --out runs/demo/heads
    vit-attention heads --ckpt best.ckpt --num_images 128 --norm_ratio 8
    vit-attention heads --model timm:vit_small_patch14_reg4_dinov2 --weights reg4.safetensors --images photos/

Loads as `vit-attention` does (`vit.commands.inputs`); prints the tables; with `--out`, writes
heads.json (protocol, settings, figures) and the figures. Bad input is one line `error: ...`
(exit 2 or 1), checked before anything is computed or written.
"""

from __future__ import annotations

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

NORM_RATIO = 4.0  # vit.interpret.heads.NORM_RATIO, here so that --help needs no torch (a test checks them)
ATTRIBUTIONS = ("difference", "centred", "logit")  # vit.interpret.heads.ATTRIBUTIONS, the first the default
READINGS = {  # what the attribution's parts sum to, as the tables name it
    "difference": "the logit difference, predicted class - runner-up",
    "centred": "the centred logit of the predicted class",
    "logit": "the logit of the predicted class",
}


def table(results: dict) -> str:
    """The figures of `vit.interpret.heads.analyse` as text tables: heads, other parts, logit lens, norms."""
    from vit.interpret.stats import as_text as cell

    reading = READINGS[results["attribute"]]
    lines = ["", "each head: ablated alone (change, mean [95% interval]) and its direct logit attribution",
             f"(attribution: each head's direct share of {reading})"]  # fmt: skip
    lines.append("layer head".ljust(12) + "".join(name.ljust(26) for name in (
        "mean abl., accuracy", "mean abl., log-prob.", "zero abl., accuracy", "zero abl., log-prob.",
        "attribution")))  # fmt: skip
    ablation, attributed = results["ablation"], results["attribution"]
    for layer in range(results["layers"]):
        for head in range(results["heads"]):
            cells = [ablation[kind][m][layer][head] for kind in ("mean", "zero")
                     for m in ("accuracy", "log_probability")]  # fmt: skip
            cells.append(attributed["heads"][layer][head])
            lines.append(f"{layer:<5d} {head:<6d}" + "".join(cell(c).ljust(26) for c in cells))
    lines += ["", f"the rest of {reading}", "part".ljust(28) + "attribution"]
    lines.append("embeddings".ljust(28) + cell(attributed["embeddings"]))
    for layer, (bias, mlp) in enumerate(zip(attributed["attention_bias"], attributed["mlp"], strict=True)):
        lines.append(f"block {layer} attention bias".ljust(28) + cell(bias))
        lines.append(f"block {layer} MLP".ljust(28) + cell(mlp))
    lines.append("final norm and head biases".ljust(28) + cell(attributed["constant"]))
    lines.append("their sum".ljust(28) + cell(attributed["total"]))
    lines += [
        "",
        f"logit lens: top-1 accuracy against {results['against']}",
        "after block".ljust(14) + "accuracy",
    ]
    for layer, accuracy in enumerate(results["logit_lens"]["accuracy"]):
        lines.append(f"{layer}".ljust(14) + cell(accuracy))
    lines.append("the model".ljust(14) + cell(results["accuracy"]))
    if "evidence" in results:
        lines += looking_table(results)
    norms = results["norms"]
    lines += ["", f"high-norm tokens: norm over the median patch-token norm above {norms['norm_ratio']:g}"]
    columns = [("max_patch_ratio", "largest patch, ratio"), ("patches_flagged", "patches flagged")]
    columns += [(f"{kind}_flagged", f"{kind} flagged") for kind in norms["token_kinds"]]
    columns.append(("attention_to_flagged", "next attention to them"))
    if any("cls_attention_to_flagged" in row for row in norms["layers"]):  # a model with a class token
        columns.append(("cls_attention_to_flagged", "class token's attention"))
    columns.append(("token_share_flagged", "their token share"))
    lines.append("after block".ljust(14) + "".join(name.ljust(26) for _, name in columns))
    for layer, row in enumerate(norms["layers"]):
        shown = [cell(row[k]) if k in row and not math.isnan(row[k]["mean"]) else "-" for k, _ in columns]
        lines.append(f"{layer}".ljust(14) + "".join(text.ljust(26) for text in shown))
    lines.append("(-: no token flagged, or no block after the last)")
    return "\n".join(line.rstrip() for line in lines)


LOOKS = {"query": "evidence -> evidence", "cls": "class token -> evidence"}


def looking_table(results: dict) -> list[str]:
    """Each head's attention mass on the evidence beside its ablation, and their rank correlation."""
    from vit.interpret.stats import as_text as cell

    found = results["evidence"]
    names = [name for name in LOOKS if name in found["mass"]]
    lines = ["", f"each head: attention mass on the evidence ({found['share']:.0%} of the patches: "
             "attention that knows nothing) beside what ablating the head costs"]  # fmt: skip
    columns = [LOOKS[name] for name in names] + ["mean abl., log-prob.", "zero abl., log-prob."]
    lines.append("layer head".ljust(12) + "".join(name.ljust(26) for name in columns))
    for layer in range(results["layers"]):
        for head in range(results["heads"]):
            cells = [found["mass"][name][layer][head] for name in names]
            cells += [results["ablation"][kind]["log_probability"][layer][head] for kind in ("mean", "zero")]
            lines.append(f"{layer:<5d} {head:<6d}" + "".join(cell(c).ljust(26) for c in cells))
    lines.append(f"rank correlation over the {results['layers'] * results['heads']} heads of the mass "
                 "with the loss of log-probability when the head is ablated (Spearman's rho, "
                 "permutation p, 95% intervals over heads and over images):")  # fmt: skip
    for name in names:
        for kind in ("mean", "zero"):
            r = found["spearman"][name][kind]
            lines.append(f"  {LOOKS[name]}, {kind} ablation: {r['rho']:+.2f} p {r['p']:.3f} heads "
                         f"[{r['low']:+.2f}, {r['high']:+.2f}] images [{r['images']['low']:+.2f}, "
                         f"{r['images']['high']:+.2f}]")  # fmt: skip
    return lines


def heads(
    *,
    ckpt: Path | None = None,
    model: str | None = None,
    weights: Path | None = None,
    datamodule_class: str | None = None,
    data: dict | None = None,
    images: list[Path] | None = None,
    num_images: int = 512,
    norm_ratio: float = NORM_RATIO,
    attribute: str = ATTRIBUTIONS[0],
    out: Path | None = None,
    batch_size: int = 64,
    device: str = "auto",
    seed: int = 0,
) -> dict:
    """Analyse the heads of a checkpoint's ViT (or a `--model`'s) on test images or image files,
    print the tables and, with `out`, write heads.json and the figures. Returns the results
    (`vit.interpret.heads.analyse`). Test images come from the checkpoint's data module, built as
    `vit.commands.inputs.load_inputs` builds it (`datamodule_class`, `data`)."""
    from vit.checkpoint import check_source
    from vit.interpret.figures import (
        ablation_figure,
        attribution_figure,
        logit_lens_figure,
        token_norms_figure,
    )
    from vit.interpret.heads import ABLATIONS, analyse

    started = time.perf_counter()
    check_source(ckpt, model, weights, datamodule_class)
    check_counts(num_images, batch_size)
    if not norm_ratio > 1:
        raise UsageError(f"--norm_ratio {norm_ratio:g} must be above 1: the median token's ratio is 1")
    check_images(model, images, data)
    check_out_folder(out)
    device = torch_device(device)
    inputs = load_inputs(ckpt, model, weights, images, num_images, data, datamodule_class)
    network = inputs.model.to(device)
    batch, what = inputs.images, inputs.description
    evidence, _ = inputs.evidence()
    results = analyse(
        network,
        batch,
        inputs.labels,
        batch_size,
        norm_ratio,
        seed,
        progress_bar("heads"),
        evidence,
        attribute,
    )
    results.pop("per_image")
    seconds = time.perf_counter() - started
    results["settings"] = settings(
        ckpt or model, seconds, images=what, batch_size=batch_size, seed=seed, device=device
    )
    print(f"analysed {results['layers']} layers x {results['heads']} heads on {what} in {seconds:.1f} s")
    print(table(results))
    if out is not None:
        files = {"heads.json": json.dumps(results, indent=1)}
        files.update({f"ablation_{kind}.png": ablation_figure(results, kind) for kind in ABLATIONS})
        files["attribution.png"] = attribution_figure(results)
        files["logit_lens.png"] = logit_lens_figure(results)
        files["token_norms.png"] = token_norms_figure(results)
        write_outputs(out, files)
    return results


def parser() -> Parser:
    parser = Parser(
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
    )
    add = parser.add_argument
    add_source_arguments(parser)
    add_data_argument(parser)
    add_images_argument(parser)
    add("--num_images", type=int, default=512, metavar="N",
        help="how many test images, spread over the test split")  # fmt: skip
    add("--norm_ratio", type=float, default=NORM_RATIO, metavar="R",
        help="a token is high-norm above R times its image's median patch-token norm there")  # fmt: skip
    add("--attribute", default=ATTRIBUTIONS[0], choices=ATTRIBUTIONS,
        help="what the direct attribution splits: the logit difference between the predicted class "
        "and the runner-up (default; only what tells them apart), the predicted logit less the mean "
        "logit (centred), or the raw logit (parts common to every class get credit too)")  # fmt: skip
    add(
        "--out",
        default=None,
        metavar="DIR",
        help="folder for heads.json and the figures; default: print only",
    )
    add("--batch_size", type=int, default=64, metavar="N",
        help="images per forward pass, copies included (ablation: 2 x heads + 1 copies of each)")  # fmt: skip
    add_device_argument(parser)
    add("--seed", type=int, default=0, help="the bootstrap's resampling")
    return parser


def main(args: list[str]) -> None:
    run_parsed(heads, parser(), args)
