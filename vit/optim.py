"""Muon (Jordan et al. 2024, kellerjordan.github.io/posts/muon) on a ViT's block matrices beside
AdamW for the rest, as one optimizer Lightning's automatic optimisation can step.

Muon orthogonalises each 2-D weight's momentum (Newton-Schulz iterations) before the step, so
every direction of the matrix moves at the same rate; it is meant for hidden layers' matrices
only, and torch.optim.Muon takes nothing else. The embeddings, the stem, norms, biases and the
head stay with AdamW, as in Keller Jordan's and airbench94_muon's split.

`Combined` holds the two real torch optimizers in `optimizers`: it steps each, and its
`param_groups` are theirs (the same dicts), so a scheduler scales both learning rates by the same
factor of their own base rates. A step of one's own may call torch's functional `adam` and
`muon` on each optimizer in `optimizers` with their groups and state.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import nn


def block_matrices(model: nn.Module) -> dict[str, nn.Parameter]:
    """The 2-D weights of `model.blocks` (attention's qkv and projection, the MLP's two layers),
    by name: what Muon takes."""
    return {
        name: p
        for name, p in model.named_parameters()
        if name.startswith("blocks.") and p.ndim == 2 and p.requires_grad
    }


class MergedState(Mapping):
    """The optimizers' `state` dicts as one read-only mapping, parameter -> its state (each
    parameter belongs to one optimizer). A lookup never adds an entry, as a defaultdict's would."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers

    def __getitem__(self, p: torch.Tensor) -> dict:
        for optimizer in self.optimizers:
            if p in optimizer.state:
                return optimizer.state[p]
        raise KeyError(p)

    def __iter__(self) -> Iterator[torch.Tensor]:
        for optimizer in self.optimizers:
            yield from optimizer.state

    def __len__(self) -> int:
        return sum(len(optimizer.state) for optimizer in self.optimizers)


class Combined(torch.optim.Optimizer):
    """Several torch optimizers over disjoint parameters, stepped as one (Lightning's automatic
    optimisation takes one optimizer): `param_groups` are the optimizers' own group dicts in
    order, `state` a merged view of theirs, `step` steps each after the closure (if any) and
    `state_dict` holds each one's."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = list(optimizers)
        # torch's constructor sets up the hooks; given the group dicts, it keeps those very dicts
        super().__init__([group for o in self.optimizers for group in o.param_groups], defaults={})
        self.state = MergedState(self.optimizers)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for optimizer in self.optimizers:
            optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [optimizer.state_dict() for optimizer in self.optimizers]}

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict["optimizers"]
        if len(saved) != len(self.optimizers):
            raise ValueError(f"a state of {len(saved)} optimizers for {len(self.optimizers)}")
        for optimizer, state in zip(self.optimizers, saved, strict=True):
            optimizer.load_state_dict(state)
        # loading gives each optimizer new group dicts: the list (which a scheduler reads) follows
        self.param_groups[:] = [group for o in self.optimizers for group in o.param_groups]
