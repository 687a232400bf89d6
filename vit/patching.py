"""Activation patching: which activations carry what decides the class? A pair of images that
differ in that (a clean image and a corrupted one: a counterfactual, or the clean image with
patches replaced) is run twice; the corrupted image is then run again with ONE activation copied
from the clean image's run, and the share of the clean-minus-corrupted logit difference that one
activation brings back is its measure (Meng et al. 2022, "causal tracing"; Heimersheim & Nanda
2024 on how to read it).

- The logit difference: logit[a] - logit[b], a the class of the clean image (its label where the
  pair's labels are known, as for counterfactuals; else its predicted class) and b the corrupted
  image's (likewise).
- restored = (patched - corrupted) / (clean - corrupted), in logit differences: 0 the patch brings
  back nothing, 1 all of it (below 0 or above 1: it overshoots either way). Pairs whose clean and
  corrupted logit differences lie within `min_gap` of each other (the corruption changed nothing
  the two classes tell apart, or a = b) are left out: the share is undefined.
- The activations: each head's output (its slice of the input of `blocks[i].attn.proj`, as
  `vit.heads` reads it) and each token of the residual stream after each block (the block's
  output at one token position). A layer's heads, or its tokens, are patched in one batch: one
  copy of each corrupted image per head (per token), with that head (token) from the clean run.

Figures are means over pairs with a 95% bootstrap interval over pairs (`vit.faithfulness.interval`).
`analyse` runs it all; `vit-attention patch` prints and saves what it returns.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from einops import rearrange

from vit.errors import require
from vit.faithfulness import device_of, interval, perturbed
from vit.heads import hooks, token_kinds
from vit.model import ViT

MIN_GAP = 0.1  # logits: pairs whose clean and corrupted logit differences are closer are left out
SITES = ("heads", "tokens")

PROTOCOL = {
    "logit difference": "logit[a] - logit[b]: a the clean image's class, b the corrupted image's "
    "(their labels where known, as for counterfactuals; else the predicted classes)",
    "restored": "(patched - corrupted) / (clean - corrupted), in logit differences: 0 nothing "
    "brought back, 1 all of it",
    "patched": "the corrupted image run with one activation copied from the clean image's run",
    "heads": "one head's output: its slice of the input of the block's attention output projection",
    "tokens": "one token of the residual stream after the block (the block's output at that position)",
    "left out": f"pairs whose clean and corrupted logit differences lie within {MIN_GAP} of each other",
    "interval": "95% percentile bootstrap over pairs, 1000 resamples",
}


def random_patches(images: int, patches: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """`k` of `patches` patches picked at random for each of `images` images: (images, patches) bool."""
    require(1 <= k <= patches, f"random:{k} must replace between 1 and {patches} patches")
    order = torch.rand(images, patches, generator=generator).argsort(-1)
    return torch.zeros(images, patches, dtype=torch.bool).scatter(1, order[:, :k], True)


def replace_patches(
    model: ViT, images: torch.Tensor, removed: torch.Tensor, fill: torch.Tensor
) -> torch.Tensor:
    """`images` (B, C, H, W) with the patches `removed` (B, patches) bool set to the colour `fill` (C,)."""
    return perturbed(images, removed, fill, model.grid_size)


def activations(model: ViT, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward pass of `images` (on the model's device): logits (B, classes), each block's
    heads' outputs (L, B, N, heads * d_head) and each block's output (L, B, N, D)."""
    heads, residual = [], []
    pairs = []
    for block in model.blocks:
        pairs += [
            (block.attn.proj.register_forward_pre_hook, lambda module, args: heads.append(args[0])),
            (block.register_forward_hook, lambda module, args, out: residual.append(out)),
        ]
    with torch.no_grad(), hooks(*pairs):
        logits = model(images.to(device_of(model)))
    return logits, torch.stack(heads), torch.stack(residual)


def patched_logits(
    model: ViT, corrupted: torch.Tensor, layer: int, site: str, clean: torch.Tensor, which: torch.Tensor
) -> torch.Tensor:
    """Logits (copies, B, classes) of the `corrupted` images (on the model's device), copy c with
    the units `which[c]` of block `layer` taken from `clean`: for `site` "heads", the heads
    (`which` (copies, heads) bool; `clean` (B, N, heads * d_head), that block's heads' outputs on
    the clean images); for "tokens", the token positions of the block's output (`which` (copies, N);
    `clean` (B, N, D)). All the copies run as one batch."""
    require(site in SITES, f"unknown site {site!r}; choose one of {', '.join(SITES)}")
    copies, batch = len(which), len(corrupted)
    which = which.to(corrupted.device)
    block = model.blocks[layer]

    def replace_heads(module, args):
        outputs = rearrange(args[0], "(c b) n (h d) -> c b n h d", c=copies, h=block.attn.heads)
        new = rearrange(clean, "b n (h d) -> b n h d", h=block.attn.heads).to(outputs.dtype)
        outputs = torch.where(which[:, None, None, :, None], new, outputs)
        return (rearrange(outputs, "c b n h d -> (c b) n (h d)"),)

    def replace_tokens(module, args, out):
        outputs = out.view(copies, batch, *out.shape[1:])
        outputs = torch.where(which[:, None, :, None], clean.to(outputs.dtype), outputs)
        return outputs.flatten(0, 1)

    if site == "heads":
        pair = (block.attn.proj.register_forward_pre_hook, replace_heads)
    else:
        pair = (block.register_forward_hook, replace_tokens)
    with torch.no_grad(), hooks(pair):
        logits = model(corrupted.repeat(copies, *[1] * (corrupted.ndim - 1)))
    return logits.float().view(copies, batch, -1)


def token_names(model: ViT) -> list[str]:
    """A name for each token position: the prefix tokens by kind, then "patch (row, column)"."""
    kinds = token_kinds(model)
    names = [
        f"register {i - kinds.index('registers')}" if k == "registers" else k for i, k in enumerate(kinds)
    ]
    rows, columns = model.grid_size
    return names + [f"patch ({r}, {c})" for r in range(rows) for c in range(columns)]


def logit_difference(logits: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """logits[..., b, a] - logits[..., b, b] for logits (..., B, classes) and classes a, b (B,)."""
    a, b = a.to(logits.device), b.to(logits.device)
    index = torch.arange(logits.shape[-2], device=logits.device)
    return logits[..., index, a] - logits[..., index, b]


def restored(patched: torch.Tensor, clean: torch.Tensor, corrupted: torch.Tensor, min_gap: float = MIN_GAP):
    """(patched - corrupted) / (clean - corrupted) of logit differences (..., B) and (B,) (B,); NaN
    where clean and corrupted lie within `min_gap` of each other."""
    gap = clean - corrupted
    return ((patched - corrupted) / gap).masked_fill(gap.abs() < min_gap, float("nan"))


def analyse(
    model: ViT,
    clean: torch.Tensor,
    corrupted: torch.Tensor,
    classes: tuple[torch.Tensor, torch.Tensor] | None = None,
    batch_size: int = 64,
    min_gap: float = MIN_GAP,
    seed: int = 0,
    progress: Callable | None = None,
) -> dict:
    """Patch every head and every token of every block from `clean` into `corrupted` (pairs of
    images, (P, C, H, W) each, in [0, 1]); `classes` (a, b) (P,) each: the classes whose logit
    difference is measured, by default the clean and the corrupted images' predicted classes.
    `batch_size` bounds the images of one forward pass, copies included (a layer's heads run
    heads copies of each image, its tokens N copies). Returns per-pair tensors under "per_pair"
    and JSON-ready figures (`interval`s, "heads" [layer][head], "tokens" [layer][token])."""
    require(model.config.num_classes > 0, "the model has no head (num_classes 0): it predicts no class")
    require(clean.shape == corrupted.shape, f"clean {tuple(clean.shape)} and corrupted "
            f"{tuple(corrupted.shape)} images must pair up one to one")  # fmt: skip
    model.eval()
    device = device_of(model)
    layers, heads = len(model.blocks), model.config.heads
    wrap = progress or (lambda chunks: chunks)
    tokens = model.num_prefix_tokens + model.grid_size[0] * model.grid_size[1]
    chunk = max(1, batch_size // max(heads, tokens))
    eye = {"heads": torch.eye(heads, dtype=torch.bool), "tokens": torch.eye(tokens, dtype=torch.bool)}
    found: dict[str, list] = {}
    for start in wrap(range(0, len(clean), chunk)):
        x, y = clean[start : start + chunk].to(device), corrupted[start : start + chunk].to(device)
        clean_logits, clean_heads, clean_residual = activations(model, x)
        corrupted_logits = activations(model, y)[0]
        if classes is None:
            a, b = clean_logits.argmax(-1), corrupted_logits.argmax(-1)
        else:
            a, b = classes[0][start : start + chunk], classes[1][start : start + chunk]
        high, low = (
            logit_difference(clean_logits.float(), a, b),
            logit_difference(corrupted_logits.float(), a, b),
        )
        found.setdefault("clean", []).append(high.cpu())
        found.setdefault("corrupted", []).append(low.cpu())
        found.setdefault("a", []).append(a.cpu())
        found.setdefault("b", []).append(b.cpu())
        for site, values in (("heads", clean_heads), ("tokens", clean_residual)):
            per_layer = []
            for layer in range(layers):
                patched = logit_difference(
                    patched_logits(model, y, layer, site, values[layer], eye[site]), a, b
                )
                per_layer.append(restored(patched, high, low, min_gap).cpu())
            found.setdefault(site, []).append(torch.stack(per_layer))  # (L, units, B)
    per_pair = {k: torch.cat(v, dim=-1) for k, v in found.items()}
    kept = ~(per_pair["clean"] - per_pair["corrupted"]).abs().lt(min_gap)
    return {
        "num_pairs": len(clean),
        "pairs_kept": int(kept.sum()),
        "min_gap": min_gap,
        "layers": layers,
        "heads": heads,
        "tokens": tokens,
        "prefix_tokens": model.num_prefix_tokens,
        "grid": list(model.grid_size),
        "token_names": token_names(model),
        "protocol": {**PROTOCOL, "left out": PROTOCOL["left out"].replace(str(MIN_GAP), f"{min_gap:g}")},
        "logit_difference": {
            "clean": interval(per_pair["clean"].masked_fill(~kept, float("nan")), seed=seed),
            "corrupted": interval(per_pair["corrupted"].masked_fill(~kept, float("nan")), seed=seed),
        },
        "restored": {
            site: [[interval(v, seed=seed) for v in layer] for layer in per_pair[site]] for site in SITES
        },
        "per_pair": per_pair,
    }
