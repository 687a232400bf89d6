"""The text tables that `vit-attention score`, `heads` and `patch` print: the results of
`vit.interpret.score.score`, `vit.interpret.head_analysis.analyse` and
`vit.interpret.activation_patching.analyse`, each figure as its mean and 95% interval
(`stats.as_text`)."""

from __future__ import annotations

import math

from vit.interpret.stats import as_text as cell


def score_table(results: dict) -> str:
    """The figures of `vit.interpret.score.score` as text tables: perturbation, evidence, sanity."""
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


READINGS = {  # what the attribution's parts sum to, as the tables name it
    "difference": "the logit difference, predicted class - runner-up",
    "centred": "the centred logit of the predicted class",
    "logit": "the logit of the predicted class",
}


def heads_table(results: dict) -> str:
    """The figures of `vit.interpret.head_analysis.analyse` as text tables: heads, other parts,
    logit lens, norms."""
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


def patch_table(results: dict, top: int = 3) -> str:
    """The figures of `vit.interpret.activation_patching.analyse` as text tables: heads by layer
    (the ratio of means, the mean of ratios beside it), and per layer the tokens that restore the
    most."""
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
