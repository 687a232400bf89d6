"""The patches of an image, for the tools that score and test what a map says: which patches hold
the evidence the data knows (two circles' pixels), how much of a map falls on them, and images
with some patches replaced (by a colour, or by another image's patches).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vit.interpret.maps import attention_weights
from vit.model import ViT


def patch_evidence(model: ViT, pixels: torch.Tensor) -> torch.Tensor:
    """Evidence pixels (B, H, W) -> evidence patches (B, patches): a patch with any evidence."""
    pooled = F.adaptive_max_pool2d(pixels[:, None].float(), model.grid_size)
    return pooled.flatten(1) > 0


def evidence_scores(maps: torch.Tensor, evidence: torch.Tensor) -> dict[str, torch.Tensor]:
    """Relevance mass, rank accuracy and pointing game of maps (..., patches) against evidence
    patches (..., patches) bool: each (...,), NaN for an image without evidence."""
    positive = maps.clamp_min(0)
    mass = (positive * evidence).sum(-1) / positive.sum(-1).clamp_min(1e-12)
    k, hit = evidence.sum(-1), evidence.float()
    # Tied values count as their expectation over a random order of the ties: a map that ties
    # everything scores the evidence's share, wherever the evidence is (a stable sort would favour
    # the patches that come first).
    kth = maps.sort(dim=-1, descending=True).values.gather(-1, (k - 1).clamp_min(0)[..., None])
    above, tied = maps > kth, maps == kth
    room = k - above.sum(-1)  # how many of the tied patches the top k takes
    rank = ((hit * above).sum(-1) + room * (hit * tied).sum(-1) / tied.sum(-1)) / k.clamp_min(1)
    top = maps == maps.amax(-1, keepdim=True)
    pointing = (hit * top).sum(-1) / top.sum(-1)
    none = k == 0
    return {
        "relevance_mass": mass.masked_fill(none, float("nan")),
        "rank_accuracy": rank.masked_fill(none, float("nan")),
        "pointing_game": pointing.masked_fill(none, float("nan")),
    }


def layers_heads_scores(model: ViT, images: torch.Tensor, evidence: torch.Tensor) -> dict[str, torch.Tensor]:
    """Evidence figures (layers, heads, B) of two maps per layer and head: the class token's
    attention (`cls/...`, with a class token) and the evidence patches' attention to the other
    patches (`query/...`: each evidence patch's row without its own column, averaged over them:
    how much the evidence looks at the rest of the evidence)."""
    weights = attention_weights(model, images, batch_size=len(images))  # (L, B, H, T, T)
    prefix = model.num_prefix_tokens
    rows = weights[..., prefix:, prefix:]  # (L, B, H, N, N) patches to patches
    eye = torch.eye(rows.shape[-1], dtype=torch.bool)
    rows = rows.masked_fill(eye, 0.0)
    queries = evidence[None, :, None, :, None].float()
    query_maps = (rows * queries).sum(-2) / queries.sum(-2).clamp_min(1)  # (L, B, H, N)
    scores = {}
    maps = {"query": query_maps}
    if model.cls_token is not None:
        maps["cls"] = weights[..., 0, prefix:]
    for name, m in maps.items():
        for figure, values in evidence_scores(m, evidence[None, :, None].expand_as(m)).items():
            scores[f"{name}/{figure}"] = values.permute(0, 2, 1)  # (L, H, B)
    return scores


def perturbed(images: torch.Tensor, removed: torch.Tensor, fill: torch.Tensor, grid: tuple[int, int]):
    """`images` (B, C, H, W) with the patches in `removed` (..., B, patches) bool set to `fill`:
    a colour (C,), or images (B, C, H, W) whose patches replace them: (..., B, C, H, W)."""
    height, width = images.shape[-2:]
    mask = removed.unflatten(-1, grid).float()
    mask = F.interpolate(mask.flatten(0, -3)[:, None], size=(height, width), mode="nearest")
    mask = mask.view(*removed.shape[:-1], 1, height, width).bool()
    return torch.where(mask, (fill if fill.ndim == images.ndim else fill.view(-1, 1, 1)).to(images), images)
