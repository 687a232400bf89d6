"""Activation patching: which activations carry what decides the class? A pair of images that
differ in that (a clean image and a corrupted one: a counterfactual, or the clean image with
patches taken from an image of another class) is run twice; the corrupted image is then run again
with ONE activation copied from the clean image's run, and the share of the clean-minus-corrupted
logit difference that one activation brings back is its measure (Meng et al. 2022, "causal
tracing"; Heimersheim & Nanda 2024 on how to read it; Zhang & Nanda 2023 on why corruptions
should stay in distribution, as counterfactuals and resampled patches do and a flat colour does
not).

- The logit difference: logit[a] - logit[b], a the class of the clean image (its label where the
  pair's labels are known, as for counterfactuals; else its predicted class) and b the corrupted
  image's (likewise). Pairs with a = b (the corruption left the class as it was) differ in
  nothing the measure can see and are left out.
- restored, the ratio of means (the field's convention): (mean patched - mean corrupted) /
  (mean clean - mean corrupted) over the pairs, in logit differences: 0 the patch brings back
  nothing, 1 all of it (below 0 or above 1: it overshoots either way).
- Beside it, the mean of ratios: each pair's (patched - corrupted) / (clean - corrupted),
  averaged; undefined for pairs whose clean and corrupted logit differences lie within `min_gap`
  of each other, which it leaves out (the count is reported); single pairs with small gaps can
  swing it far.
- The activations: each head's output (its slice of the input of `blocks[i].attn.proj`, as
  `vit.interpret.head_analysis` reads it) and each token of the residual stream after each block (the block's
  output at one token position). A layer's heads, or its tokens, are patched in one batch: one
  copy of each corrupted image per head (per token), with that head (token) from the clean run.

Each figure has a 95% bootstrap interval over pairs (the ratio of means recomputed on each resample).
`analyse` runs it all; `vit-attention patch` prints and saves what it returns.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from einops import rearrange

from vit.errors import require
from vit.interpret.evidence import perturbed
from vit.interpret.hooks import device_of, hooks, on_heads, on_residual, recorders
from vit.interpret.stats import SAMPLES, bootstrap, bounds, interval, lh_interval
from vit.model import ViT

MIN_GAP = 0.1  # logits: pairs whose clean and corrupted logit differences are closer are left out
SITES = ("heads", "tokens")

PROTOCOL = {
    "logit difference": "logit[a] - logit[b]: a the clean image's class, b the corrupted image's "
    "(their labels where known, as for counterfactuals; else the predicted classes); pairs with a = b "
    "left out",
    "restored": "ratio of means over the pairs: (mean patched - mean corrupted) / (mean clean - mean "
    "corrupted), in logit differences: 0 nothing brought back, 1 all of it",
    "mean of ratios": "the mean over pairs of (patched - corrupted) / (clean - corrupted), beside it",
    "patched": "the corrupted image run with one activation copied from the clean image's run",
    "heads": "one head's output: its slice of the input of the block's attention output projection",
    "tokens": "one token of the residual stream after the block (the block's output at that position)",
    "left out": f"from the mean of ratios, pairs whose clean and corrupted logit differences lie within "
    f"{MIN_GAP} of each other",
    "interval": bootstrap("pairs") + " (the ratio of means taken again)",
}


def random_patches(images: int, patches: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """`k` of `patches` patches picked at random for each of `images` images: (images, patches) bool."""
    require(1 <= k <= patches, f"random:{k} must replace between 1 and {patches} patches")
    order = torch.rand(images, patches, generator=generator).argsort(-1)
    return torch.zeros(images, patches, dtype=torch.bool).scatter(1, order[:, :k], True)


def resample_patches(
    model: ViT, images: torch.Tensor, classes: torch.Tensor, k: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """`images` (B, C, H, W) with `k` patches each, at random, taken from the same places of another
    of the images whose class (`classes` (B,)) differs, picked at random: a corruption that stays
    in the images' distribution. Returns the corrupted images and each one's donor (B,)."""
    patches = model.grid_size[0] * model.grid_size[1]
    removed = random_patches(len(images), patches, k, generator)
    require(bool((classes != classes[0]).any()), "resampled patches need, for each image, an image of "
            f"another class; these {len(images)} images are all of class {classes[0].item()}")  # fmt: skip
    other = classes[None, :] != classes[:, None]  # (B, B): who may give to whom
    donors = (torch.rand(len(images), len(images), generator=generator) * other).argmax(1)
    return perturbed(images, removed, images[donors], model.grid_size), donors


def replace_patches(
    model: ViT, images: torch.Tensor, removed: torch.Tensor, fill: torch.Tensor
) -> torch.Tensor:
    """`images` (B, C, H, W) with the patches `removed` (B, patches) bool set to the colour `fill` (C,)."""
    return perturbed(images, removed, fill, model.grid_size)


def activations(model: ViT, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward pass of `images` (on the model's device): logits (B, classes), each block's
    heads' outputs (L, B, N, heads * d_head) and each block's output (L, B, N, D)."""
    pairs, found = recorders(model, "heads", "residual")
    with torch.no_grad(), hooks(*pairs):
        logits = model(images.to(device_of(model)))
    return logits, torch.stack(found["heads"]), torch.stack(found["residual"])


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

    def replace_heads(x):
        outputs = rearrange(x, "(c b) n (h d) -> c b n h d", c=copies, h=block.attn.heads)
        new = rearrange(clean, "b n (h d) -> b n h d", h=block.attn.heads).to(outputs.dtype)
        outputs = torch.where(which[:, None, None, :, None], new, outputs)
        return rearrange(outputs, "c b n h d -> (c b) n (h d)")

    def replace_tokens(out):
        outputs = out.view(copies, batch, *out.shape[1:])
        outputs = torch.where(which[:, None, :, None], clean.to(outputs.dtype), outputs)
        return outputs.flatten(0, 1)

    pair = on_heads(block, replace_heads) if site == "heads" else on_residual(block, replace_tokens)
    with torch.no_grad(), hooks(pair):
        logits = model(corrupted.repeat(copies, *[1] * (corrupted.ndim - 1)))
    return logits.float().view(copies, batch, -1)


def logit_difference(logits: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """logits[..., b, a] - logits[..., b, b] for logits (..., B, classes) and classes a, b (B,)."""
    a, b = a.to(logits.device), b.to(logits.device)
    index = torch.arange(logits.shape[-2], device=logits.device)
    return logits[..., index, a] - logits[..., index, b]


def restored(patched: torch.Tensor, clean: torch.Tensor, corrupted: torch.Tensor, min_gap: float = MIN_GAP):
    """Per pair, (patched - corrupted) / (clean - corrupted) of logit differences (..., B) and (B,)
    (B,); NaN where clean and corrupted lie within `min_gap` of each other."""
    gap = clean - corrupted
    return ((patched - corrupted) / gap).masked_fill(gap.abs() < min_gap, float("nan"))


def restored_ratio_of_means(
    patched: torch.Tensor, clean: torch.Tensor, corrupted: torch.Tensor, samples: int = SAMPLES, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean patched - mean corrupted) / (mean clean - mean corrupted) over the pairs, of logit
    differences (..., P) and (P,) (P,): (...,), and its 95% percentile bootstrap interval over
    the pairs, (2, ...) (low, high; each resample of pairs, shared by every unit, gives one ratio
    of means)."""
    double = [v.double() for v in (patched, clean, corrupted)]
    ratio = (double[0].mean(-1) - double[2].mean(-1)) / (double[1].mean(-1) - double[2].mean(-1))
    pairs = patched.shape[-1]
    if pairs == 0:
        nan = torch.full(patched.shape[:-1], float("nan"), dtype=torch.float64)
        return nan, torch.stack([nan, nan])
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(pairs, (samples, pairs), generator=g)
    counts = (
        torch.zeros(samples, pairs, dtype=torch.float64).scatter_add_(
            1, picks, torch.ones(samples, pairs, dtype=torch.float64)
        )
        / pairs
    )  # (samples, P): each resample's weights, a mean as a product
    means = [v @ counts.T for v in double]  # (..., samples)
    return ratio, bounds((means[0] - means[2]) / (means[1] - means[2]), dim=-1)


def ratio_figures(ratio: torch.Tensor, limits: torch.Tensor) -> list:
    """`restored_ratio_of_means`'s (ratio (...,), limits (2, ...)) as figures like `interval`'s,
    nested as the units are: {"mean", "low", "high"} each."""
    if ratio.ndim == 0:
        return {"mean": ratio.item(), "low": limits[0].item(), "high": limits[1].item()}
    return [ratio_figures(r, b) for r, b in zip(ratio, limits.movedim(0, 1), strict=True)]


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
    ("patched/heads" (L, heads, P) and "patched/tokens" (L, N, P): logit differences; "heads" and
    "tokens": each pair's ratio, NaN where left out) and JSON-ready figures: "restored" (the ratio
    of means) and "mean_of_ratios", each `interval`s ["heads"|"tokens"][layer][unit], and
    "pair_counts", how many were used and why the others were not."""
    require(model.config.num_classes > 0, "the model has no head (num_classes 0): it predicts no class")
    require(clean.shape == corrupted.shape, f"clean {tuple(clean.shape)} and corrupted "
            f"{tuple(corrupted.shape)} images must pair up one to one")  # fmt: skip
    model.eval()
    per_pair = _logit_differences(model, clean, corrupted, classes, batch_size=batch_size, progress=progress)
    high, low = per_pair["clean"], per_pair["corrupted"]
    for site in SITES:
        per_pair[site] = restored(per_pair[f"patched/{site}"], high, low, min_gap)
    differ = per_pair["a"] != per_pair["b"]  # a = b: a logit difference of zero, clean or not
    wide = (high - low).abs() >= min_gap
    return {
        "num_pairs": len(clean),
        "pair_counts": {
            "used": int(differ.sum()),
            "same_class": int((~differ).sum()),
            "in_mean_of_ratios": int(wide.sum()),
            "gap_under_min_gap": int((~wide).sum()),
        },
        "min_gap": min_gap,
        "layers": len(model.blocks),
        "heads": model.config.heads,
        "tokens": model.num_prefix_tokens + model.grid_size[0] * model.grid_size[1],
        "prefix_tokens": model.num_prefix_tokens,
        "grid": list(model.grid_size),
        "token_names": model.token_names(),
        "protocol": {**PROTOCOL, "left out": PROTOCOL["left out"].replace(str(MIN_GAP), f"{min_gap:g}")},
        "logit_difference": {
            "clean": interval(high.masked_fill(~differ, float("nan")), seed=seed),
            "corrupted": interval(low.masked_fill(~differ, float("nan")), seed=seed),
        },
        "restored": {site: _ratio_of_means(per_pair, site, differ, seed=seed) for site in SITES},
        "mean_of_ratios": {site: lh_interval(per_pair[site], seed) for site in SITES},
        "per_pair": per_pair,
    }


def _logit_differences(
    model: ViT,
    clean: torch.Tensor,
    corrupted: torch.Tensor,
    classes: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    batch_size: int,
    progress: Callable | None,
) -> dict[str, torch.Tensor]:
    """The pairs run clean, corrupted and patched, a few pairs at a time: per pair (P,), the classes
    "a" and "b" and the logit differences "clean" and "corrupted"; "patched/heads" (L, heads, P)
    and "patched/tokens" (L, N, P), each unit patched alone from the clean run."""
    device = device_of(model)
    heads = model.config.heads
    tokens = model.num_prefix_tokens + model.grid_size[0] * model.grid_size[1]
    chunk = max(1, batch_size // max(heads, tokens))
    eye = {"heads": torch.eye(heads, dtype=torch.bool), "tokens": torch.eye(tokens, dtype=torch.bool)}
    wrap = progress or (lambda chunks: chunks)
    found: dict[str, list] = {}
    for start in wrap(range(0, len(clean), chunk)):
        x, y = clean[start : start + chunk].to(device), corrupted[start : start + chunk].to(device)
        clean_logits, clean_heads, clean_residual = activations(model, x)
        corrupted_logits = activations(model, y)[0]
        if classes is None:
            a, b = clean_logits.argmax(-1), corrupted_logits.argmax(-1)
        else:
            a, b = classes[0][start : start + chunk], classes[1][start : start + chunk]
        found.setdefault("clean", []).append(logit_difference(clean_logits.float(), a, b).cpu())
        found.setdefault("corrupted", []).append(logit_difference(corrupted_logits.float(), a, b).cpu())
        found.setdefault("a", []).append(a.cpu())
        found.setdefault("b", []).append(b.cpu())
        for site, values in (("heads", clean_heads), ("tokens", clean_residual)):
            per_layer = [
                logit_difference(patched_logits(model, y, layer, site, values[layer], eye[site]), a, b).cpu()
                for layer in range(len(model.blocks))
            ]
            found.setdefault(f"patched/{site}", []).append(torch.stack(per_layer))  # (L, units, B)
    return {k: torch.cat(v, dim=-1) for k, v in found.items()}


def _ratio_of_means(per_pair: dict, site: str, differ: torch.Tensor, *, seed: int) -> list:
    """The ratio of means of `site`'s units over the pairs whose classes `differ`, with its
    interval, as figures [layer][unit]."""
    patched, high, low = per_pair[f"patched/{site}"], per_pair["clean"], per_pair["corrupted"]
    return ratio_figures(*restored_ratio_of_means(patched[..., differ], high[differ], low[differ], seed=seed))
