"""Where the looking-inside tools read a ViT and write into it: PyTorch hooks at a few points of
each block, for the length of a `with` block (TransformerLens's hook points, without a wrapper
model: the hooks sit on the modules `vit.model` already has).

The points, for block i of `model.blocks`:
- `on_embeddings`: the input of the first block, (B, N, D): patches, positions and prefix tokens;
- `on_heads`: the heads' outputs, concatenated, (B, N, heads * d_head): the input of the block's
  attention output projection `attn.proj` (TransformerLens's `hook_z`);
- `on_mlp`: the MLP branch as it is added to the residual stream, (B, N, D) (after `ls2`);
- `on_residual`: the residual stream after the block, (B, N, D): the block's output;
- `record_attention`: the attention weights (B, heads, N, N), as `attn.attend` computes them on the
  explicit path, which `explicit_attention` switches on.
Each `on_*` gives a (register, hook) pair for `hooks`; its function `fn(x)` reads x and returns None,
or returns what replaces x. `list.append` records; `recorders` records several points at once.
A model of depth 0 (no blocks: the control without attention) has none of these points:
`require_attention` refuses it, here and wherever the tools first read the blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from vit.errors import require
from vit.model import ViT

Fn = Callable[[torch.Tensor], torch.Tensor | None]


def device_of(model: nn.Module) -> torch.device:
    """The device of a model's parameters (the CPU for a model without any)."""
    return next(model.parameters(), torch.empty(0)).device


def model_outputs(model: nn.Module, images: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Logits of `images` (N, C, H, W), `batch_size` at a time, without gradients."""
    device = device_of(model)
    with torch.inference_mode():
        return torch.cat([model(chunk.to(device)).float().cpu() for chunk in images.split(batch_size)])


def require_attention(model: ViT) -> None:
    """A `UsageError` for a ViT without blocks (depth 0): it has no attention to show."""
    require(bool(model.blocks), "this ViT has depth 0 (no transformer blocks): it has no attention to show")


@contextmanager
def hooks(*pairs: tuple[Callable, Callable]):
    """Within the `with` block, each `register(hook)` of `pairs` is in place; removed afterwards."""
    handles = [register(hook) for register, hook in pairs]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def on_embeddings(model: ViT, fn: Fn) -> tuple[Callable, Callable]:
    """The input of the first block."""
    return model.blocks[0].register_forward_pre_hook, lambda module, args: _replaced(fn(args[0]))


def on_heads(block: nn.Module, fn: Fn) -> tuple[Callable, Callable]:
    """The heads' outputs of `block`, concatenated: the input of its attention output projection."""
    return block.attn.proj.register_forward_pre_hook, lambda module, args: _replaced(fn(args[0]))


def on_mlp(block: nn.Module, fn: Fn) -> tuple[Callable, Callable]:
    """The MLP branch of `block`, as it is added to the residual stream."""
    return block.ls2.register_forward_hook, lambda module, args, out: fn(out)


def on_residual(block: nn.Module, fn: Fn) -> tuple[Callable, Callable]:
    """The residual stream after `block`: its output."""
    return block.register_forward_hook, lambda module, args, out: fn(out)


def recorders(
    model: ViT, *points: str
) -> tuple[list[tuple[Callable, Callable]], dict[str, list[torch.Tensor]]]:
    """Hook pairs (for `hooks`) that record each named point ("embeddings", and of every block
    "heads", "mlp", "residual"), and the lists they record into, by point: one tensor a block (a
    forward pass) in the order of the blocks."""
    found: dict[str, list[torch.Tensor]] = {point: [] for point in points}
    per_block = {"heads": on_heads, "mlp": on_mlp, "residual": on_residual}
    unknown = set(points) - {"embeddings", *per_block}
    if unknown:
        raise ValueError(f"no hook point {sorted(unknown)[0]!r}; choose embeddings, {', '.join(per_block)}")
    require_attention(model)
    pairs = [on_embeddings(model, found["embeddings"].append)] if "embeddings" in found else []
    for block in model.blocks:
        pairs += [per_block[point](block, found[point].append) for point in points if point in per_block]
    return pairs, found


def _replaced(x: torch.Tensor | None) -> tuple[torch.Tensor] | None:
    return None if x is None else (x,)  # a forward pre-hook returns the new arguments


@contextmanager
def explicit_attention(model: ViT, layers: Sequence[int]):
    """Within the `with` block, the chosen layers' attention takes its explicit path (its weights
    pass through `attend`, where hooks see them), the model runs in eval mode (dropout off, every
    patch kept) and eagerly where it was compiled in place (`model.compile()`, as `compile: true`
    trains: a compiled graph runs no hooks). Every switch is put back afterwards."""
    attns = [model.blocks[i].attn for i in layers]
    fused, was_training = [attn.fused for attn in attns], model.training
    compiled = model._compiled_call_impl  # set by nn.Module.compile(), else None
    try:
        model.eval()
        model._compiled_call_impl = None
        for attn in attns:
            attn.fused = False
        yield
    finally:
        model._compiled_call_impl = compiled
        model.train(was_training)
        for attn, flag in zip(attns, fused, strict=True):
            attn.fused = flag


@contextmanager
def record_attention(model: ViT, layers: list[int], keep: Callable[[torch.Tensor], torch.Tensor]):
    """Within the `with` block, the attention weights (batch, heads, tokens, tokens) of each chosen
    layer, as its `attend` step computes them on the explicit path, are recorded: `keep(weights)`
    is appended to the yielded dict's list for that layer (vit-pytorch's recorder)."""
    require_attention(model)
    captured: dict[int, list[torch.Tensor]] = {i: [] for i in layers}

    def store(i):
        return lambda module, args, weights: captured[i].append(keep(weights))

    pairs = [(model.blocks[i].attn.attend.register_forward_hook, store(i)) for i in layers]
    with explicit_attention(model, layers), hooks(*pairs):
        yield captured
