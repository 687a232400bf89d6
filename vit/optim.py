"""Muon (Jordan et al. 2024, kellerjordan.github.io/posts/muon) on a ViT's block matrices beside
AdamW for the rest, as one optimizer Lightning's automatic optimisation can step.

Muon orthogonalises each 2-D weight's momentum (Newton-Schulz iterations) before the step, so
every direction of the matrix moves at the same rate; it is meant for hidden layers' matrices
only, and torch.optim.Muon takes nothing else. The embeddings, the stem, norms, biases and the
head stay with AdamW, as in Keller Jordan's and airbench94_muon's split.

`Muon` is torch.optim.Muon with its Newton-Schulz iterations in bf16 only where bf16 matrix
products are native (a GPU, a CPU with AVX-512 BF16 or AMX); torch's run them in bf16 everywhere,
which an AVX2-only CPU emulates: there they took more than half of a training step's time.

`Combined` holds the two real torch optimizers in `optimizers`: it steps each, and its
`param_groups` are theirs (the same dicts), so a scheduler scales both learning rates by the same
factor of their own base rates. A step of one's own may call torch's functional `adam` and this
module's `muon` on each optimizer in `optimizers` with their groups and state (vit/step.py does).
"""

from __future__ import annotations

import math
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


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AVX-512 BF16 or AMX, oneDNN's check);
    an AVX2-only CPU emulates them, many times slower than fp32."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def orthogonalise(update: torch.Tensor, coefficients, steps: int, eps: float, dtype) -> torch.Tensor:
    """Muon's Newton-Schulz iterations in `dtype` (torch's `_zeropower_via_newtonschulz`, the same
    calls, which always take bf16): `update` scaled to a spectral norm of at most 1, then `steps`
    times X <- aX + (bG + cG^2)X with G = XX^T, on the wide side."""
    a, b, c = coefficients
    tall = update.size(0) > update.size(1)
    x = update.to(dtype).T if tall else update.to(dtype)
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def muon(
    params, grads, momentum_buffers, *, lr, weight_decay, momentum, nesterov, ns_coefficients, ns_steps,
    eps, adjust_lr_fn, dtype=torch.bfloat16,
) -> None:  # fmt: skip
    """Muon's step on each parameter (torch's functional `muon`, its iterations in `dtype`):
    momentum, Nesterov's look-ahead, the orthogonalised update, decoupled weight decay, and a
    learning rate scaled by the matrix's shape. `lr` may be a tensor (the captured step's)."""
    for param, grad, buffer in zip(params, grads, momentum_buffers, strict=True):
        buffer.lerp_(grad, 1 - momentum)
        update = grad.lerp(buffer, momentum) if nesterov else buffer
        update = orthogonalise(update, ns_coefficients, ns_steps, eps, dtype)
        param.mul_(1 - lr * weight_decay)
        param.add_(update, alpha=-lr * lr_ratio(adjust_lr_fn, *param.shape))


def lr_ratio(adjust_lr_fn: str | None, rows: int, columns: int) -> float:
    """What Muon's learning rate is multiplied by for a matrix of this shape (torch's `_adjust_lr`)."""
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, columns))
    if adjust_lr_fn == "spectral_unclamped":
        return math.sqrt(rows / columns)
    return math.sqrt(max(1, rows / columns))  # None or "original": Keller Jordan's


# a Muon param group's options that `muon` takes
MUON_OPTIONS = (
    "lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "ns_steps", "eps", "adjust_lr_fn",
)  # fmt: skip


def muon_options(optimizer: torch.optim.Optimizer, group: dict) -> dict:
    """What `muon` takes for a param group of `optimizer` (a `Muon`, or torch's: bf16 iterations)."""
    dtype = getattr(optimizer, "ns_dtype", torch.bfloat16)
    return {**{name: group[name] for name in MUON_OPTIONS}, "dtype": dtype}


def closure_loss(closure) -> torch.Tensor | None:
    """An optimizer step's `closure()` with gradients on, as torch's optimizers call it; None without one."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class Muon(torch.optim.Muon):
    """torch.optim.Muon (its options, checks and state) stepping with `muon`, its Newton-Schulz
    iterations in `ns_dtype`: bf16, as torch's, unless every parameter is on a CPU whose bf16 is
    emulated, where fp32 (decided when it is built, after Lightning has moved the model)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        on_cpu = all(p.device.type == "cpu" for group in self.param_groups for p in group["params"])
        self.ns_dtype = torch.float32 if on_cpu and not cpu_has_native_bf16() else torch.bfloat16

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if "momentum_buffer" not in self.state[p]:  # made once, not at every step
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)
            buffers = [self.state[p]["momentum_buffer"] for p in params]
            muon(params, [p.grad for p in params], buffers, **muon_options(self, group))
        return loss


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
        loss = closure_loss(closure)
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
