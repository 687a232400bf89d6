"""The optimizers and learning-rate schedules of vit-train, behind one factory each:
`build_optimizer` makes the one a classifier's options name (`OptimizerOptions`, which refuses bad
ones in one line), `warmup_decay` its schedule (`warmup_cosine`'s shape). AdamW (`adamw`) and SGD with
Nesterov momentum (`sgd`, also airbench94's: `vit.teacher.airbench_optimizer`) take
`decay_groups`: no weight decay on biases, norms and embeddings.

Muon (Jordan et al. 2024, kellerjordan.github.io/posts/muon) on a ViT's block matrices beside
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
module's `muon` on each optimizer in `optimizers` with their groups and state
(vit/captured_step.py does).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, fields

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from vit.errors import require

OPTIMIZERS = ("adamw", "muon", "sgd")


def block_matrices(model: nn.Module) -> dict[str, nn.Parameter]:
    """The 2-D weights of `model.blocks` (attention's qkv and projection, the MLP's two layers),
    by name: what Muon takes."""
    return {
        name: p
        for name, p in model.named_parameters()
        if name.startswith("blocks.") and p.ndim == 2 and p.requires_grad
    }


def decay_groups(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    layer_decay: float | None = None,
    tensor_lr: bool = False,
    exclude: Collection[str] = (),
) -> list[dict]:
    """The parameter groups of `model` for AdamW or SGD: no weight decay on biases, norms and the
    parameters in `model.no_weight_decay()`, none of the parameters named in `exclude` (another
    optimizer's). With `layer_decay` (a ViT's `layer_of`), a parameter at depth d of a model of
    depth D + 2 learns at lr * layer_decay ** (D + 1 - d): the head at lr, the embeddings slowest
    (BEiT's layer-wise decay, for fine-tuning). With `tensor_lr`, each group's learning rate is a
    tensor on the parameters' device, which the scheduler fills in place (what a compiled step
    reads without recompiling)."""
    skip = getattr(model, "no_weight_decay", set)()
    top = len(model.blocks) + 1 if layer_decay is not None else 0
    groups: dict[tuple[int, bool], list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad or name in exclude:
            continue
        # biases and norm weights are 1-D (a learned attention temperature 0-D); embeddings and
        # the class token are named
        decays = not (p.ndim < 2 or name in skip)
        depth = model.layer_of(name) if layer_decay is not None else 0
        groups.setdefault((depth, decays), []).append(p)
    scale = (lambda depth: layer_decay ** (top - depth)) if layer_decay is not None else (lambda depth: 1.0)
    order = sorted(groups, key=lambda key: (key[0], not key[1]))  # by depth, decayed first
    device = next(model.parameters()).device
    rate = (lambda value: torch.tensor(value, device=device)) if tensor_lr else (lambda value: value)
    return [
        {
            "params": groups[key],
            "weight_decay": weight_decay if key[1] else 0.0,
            "lr": rate(lr * scale(key[0])),
        }
        for key in order
    ]


def adamw(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    layer_decay: float | None = None,
    tensor_lr: bool = False,
    exclude: Collection[str] = (),
) -> torch.optim.AdamW:
    """AdamW over `decay_groups`, fused on a GPU and multi-tensor (foreach) elsewhere; with
    `tensor_lr` its step count is a tensor too (`capturable`)."""
    # one fused kernel for all parameters on a GPU; elsewhere one multi-tensor op at a time
    # (torch's default on a CPU loops over the parameters in Python)
    device = next(model.parameters()).device
    on_gpu = device.type == "cuda"
    return torch.optim.AdamW(
        decay_groups(model, lr, weight_decay, layer_decay, tensor_lr, exclude),
        lr=torch.tensor(lr, device=device) if tensor_lr else lr,
        betas=betas,
        fused=(on_gpu and not tensor_lr) or None,
        foreach=None if on_gpu else not tensor_lr,
        capturable=tensor_lr and on_gpu,
    )


def sgd(groups: list[dict], momentum: float, foreach: bool | None = None) -> torch.optim.SGD:
    """SGD with Nesterov momentum over param `groups`, each with its lr and weight decay: SGD's
    own, L2, added to the gradient before the momentum. airbench's optimizer
    (`vit.teacher.airbench_optimizer`); a ViT whose patches come from a conv stem trains with it
    too (Xiao et al. 2021). `foreach`: torch's choice where None, which on a CPU loops over the
    parameters in Python."""
    return torch.optim.SGD(groups, momentum=momentum, nesterov=True, foreach=foreach)


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


@dataclass(frozen=True)
class OptimizerOptions:
    """A classifier's optimizer options, as it saves them (their defaults and help are its own:
    `vit.classifier.Classifier`), each refused in one line where out of its range or with an
    optimizer it does not go with: `optimizer` names AdamW (`layer_decay` its only user), Muon (at
    `muon_lr` on the block matrices, AdamW at `lr` on the rest) or SGD (Nesterov `momentum`)."""

    optimizer: str
    lr: float
    weight_decay: float
    betas: tuple[float, float]
    layer_decay: float | None
    momentum: float
    muon_lr: float
    muon_momentum: float

    def __post_init__(self):
        lr, layer_decay, optimizer = self.lr, self.layer_decay, self.optimizer
        require(lr > 0, f"lr={lr} must be positive")
        require(self.weight_decay >= 0, f"weight_decay={self.weight_decay} must be >= 0")
        require(all(0 <= b < 1 for b in self.betas), f"betas={self.betas} must lie in [0, 1)")
        require(layer_decay is None or 0 < layer_decay <= 1, f"layer_decay={layer_decay} must lie in (0, 1]")
        require(optimizer in OPTIMIZERS, f"optimizer={optimizer!r} must be 'adamw', 'muon' or 'sgd'")
        require(self.muon_lr > 0, f"muon_lr={self.muon_lr} must be positive")
        require(0 <= self.muon_momentum < 1, f"muon_momentum={self.muon_momentum} must lie in [0, 1)")
        require(0 <= self.momentum < 1, f"momentum={self.momentum} must lie in [0, 1)")
        require(optimizer == "adamw" or layer_decay is None, "layer_decay goes with optimizer=adamw")
        # a feature of recent torch releases (this project is tested with 2.14)
        require(
            optimizer != "muon" or hasattr(torch.optim, "Muon"),
            "optimizer=muon needs torch.optim.Muon (torch >= 2.9)",
        )

    @classmethod
    def of(cls, hparams: Mapping) -> OptimizerOptions:
        """The options among a classifier's hyper-parameters."""
        return cls(**{option.name: hparams[option.name] for option in fields(cls)})


def build_optimizer(
    model: nn.Module, options: OptimizerOptions, tensor_lr: bool = False
) -> torch.optim.Optimizer:
    """The optimizer of `model` that `options` name. With `tensor_lr`, the learning rates are
    tensors, which a captured step (`vit.captured_step`) reads."""
    o, device = options, next(model.parameters()).device
    if o.optimizer == "muon":  # the weight decay is AdamW's, decoupled alike (scaled by each lr)
        matrices = block_matrices(model)
        require(bool(matrices), "optimizer=muon needs transformer blocks (a ViT of depth 1 or more)")
        muon_lr = torch.tensor(o.muon_lr, device=device) if tensor_lr else o.muon_lr
        muon = Muon(matrices.values(), lr=muon_lr, momentum=o.muon_momentum, weight_decay=o.weight_decay)
        rest = adamw(model, o.lr, o.weight_decay, o.betas, exclude=matrices, tensor_lr=tensor_lr)
        return Combined([muon, rest])
    if o.optimizer == "sgd":  # torch's default on a CPU loops over the parameters
        return sgd(
            decay_groups(model, o.lr, o.weight_decay), o.momentum, foreach=device.type != "cuda" or None
        )
    return adamw(model, o.lr, o.weight_decay, o.betas, o.layer_decay, tensor_lr=tensor_lr)


def warmup_cosine(
    progress: float, warmup: float, min_lr_fraction: float, start: float = 0.0, decay: str = "cosine"
) -> float:
    """The learning-rate factor at `progress` (0 to 1) of training: linear warm-up from `start`
    to 1 over the first `warmup` of it, then a cosine (or with `decay="linear"` a straight line,
    airbench's shape) to `min_lr_fraction` at 1 (and after)."""
    if progress < warmup:
        return start + (1 - start) * progress / warmup
    done = min((progress - warmup) / (1 - warmup), 1.0)
    left = 1 - done if decay == "linear" else (1 + math.cos(math.pi * done)) / 2
    return min_lr_fraction + (1 - min_lr_fraction) * left


def warmup_decay(
    optimizer: torch.optim.Optimizer,
    progress: Callable[[int], float],
    total: float,
    warmup_fraction: float,
    min_lr_fraction: float,
    decay: str = "cosine",
) -> LambdaLR:
    """`warmup_cosine` as a scheduler of `optimizer`, at the `progress` of training after each
    optimizer step. With a finite step limit `total`, the warm-up takes whole steps and starts
    from lr / (steps + 1), as LinearLR does; without one (a time budget alone) it takes
    `warmup_fraction` of the time from 0."""
    if math.isfinite(total):
        steps = min(max(int(total * warmup_fraction), 1), int(total) - 1) if total > 1 else 0
        warmup, start = steps / total, 1 / (steps + 1)
    else:
        warmup, start = warmup_fraction, 0.0
    return LambdaLR(
        optimizer, lambda step: warmup_cosine(progress(step), warmup, min_lr_fraction, start, decay)
    )


def check_schedule(warmup_fraction: float, min_lr_fraction: float, decay: str) -> None:
    """`warmup_decay`'s options refused in one line where out of their range."""
    require(0 <= warmup_fraction < 1, f"warmup_fraction={warmup_fraction} must lie in [0, 1)")
    require(0 <= min_lr_fraction <= 1, f"min_lr_fraction={min_lr_fraction} must lie in [0, 1]")
    require(decay in ("cosine", "linear"), f"decay={decay!r} must be 'cosine' or 'linear'")
