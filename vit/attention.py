"""Attention weights and maps from a trained ViT."""

from __future__ import annotations

import torch
from einops import rearrange

from vit.model import ViT


@torch.no_grad()
def attention_weights(model: ViT, images: torch.Tensor) -> torch.Tensor:
    """Weights of every block, (layers, batch, heads, tokens, tokens), from the explicit path.

    The model may normally run the fused path; only this call computes the weights.
    """
    _, weights = model.forward_features(images, return_attention=True)
    return torch.stack(weights).float()


def cls_attention_maps(model: ViT, weights: torch.Tensor) -> torch.Tensor:
    """Class-token attention to each patch, laid out on the patch grid: (..., grid_h, grid_w).

    `weights` is (..., tokens, tokens), for example one layer (batch, heads, tokens, tokens).
    """
    row = weights[..., 0, model.num_prefix_tokens :]  # what the class token looks at
    return rearrange(row, "... (gh gw) -> ... gh gw", gh=model.grid_size[0])
