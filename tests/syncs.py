"""Which operations would make the host wait for a GPU, found on the CPU.

A CUDA host waits for the GPU when it needs a value the GPU computes: `.item()` and `float(t)`
(`_local_scalar_dense`), an output whose size depends on the data (`nonzero`, `unique`,
`masked_select`, indexing with a boolean mask), a copy of a device tensor to the host; and when it
copies a tensor built from Python data (`torch.tensor([...])`, pageable memory) to the device.
`WouldWait` runs any code on the CPU under a `TorchDispatchMode` that follows which tensors would
live on the GPU: those it is given (the weights, the data held there) and everything computed from
them. An operation of the kinds above on such a tensor is recorded with the innermost frames of
this project, torchvision, torchmetrics and Lightning that made it. A random number drawn on the
host, or an optimizer's step counter kept there, follows no device tensor and is not recorded.

What a CPU run cannot see: `.tolist()`, `.numpy()` and `.cpu()` do not dispatch on a CPU tensor,
and a factory call (`torch.zeros(..., device=d)`) made on the host is taken as a host tensor.
"""

from __future__ import annotations

import traceback
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten
# data-dependent output sizes or values read by the host
WAITS = {
    aten._local_scalar_dense.default: "reads a value (.item(), float(), bool(), int())",
    aten.nonzero.default: "nonzero",
    aten.nonzero_static.default: "nonzero",
    aten.masked_select.default: "masked_select",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique",
    aten.repeat_interleave.Tensor: "repeat_interleave by a tensor",
    aten.bincount.default: "bincount (its size is the largest value)",
    aten.equal.default: "torch.equal",
    aten.is_nonzero.default: "a tensor's truth value",
}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
FRESH = {aten.lift_fresh.default, aten.lift_fresh_copy.default}  # torch.tensor(Python data)
WHERE = (
    "vit/",
    "torchvision/",
    "torchmetrics/",
    "lightning/",
    "benchmarks/",
    "studies/",
    "tools/",
    "torch/optim/",
)


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _key(t: torch.Tensor) -> int:
    """A tensor's storage: views and in-place results share it."""
    return t.untyped_storage().data_ptr()


class WouldWait(TorchDispatchMode):
    """`with WouldWait(device_tensors) as watch: ...` then `watch.waits` (a Counter of
    "what: where"). `watch.on = False` pauses the record (the tensors are still followed)."""

    def __init__(self, device_tensors=()):
        super().__init__()
        self.device: set[int] = {_key(t) for t in device_tensors}  # storages on the device
        self.fresh: set[int] = set()  # storages of tensors built from Python data
        self.waits: Counter[str] = Counter()
        self.on = True

    def follow(self, *tensors: torch.Tensor) -> None:
        """These tensors live on the device from now on."""
        self.device.update(_key(t) for t in tensors)

    def _note(self, what: str) -> None:
        if not self.on:
            return
        frames = [f for f in traceback.extract_stack()[:-2] if any(k in f.filename for k in WHERE)]
        where = [
            f"{f.filename.rsplit('site-packages/', 1)[-1].split('/main/')[-1]}:{f.lineno}" for f in frames
        ]
        self.waits[f"{what}: {' <- '.join(where[::-1][:8])}"] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = _tensors((args, kwargs))
        on_device = [t for t in inputs if _key(t) in self.device]
        if on_device:
            if func in WAITS:
                self._note(WAITS[func])
            elif func in INDEXING and any(t.dtype == torch.bool for t in _tensors(args[1:2])):
                self._note("indexing with a boolean mask")
            elif any(_key(t) in self.fresh and t.ndim > 0 for t in inputs):
                self._note("a tensor built from Python data, copied to the device")
            elif func is aten._to_copy.default and kwargs.get("device", torch.device("cpu")).type == "cpu":
                pass  # a CPU run cannot tell a copy to the host from one that stays
        out = func(*args, **(kwargs or {}))
        outputs = _tensors(out)
        for t in outputs:
            key = _key(t)
            if func in FRESH:
                self.fresh.add(key)
                self.device.discard(key)
            elif on_device and func not in WAITS:
                self.device.add(key)
                self.fresh.discard(key)  # a freed storage's address, used again
            elif not any(key == _key(i) for i in inputs):
                # a new storage made from host values alone (a random draw, a factory)
                self.device.discard(key)
                self.fresh.discard(key)
        return out


def training_tensors(trainer) -> list[torch.Tensor]:
    """What a fit on a GPU keeps there: the module's weights and buffers (metrics' states among
    them), the optimizers' states, the data module's splits (and alternating flips' draw) and an
    EMA's average."""
    module, data = trainer.lightning_module, trainer.datamodule
    tensors = [*module.parameters(), *module.buffers()]
    tensors += [
        m for metric in module.modules() if hasattr(metric, "_defaults") for m in _metric_states(metric)
    ]
    for optimizer in trainer.optimizers:
        tensors += [v for state in optimizer.state.values() for k, v in state.items() if k != "step"]
    for split in getattr(data, "splits", {}).values():
        tensors += [split.images, split.labels]
    tensors.append(getattr(data, "mirrored", None))  # alternating flips' draw
    for callback in trainer.callbacks:
        average = getattr(callback, "_average_model", None)
        if average is not None:
            tensors += [*average.parameters(), *average.buffers()]
    return [t for t in tensors if isinstance(t, torch.Tensor) and t.numel()]


def _metric_states(metric) -> list[torch.Tensor]:
    states = [getattr(metric, name) for name in metric._defaults]
    return [t for s in states for t in (s if isinstance(s, list) else [s])]
