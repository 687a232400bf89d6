"""The statistics every looking-inside figure reports: a mean with its bootstrap interval, and
Spearman's rank correlation with a permutation p-value and bootstrap intervals. Each interval is a
95% percentile bootstrap (1,000 resamples, seeded), so a figure and its interval are rerun exactly."""

from __future__ import annotations

import math

import torch

SAMPLES = 1000  # bootstrap resamples of every interval
PERMUTATIONS = 10000  # random pairings of a permutation test


def bootstrap(over: str, samples: int = SAMPLES) -> str:
    """How an interval is made, for a protocol's text: "95% percentile bootstrap over images,
    1000 resamples"."""
    return f"95% percentile bootstrap over {over}, {samples} resamples"


def bounds(resampled: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """The 95% percentile interval of bootstrap resamples along `dim` (NaN resamples left out):
    (2, ...), the 2.5% and the 97.5% quantiles."""
    return resampled.double().nanquantile(torch.tensor([0.025, 0.975], dtype=torch.float64), dim=dim)


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """The rank of each value of x (..., n) along the last axis, from 1; ties get their average rank."""
    dtype = x.dtype if x.is_floating_point() else torch.float32
    below = (x[..., None, :] < x[..., :, None]).sum(-1).to(dtype)
    equal = (x[..., None, :] == x[..., :, None]).sum(-1).to(dtype)
    return below + (equal + 1) / 2


def spearman(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spearman's rank correlation of a and b (..., n) along the last axis, ties given their
    average rank: (...,); NaN where either is constant."""
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(-1, keepdim=True), rb - rb.mean(-1, keepdim=True)
    return (ra * rb).sum(-1) / (ra.norm(dim=-1) * rb.norm(dim=-1))


def spearman_test(
    a: torch.Tensor, b: torch.Tensor, permutations: int = PERMUTATIONS, samples: int = SAMPLES, seed: int = 0
) -> dict[str, float]:
    """Spearman's rank correlation of paired values a, b (n,) (pairs with a NaN left out) with its
    uncertainty: "p", two-sided, from `permutations` random pairings of the two ((1 + pairings
    whose |rho| reaches the observed) / (1 + permutations)), and "low", "high", the 95% percentile
    bootstrap interval over the n pairs (`samples` resamples; one whose a or b is constant has no
    rho and is left out)."""
    keep = ~(a.isnan() | b.isnan())
    a, b = a[keep].double(), b[keep].double()
    rho = spearman(a, b).item() if len(a) > 1 else float("nan")
    if math.isnan(rho):
        return {"rho": rho, "p": float("nan"), "low": float("nan"), "high": float("nan"), "n": len(a)}
    g = torch.Generator().manual_seed(seed)
    # a permutation reorders b's ranks, so the ranks are taken once
    shuffled = torch.rand(permutations, len(b), generator=g).argsort(-1)
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    permuted = (ra * rb[shuffled]).sum(-1) / (ra.norm() * rb.norm())
    p = (1 + (permuted.abs() >= abs(rho) - 1e-12).sum().item()) / (1 + permutations)
    picks = torch.randint(len(a), (samples, len(a)), generator=g)
    resampled = spearman(a[picks], b[picks])
    low, high = bounds(resampled).clamp(-1, 1).tolist()
    return {"rho": rho, "p": p, "low": low, "high": high, "n": len(a)}


def spearman_over_images(a: torch.Tensor, b: torch.Tensor, samples: int = SAMPLES, seed: int = 0) -> dict:
    """The 95% percentile bootstrap interval over images of Spearman's rank correlation between the
    per-unit means (over images, NaN left out) of a and b (units, N images): the images are
    resampled, the same for every unit, and the correlation of the means taken again; how much the
    ranking of the units owes to which images were drawn."""
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(a.shape[-1], (samples, a.shape[-1]), generator=g)
    rho = spearman(a[:, picks].nanmean(-1).T.double(), b[:, picks].nanmean(-1).T.double())
    low, high = bounds(rho).clamp(-1, 1).tolist()
    return {"low": low, "high": high}


def as_text(figure: dict) -> str:
    """An `interval` as `mean [low, high]`."""
    return f"{figure['mean']:.3f} [{figure['low']:.3f}, {figure['high']:.3f}]"


def interval(values: torch.Tensor, samples: int = SAMPLES, seed: int = 0) -> dict[str, float]:
    """Mean of per-image `values` (NaN left out) and its 95% percentile bootstrap interval."""
    values = values[~values.isnan()].double()
    if len(values) == 0:
        return {"mean": float("nan"), "low": float("nan"), "high": float("nan")}
    g = torch.Generator().manual_seed(seed)
    means = values[torch.randint(len(values), (samples, len(values)), generator=g)].mean(dim=1)
    low, high = bounds(means).tolist()
    return {"mean": values.mean().item(), "low": low, "high": high}


def lh_interval(values: torch.Tensor, seed: int = 0) -> list[list[dict]]:
    """Per-image values (layers, heads, N) -> figures per layer and head."""
    return [[interval(v, seed=seed) for v in layer] for layer in values]
