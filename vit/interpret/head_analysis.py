"""Which heads does a ViT use? Not where they look (`vit.interpret.maps`) but what they do to the
prediction. Every analysis reads or replaces the heads at one hook point: the input of each block's
attention output projection, `blocks[i].attn.proj`, where the heads' outputs stand concatenated as
(batch, tokens, heads * d_head) (TransformerLens's `hook_z`).

- Ablation, one head at a time: its output replaced by zero, or by its mean over the images taken
  per token (each token position keeps that position's mean: the class token's for the class
  token, a patch's for that patch), so that what the head says about every image stays and only
  what it says about this image goes. Reported: the change in top-1 accuracy and in the
  log-probability of the class predicted on the intact image. Each layer's heads are ablated, both
  ways, in one batch, beside an intact copy of the same images that every change is measured against.
- Direct logit attribution: what each part of the final residual stream adds to a linear reading
  of the logits (by default the logit difference between the predicted class and the runner-up;
  or the predicted class's logit less the mean of all logits, "centred"; or its raw logit),
  read through the final norm and the head with each LayerNorm's scale frozen at its value on the
  intact image (the norm is then linear, and the parts sum to the reading). The parts: the
  embeddings (patches, positions, prefix tokens), every head of every block, each block's
  attention output bias and MLP, and a constant (the final norm's bias read by the head, and the
  head's bias); the norm's mean is taken off each part. The raw logit credits every part with
  what it adds to all classes alike; a difference between classes (TransformerLens's default)
  counts only what tells them apart.
- Logit lens (nostalgebraist 2020): the residual stream after each block read by the final norm
  and the head as if the blocks after it were gone; accuracy per layer, and per patch where the
  head reads the patches' mean (`pool: mean`). After the last block it is the model's prediction.
- High-norm tokens (Darcet et al. 2024, "Vision Transformers Need Registers"): each token's norm
  after each block against the median norm of that image's patch tokens there; tokens above
  `norm_ratio` times it are flagged, by kind (class token, distillation token, registers,
  patches), with the share of the next block's attention (mean over heads and queries) they get,
  and the share of the class token's attention there (what Darcet et al. measure).

- Looking against using, where the data knows its evidence: each head's attention mass on the
  evidence patches (the evidence patches' attention to the other patches, and the class token's),
  as `vit-attention score` measures it per head, beside its ablation; and the rank correlation
  over all heads between looking at the evidence and what removing the head costs, with a
  permutation p-value, a bootstrap interval over heads and one over images.

Figures are means over images with a 95% bootstrap interval over images (`vit.interpret.stats.interval`).
`analyse` runs it all; `vit-attention heads` prints and saves what it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import nn

from vit.errors import require
from vit.interpret.evidence import layers_heads_scores, patch_evidence
from vit.interpret.hooks import (
    device_of,
    hooks,
    on_heads,
    record_attention,
    recorders,
)
from vit.interpret.stats import (
    PERMUTATIONS,
    SAMPLES,
    bootstrap,
    interval,
    lh_interval,
    spearman_over_images,
    spearman_test,
)
from vit.layers import LayerScale
from vit.model import ViT

# Darcet et al. call a token high-norm when its norm exceeds 150 in DINOv2 ViT-g, whose norms are
# bimodal with the ordinary tokens far below. A ratio to the image's median patch-token norm
# carries that over to models whose residual stream has another scale; 4 lies well above the
# spread of ordinary tokens and below the gap the paper shows.
NORM_RATIO = 4.0  # vit.commands.heads names it too, so that --help needs no torch
ABLATIONS = ("mean", "zero")
MEASURES = ("accuracy", "log_probability")  # what an ablation changes, per image
ATTRIBUTIONS = {  # what the attribution splits: a linear reading of the logits
    "difference": "the logit of the predicted class minus the runner-up's",
    "centred": "the logit of the predicted class minus the mean of all the logits",
    "logit": "the raw logit of the predicted class (parts common to every class get credit too)",
}

PROTOCOL = {
    "hook": "the heads' outputs at the input of each block's attention output projection",
    "mean ablation": "one head's output replaced by its mean over the images, per token position",
    "zero ablation": "one head's output replaced by zero",
    "ablation change": "ablated minus intact, per image: top-1 accuracy, and the log-probability of "
    "the class predicted on the intact image; the intact copy runs in the same batch",
    "accuracy": "top-1 against the labels (against the intact prediction without labels)",
    "attribution": "each part's contribution to the attributed reading of the logits through the final "
    "norm (its scale frozen at the intact image's, its mean taken off each part) and the head; the parts "
    "(embeddings, heads, attention output biases, MLPs, the norm's and the head's bias) sum to the reading",
    "logit lens": "the residual stream after each block read by the final norm and the head",
    "high-norm tokens": "norm after a block over the median norm of the image's patch tokens there, "
    "above the ratio; attention: the share of the next block's attention (mean over heads and "
    "queries; and the class token's, mean over heads) the flagged tokens receive, against their "
    "share of the tokens; images with no flagged token left out",
    "evidence mass": "per head, the share of the attention's positive mass on evidence patches: the "
    "evidence patches' attention to the other patches (evidence -> evidence), the class token's "
    "(class token -> evidence); the correlation: Spearman's, over every layer and head, of the mean "
    "mass against the mean loss of log-probability under each ablation (intact minus ablated)",
    "correlation's uncertainty": f"p: two-sided, {PERMUTATIONS} random pairings of the heads' two figures; "
    f"interval over heads: 95% percentile bootstrap of the heads, {SAMPLES} resamples; interval over images: "
    f"95% percentile bootstrap of the images, the heads' means taken again, {SAMPLES} resamples",
    "interval": bootstrap("images"),
}


@dataclass
class Record:
    """What one intact forward pass leaves in the residual stream, for a batch of B images of N
    tokens (D channels, L blocks)."""

    logits: torch.Tensor  # (B, classes)
    embeddings: torch.Tensor  # (B, N, D): the input of the first block
    heads: torch.Tensor  # (L, B, N, heads * d_head): each block's heads' outputs, concatenated
    mlp: torch.Tensor  # (L, B, N, D): each block's MLP branch, as added to the residual stream
    residual: torch.Tensor  # (L, B, N, D): the residual stream after each block
    attention: torch.Tensor  # (L, B, N): attention each token receives, mean over heads and queries
    cls_attention: torch.Tensor  # (L, B, N): the first token's attention to each, mean over heads


def record(model: ViT, images: torch.Tensor) -> Record:
    """One intact forward pass of `images` (on the model's device), everything the analyses read
    recorded in float32."""
    pairs, found = recorders(model, "embeddings", "heads", "mlp", "residual")
    layers = list(range(len(model.blocks)))
    with (
        torch.no_grad(),
        hooks(*pairs),
        record_attention(
            model, layers, lambda w: torch.stack([w.float().mean((1, 2)), w[:, :, 0].float().mean(1)])
        ) as a,
    ):
        logits = model(images.to(device_of(model)))
    return Record(
        logits.float(),
        found["embeddings"][0].float(),
        torch.stack(found["heads"]).float(),
        torch.stack(found["mlp"]).float(),
        torch.stack(found["residual"]).float(),
        torch.stack([a[i][0][0] for i in layers]),
        torch.stack([a[i][0][1] for i in layers]),
    )


# ------------------------------------------------------------------------ direct logit attribution


def pool_weights(model: ViT, tokens: int, device: torch.device) -> torch.Tensor:
    """How the head weighs the tokens (N,): the class token alone, or the mean of the patches."""
    weights = torch.zeros(tokens, device=device)
    if model.pool == "cls":
        weights[0] = 1.0
    else:
        weights[model.num_prefix_tokens :] = 1.0 / (tokens - model.num_prefix_tokens)
    return weights


def frozen_norm(norm: nn.LayerNorm, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Vectors v with (norm(x) - norm.bias) . rows = x . v: the LayerNorm `norm` with its scale
    frozen at x (..., D), read along `rows` (..., D). Its mean is taken off v, so that any part
    of x read along v has its share of the mean taken off."""
    scale = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).rsqrt()
    read = norm.weight * rows * scale
    return read - read.mean(-1, keepdim=True)


def contrast(logits: torch.Tensor, kind: str = "difference") -> torch.Tensor:
    """The weights (B, classes) of the linear reading of `logits` (B, classes) that `kind` of
    `ATTRIBUTIONS` attributes: +1 on the predicted class, and -1 on the runner-up ("difference"),
    -1/classes on every class ("centred") or nothing more ("logit")."""
    require(kind in ATTRIBUTIONS, f"unknown attribution {kind!r}; choose one of {', '.join(ATTRIBUTIONS)}")
    top = logits.topk(min(2, logits.shape[-1]), dim=-1).indices
    weights = torch.zeros_like(logits, dtype=torch.float32).scatter(-1, top[:, :1], 1.0)
    if kind == "difference" and logits.shape[-1] > 1:
        weights.scatter_(-1, top[:, 1:2], -1.0)
    if kind == "centred":
        weights -= 1 / logits.shape[-1]
    return weights


def read_vectors(
    model: ViT, residual: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """How the head reads the final residual stream (B, N, D) for the reading of the logits
    weighted by `weights` (B, classes) (`contrast`), linearised at it: (R (B, N, D), constant (B,))
    with sum_c weights[b, c] logit[b, c] equal to the sum over tokens t of residual[b, t] . R[b, t],
    plus constant[b]. Each LayerNorm's scale is frozen at its value on `residual`, so the same R
    reads any part of the stream."""
    pool = pool_weights(model, residual.shape[1], residual.device)
    weights = weights.to(residual.device).float()
    rows, bias = weights @ model.head.weight.float(), weights @ model.head.bias.float()
    if model.config.fc_norm:  # the norm after pooling
        pooled = torch.einsum("n,bnd->bd", pool, residual)
        read = pool[None, :, None] * frozen_norm(model.fc_norm, pooled, rows)[:, None]
        return read, bias + (rows * model.fc_norm.bias.float()).sum(-1)
    read = pool[None, :, None] * frozen_norm(model.norm, residual, rows[:, None])
    constant = bias + (rows * model.norm.bias.float()).sum(-1)
    if model.head_dist is not None:  # DeiT: the mean of the class token's and the distillation token's heads
        rows_dist = weights @ model.head_dist.weight.float()
        read = read / 2
        read[:, 1] += frozen_norm(model.norm, residual[:, 1], rows_dist) / 2
        constant = (
            constant + weights @ model.head_dist.bias.float() + (rows_dist * model.norm.bias.float()).sum(-1)
        ) / 2
    return read, constant


def layer_scale(module: nn.Module, dim: int, device: torch.device) -> torch.Tensor:
    return module.gamma.float() if isinstance(module, LayerScale) else torch.ones(dim, device=device)


@torch.no_grad()
def attribution(model: ViT, found: Record, weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """Direct logit attribution in a `Record` of the reading of its logits weighted by `weights`
    (B, classes) (`contrast`; a one-hot row: one class's logit): "heads" (L, heads, B),
    "attention_bias" (L, B) and "mlp" (L, B) per block, "embeddings" (B,), "constant" (B,: the
    final norm's bias and the head's bias, as the head reads them) and the "total" (B,: the
    reading, sum_c weights[b, c] logit[b, c]) they sum to."""
    weights = weights.to(found.residual.device).float()
    read, constant = read_vectors(model, found.residual[-1], weights)
    heads, attention_bias, mlp = [], [], []
    for block, outputs, branch in zip(model.blocks, found.heads, found.mlp, strict=True):
        scaled = read * layer_scale(block.ls1, read.shape[-1], read.device)
        along = (
            scaled @ block.attn.proj.weight.float()
        )  # (B, N, heads * d_head): what each head's output is read along
        per_head = rearrange(outputs * along, "b n (h d) -> h b n d", h=block.attn.heads)
        heads.append(per_head.sum((-2, -1)))
        attention_bias.append((scaled * block.attn.proj.bias.float()).sum((1, 2)))
        mlp.append((branch * read).sum((1, 2)))
    return {
        "heads": torch.stack(heads),
        "attention_bias": torch.stack(attention_bias),
        "mlp": torch.stack(mlp),
        "embeddings": (found.embeddings * read).sum((1, 2)),
        "constant": constant,
        "total": (found.logits * weights.to(found.logits.device)).sum(-1),
    }


# -------------------------------------------------------------------------------------- ablation


def ablated_logits(model: ViT, images: torch.Tensor, layer: int, replacements: torch.Tensor) -> torch.Tensor:
    """Logits (1 + K x heads, B, classes) of `images` (on the model's device): first intact, then
    with each head of block `layer` in turn replaced by its slice of each of the K `replacements`
    (K, N, heads * d_head): copy 1 + k * heads + h has head h replaced by replacement k. All the
    copies run as one batch."""
    attn = model.blocks[layer].attn
    heads, batch, kinds = attn.heads, len(images), len(replacements)
    copies = 1 + kinds * heads
    # per copy, which head is replaced (none for copy 0) and by which replacement
    which = torch.cat([torch.zeros(1, heads), torch.eye(heads).repeat(kinds, 1)]).bool().to(images.device)
    new = rearrange(replacements, "k n (h d) -> k n h d", h=heads)
    new = torch.cat([new[:1], new.repeat_interleave(heads, dim=0)])  # (copies, N, heads, d_head)

    def replace(x):
        outputs = rearrange(x, "(c b) n (h d) -> c b n h d", c=copies, h=heads)
        outputs = torch.where(which[:, None, None, :, None], new[:, None].to(outputs.dtype), outputs)
        return rearrange(outputs, "c b n h d -> (c b) n (h d)")

    with torch.no_grad(), hooks(on_heads(model.blocks[layer], replace)):
        logits = model(images.repeat(copies, *[1] * (images.ndim - 1)))
    return logits.float().view(copies, batch, -1)


def ablation_changes(
    logits: torch.Tensor, targets: torch.Tensor, truth: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """From `ablated_logits` (1 + copies, B, classes): each ablated copy's change (copies, B) in
    top-1 accuracy against `truth` and in the log-probability of `targets`, against the intact one."""
    correct = (logits.argmax(-1) == truth).float()
    log_p = logits.log_softmax(-1).gather(-1, targets.expand(len(logits), -1)[..., None])[..., 0]
    return correct[1:] - correct[0], log_p[1:] - log_p[0]


# ---------------------------------------------------------------------------- logit lens and norms


def lens_logits(model: ViT, residual: torch.Tensor) -> torch.Tensor:
    """The residual stream after each block (L, B, N, D) read by the final norm and the head:
    (L, B, classes). After the last block, the model's logits."""
    with torch.no_grad():
        return torch.stack([model.forward_head(model.norm(x)).float() for x in residual])


def patch_lens_logits(model: ViT, residual: torch.Tensor) -> torch.Tensor:
    """Each patch token after each block (L, B, N, D) read alone by the final norm and the head,
    as a model that reads the patches' mean reads them together: (L, B, patches, classes)."""
    with torch.no_grad():
        patches = model.norm(residual)[..., model.num_prefix_tokens :, :]
        return model.head(model.fc_norm(patches)).float()


def token_kinds(model: ViT) -> list[str]:
    """The kind of each prefix token, in order (the patches follow): its name, the registers as one
    kind."""
    prefix = model.token_names()[: model.num_prefix_tokens]
    return ["registers" if name.startswith("register ") else name for name in prefix]


def norm_ratios(model: ViT, residual: torch.Tensor) -> torch.Tensor:
    """Each token's norm after each block (L, B, N, D) over the median norm of its image's patch
    tokens there: (L, B, N)."""
    norms = residual.norm(dim=-1)
    median = norms[..., model.num_prefix_tokens :].median(dim=-1, keepdim=True).values
    return norms / median


# ------------------------------------------------------------------------------------- it all


def analyse(
    model: ViT,
    images: torch.Tensor,
    labels: torch.Tensor | None = None,
    batch_size: int = 64,
    norm_ratio: float = NORM_RATIO,
    seed: int = 0,
    progress: Callable | None = None,
    evidence: torch.Tensor | None = None,
    attribute: str = "difference",
) -> dict:
    """Ablation, direct logit attribution, logit lens and high-norm tokens of `model` on `images`
    (N, C, H, W in [0, 1]; `labels` (N,) where known), and with `evidence` (N, H, W pixels, bool)
    each head's attention on it against its ablation; `attribute`, which reading of the logits the
    attribution splits (`ATTRIBUTIONS`). `batch_size` bounds the images of one
    forward pass, copies included (an ablation runs 2 x heads + 1 copies of each image). Returns
    per-image tensors under "per_image" and JSON-ready figures (`interval`s, tables [layer][head])
    for the rest; `progress(iterable)` wraps each loop over chunks (tqdm)."""
    require(model.config.num_classes > 0, "the model has no head (num_classes 0): it predicts no class")
    require(norm_ratio > 1, f"norm_ratio={norm_ratio} must be above 1: the median token's ratio is 1")
    model.eval()
    wrap = progress or (lambda chunks: chunks)
    inked = None if evidence is None else patch_evidence(model, evidence.cpu())  # (N, patches)
    intact = _intact_pass(model, images, inked, batch_size=batch_size, attribute=attribute, wrap=wrap)
    per_image = intact.per_image
    targets = per_image["logits"].argmax(-1)
    truth = targets if labels is None else labels.cpu()
    per_image |= _ablation_changes(
        model, images, intact.head_means, targets=targets, truth=truth, batch_size=batch_size, wrap=wrap
    )
    norms_table = _norms_table(model, per_image, norm_ratio=norm_ratio, seed=seed)
    results = {
        "num_images": len(images),
        "layers": len(model.blocks),
        "heads": model.config.heads,
        "against": "labels" if labels is not None else "the intact prediction",
        "protocol": {**PROTOCOL, "attributed": ATTRIBUTIONS[attribute]},
        "attribute": attribute,
        "accuracy": interval((targets == truth).float(), seed=seed),
        "ablation": {
            kind: {m: lh_interval(per_image[f"ablation/{kind}/{m}"], seed) for m in MEASURES}
            for kind in ABLATIONS
        },
        "attribution": _attribution_figures(per_image, seed=seed),
        "logit_lens": {"accuracy": [interval(v, seed=seed) for v in (per_image["lens"] == truth).float()]},
        "norms": {
            "norm_ratio": norm_ratio,
            "token_kinds": list(dict.fromkeys(token_kinds(model))),
            "layers": norms_table,
        },  # fmt: skip
        "per_image": per_image,
    }
    if inked is not None:
        results["evidence"] = looking_against_using(inked, per_image, seed)
    if "patch_lens" in per_image:  # (L, N images, patches) -> accuracy per layer and patch
        patch_correct = (per_image["patch_lens"] == truth[None, :, None]).float().mean(1)
        results["logit_lens"]["patches"] = patch_correct.tolist()
    return results


@dataclass
class IntactPass:
    """What the intact images give, over all N images of L blocks."""

    # "logits", "attribution/<part>", "lens", "patch_lens" (pool: mean), "ratios", "attention",
    # "cls_attention" and, with evidence, "looks/<query>": per-image tensors, the images on one axis
    per_image: dict[str, torch.Tensor]
    head_means: torch.Tensor  # (L, N tokens, heads * d_head): the heads' outputs, mean over images


def _keep(where: dict, key: str, value: torch.Tensor) -> None:
    where.setdefault(key, []).append(value.cpu())


def _intact_pass(
    model: ViT, images: torch.Tensor, inked: torch.Tensor | None, *, batch_size: int, attribute: str, wrap
) -> IntactPass:
    """The intact pass, `batch_size` images at a time: logits, the attribution of the `attribute`
    reading, the logit lens, token norms and attention, each head's attention mass on the evidence
    patches `inked` (N, patches) where given, and the heads' mean outputs for the mean ablation."""
    found: dict[str, list] = {}
    head_sums = 0
    for start in wrap(range(0, len(images), batch_size)):
        x = images[start : start + batch_size]
        seen = record(model, x)
        _keep(found, "logits", seen.logits)
        for name, values in attribution(model, seen, contrast(seen.logits, attribute)).items():
            _keep(found, f"attribution/{name}", values)
        _keep(found, "lens", lens_logits(model, seen.residual).argmax(-1))
        if model.pool == "mean":
            _keep(found, "patch_lens", patch_lens_logits(model, seen.residual).argmax(-1))
        _keep(found, "ratios", norm_ratios(model, seen.residual))
        _keep(found, "attention", seen.attention)
        _keep(found, "cls_attention", seen.cls_attention)
        if inked is not None:
            for name, values in layers_heads_scores(model, x, inked[start : start + batch_size]).items():
                if name.endswith("/relevance_mass"):  # (L, H, B)
                    _keep(found, f"looks/{name.split('/')[0]}", values)
        head_sums = head_sums + seen.heads.sum(dim=1)
    image_axis = {"logits": 0, "lens": 1, "patch_lens": 1, "ratios": 1, "attention": 1, "cls_attention": 1}
    per_image = {k: torch.cat(v, dim=image_axis.get(k, -1)) for k, v in found.items()}
    return IntactPass(per_image, head_means=head_sums / len(images))


def _ablation_changes(
    model: ViT,
    images: torch.Tensor,
    head_means: torch.Tensor,
    *,
    targets: torch.Tensor,
    truth: torch.Tensor,
    batch_size: int,
    wrap,
) -> dict[str, torch.Tensor]:
    """What ablating each head changes, per image: "ablation/<kind>/<measure>" (L, heads, N) for
    each of `ABLATIONS` and `MEASURES`, against the intact prediction `targets` and the classes
    `truth` (N,). Each layer's heads, both kinds, run in one batch beside an intact copy."""
    layers, heads = len(model.blocks), model.config.heads
    device = device_of(model)
    chunk = max(1, batch_size // (len(ABLATIONS) * heads + 1))
    changes: dict[str, list] = {}
    for start in wrap(range(0, len(images), chunk)):
        x = images[start : start + chunk].to(device)
        t, y = targets[start : start + chunk], truth[start : start + chunk]
        for layer in range(layers):
            mean = head_means[layer]
            replacements = torch.stack(
                [mean if kind == "mean" else torch.zeros_like(mean) for kind in ABLATIONS]
            )
            logits = ablated_logits(model, x, layer, replacements).cpu()
            accuracy, log_p = (v.view(len(ABLATIONS), heads, -1) for v in ablation_changes(logits, t, y))
            for k, kind in enumerate(ABLATIONS):
                _keep(changes, f"{kind}/{layer}/accuracy", accuracy[k])
                _keep(changes, f"{kind}/{layer}/log_probability", log_p[k])
    return {
        f"ablation/{kind}/{measure}": torch.stack(
            [torch.cat(changes[f"{kind}/{layer}/{measure}"], dim=-1) for layer in range(layers)]
        )  # fmt: skip
        for kind in ABLATIONS
        for measure in MEASURES
    }


def _norms_table(model: ViT, per_image: dict, *, norm_ratio: float, seed: int) -> list[dict]:
    """Per layer, the tokens' norm ratios by kind, the share flagged above `norm_ratio`, and the
    next block's attention to the flagged tokens: figures (`interval`s) by name."""
    layers, prefix = len(model.blocks), model.num_prefix_tokens

    def summary(values: torch.Tensor) -> dict:
        return interval(values, seed=seed)

    ratios = per_image["ratios"]  # (L, N images, tokens)
    flagged = ratios > norm_ratio
    table = []
    for layer in range(layers):
        row = {
            "max_patch_ratio": summary(ratios[layer, :, prefix:].amax(-1)),
            "patches_flagged": summary(flagged[layer, :, prefix:].float().mean(-1)),
        }
        for kind in dict.fromkeys(token_kinds(model)):
            columns = [i for i, k in enumerate(token_kinds(model)) if k == kind]
            row[f"{kind}_ratio"] = summary(ratios[layer, :, columns].mean(-1))
            row[f"{kind}_flagged"] = summary(flagged[layer, :, columns].float().mean(-1))
        if layer + 1 < layers:  # the next block's attention to the flagged tokens, where there are any
            any_flagged = flagged[layer].any(-1)
            received = (per_image["attention"][layer + 1] * flagged[layer]).sum(-1)
            row["attention_to_flagged"] = summary(received.masked_fill(~any_flagged, float("nan")))
            if model.cls_token is not None:
                received = (per_image["cls_attention"][layer + 1] * flagged[layer]).sum(-1)
                row["cls_attention_to_flagged"] = summary(received.masked_fill(~any_flagged, float("nan")))
            share = flagged[layer].float().mean(-1)
            row["token_share_flagged"] = summary(share.masked_fill(~any_flagged, float("nan")))
        table.append(row)
    return table


def _attribution_figures(per_image: dict, *, seed: int) -> dict:
    """The direct logit attribution's parts as figures: the heads per layer and head, the attention
    output biases and MLPs per layer, the embeddings, the constant and their total."""
    attributed = {k.split("/")[1]: v for k, v in per_image.items() if k.startswith("attribution/")}
    return {
        "heads": lh_interval(attributed["heads"], seed),
        "attention_bias": [interval(v, seed=seed) for v in attributed["attention_bias"]],
        "mlp": [interval(v, seed=seed) for v in attributed["mlp"]],
        "embeddings": interval(attributed["embeddings"], seed=seed),
        "constant": interval(attributed["constant"], seed=seed),
        "total": interval(attributed["total"], seed=seed),
    }


def looking_against_using(inked: torch.Tensor, per_image: dict, seed: int) -> dict:
    """Each head's attention mass on the evidence patches `inked` (N, patches) (`looks/query`,
    `looks/cls` of `per_image`, (L, H, N)) as figures per layer and head, and the rank correlation
    over all heads of its mean with the mean loss of log-probability under each ablation: "rho",
    its permutation "p", its bootstrap interval over heads ("low", "high") and over images
    ("images": low, high)."""
    loss = {kind: -per_image[f"ablation/{kind}/log_probability"].flatten(0, 1) for kind in ABLATIONS}
    looks = {k.split("/")[1]: v for k, v in per_image.items() if k.startswith("looks/")}

    def correlation(mass: torch.Tensor, loss: torch.Tensor) -> dict:  # (heads of all layers, N) each
        test = spearman_test(mass.nanmean(-1), loss.mean(-1), seed=seed)
        return {**test, "images": spearman_over_images(mass, loss, seed=seed)}

    return {
        "share": inked.float().mean().item(),
        "mass": {name: lh_interval(mass, seed) for name, mass in looks.items()},
        "spearman": {
            name: {kind: correlation(mass.flatten(0, 1), loss[kind]) for kind in ABLATIONS}
            for name, mass in looks.items()
        },
    }
