"""Variants of our training step that compute the same thing, timed against it: ideas for a faster
step on CPU (`onednn-bias` is CPU only), measured in the step rather than in isolation.

    python -m benchmarks.step_variants --precision bf16

- `linear-layouts`: every Linear's backward with the other operand layouts (the input gradient
  against a contiguous copy of W^T, the weight gradient computed as (x^T g)^T).
- `onednn-bias`: every Linear's forward through oneDNN with the bias added inside the matmul
  (`torch.ops.mkldnn._linear_pointwise`) instead of `addmm`, which first copies the bias into
  the output.
- `chunked-mlp`: the MLP run over 2080 tokens (32 images; `--mlp_chunk`) at a time, so that its
  4x-wide hidden layer is 1.6 M values at a time instead of 6.4 M and stays in a nearer cache;
  the backward recomputes it (one extra matmul per block).
- `compiled`, `compiled-max-autotune`: the network through `torch.compile` (inductor: LayerNorm,
  GELU, softmax, casts and adds fused into C++ loops around oneDNN's matmuls; with max-autotune,
  each matmul also tried as inductor's own C++ GEMM template, AMX where the CPU has it, its
  epilogue fused), what `--model.compile true` / `max-autotune` does in vit-train.
Systems run interleaved after a warm-up, like benchmarks/throughput.py; medians are reported,
with the largest difference of a variant's logits and parameter gradients from ours on the same
batch and weights, relative to the largest of ours (bf16 rounding is about 4e-3).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.throughput import PRECISIONS, System, pick_device, seconds_per_call
from lab.peers import CONFIG
from vit.memory import keep_freed_memory
from vit.model import FeedForward


def autocast_free(device_type: str, fn: Callable, *tensors: torch.Tensor) -> torch.Tensor:
    """Runs `fn` (a custom autograd Function) on `tensors` cast as autocast would cast a matmul's
    inputs, with autocast off inside (custom Functions see the cast tensors)."""
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        tensors = [t.to(dtype) for t in tensors]
        with torch.autocast(device_type, enabled=False):
            return fn(*tensors)
    return fn(*tensors)


def linear_backward(ctx, grad: torch.Tensor, layouts: bool):
    """Gradients of F.linear(x, weight, bias): the ones autograd asks for."""
    x, weight = ctx.saved_tensors
    need_x, need_w, need_b = ctx.needs_input_grad
    g = grad.reshape(-1, grad.shape[-1])
    x2 = x.reshape(-1, x.shape[-1])
    grad_x = grad_w = grad_b = None
    if need_x:  # layouts: W^T made contiguous (a copy of the weight per call)
        grad_x = (g @ weight.t().contiguous().t() if layouts else g @ weight).view(x.shape)
    if need_w:  # layouts: a transposed gradient, which autograd copies into the weight's layout
        grad_w = (x2.t() @ g).t() if layouts else g.t() @ x2
    if need_b:
        grad_b = g.sum(0)
    return grad_x, grad_w, grad_b


class LayoutsLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        return linear_backward(ctx, grad, layouts=True)


class OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    @staticmethod
    def backward(ctx, grad):
        return linear_backward(ctx, grad, layouts=False)


class ChunkedMLP(torch.autograd.Function):
    """fc2(gelu(fc1(x))) over `chunk` tokens at a time; saves only x, recomputes the rest."""

    chunk = 2080

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2):
        x2 = x.reshape(-1, x.shape[-1])
        out = x2.new_empty(x2.shape[0], w2.shape[0])
        n = ChunkedMLP.chunk
        for i in range(0, len(x2), n):
            torch.addmm(b2, F.gelu(F.linear(x2[i : i + n], w1, b1)), w2.t(), out=out[i : i + n])
        ctx.save_for_backward(x, w1, b1, w2)
        return out.view(*x.shape[:-1], -1)

    @staticmethod
    def backward(ctx, grad):
        x, w1, b1, w2 = ctx.saved_tensors
        x2, g2 = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
        grad_x = torch.empty_like(x2)
        # summed over the chunks in fp32; in bf16 each chunk's product is rounded to bf16 first,
        # so the gradients differ from one matmul's by about bf16's rounding
        grad_w1, grad_b1, grad_w2 = (torch.zeros_like(t, dtype=torch.float32) for t in (w1, b1, w2))
        n = ChunkedMLP.chunk
        for i in range(0, len(x2), n):
            xc, gc = x2[i : i + n], g2[i : i + n]
            hidden = F.linear(xc, w1, b1)
            grad_w2 += gc.t() @ F.gelu(hidden)
            grad_hidden = torch.ops.aten.gelu_backward(gc @ w2, hidden)
            grad_w1 += grad_hidden.t() @ xc
            grad_b1 += grad_hidden.sum(0)
            torch.mm(grad_hidden, w1, out=grad_x[i : i + n])
        return grad_x.view(x.shape), grad_w1, grad_b1, grad_w2, g2.sum(0)


def compiled(mode: str | None = None) -> Callable[[nn.Module], None]:
    return lambda model: model.compile(mode=mode)  # in place: the first steps compile


def linear_variant(function: type[torch.autograd.Function]) -> Callable[[nn.Module], None]:
    def apply(model: nn.Module) -> None:
        for m in model.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                m.forward = lambda x, m=m: autocast_free(x.device.type, function.apply, x, m.weight, m.bias)

    return apply


def chunked_mlp(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, FeedForward):  # fc1, GELU, fc2, each followed by dropout
            assert m.drop.p == 0, "the chunked MLP has no dropout"
            fc1, fc2 = m.fc1, m.fc2
            args = (fc1.weight, fc1.bias, fc2.weight, fc2.bias)
            m.forward = lambda x, args=args: autocast_free(x.device.type, ChunkedMLP.apply, x, *args)


VARIANTS: dict[str, Callable[[nn.Module], None] | None] = {
    "ours": None,
    "linear-layouts": linear_variant(LayoutsLinear),
    "onednn-bias": linear_variant(OneDNNLinear),
    "chunked-mlp": chunked_mlp,
    "compiled": compiled(),
    "compiled-max-autotune": compiled("max-autotune"),
}


def outputs(system: System) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits and parameter gradients of one forward and backward (no optimizer step)."""
    with system.autocast():
        logits = system.model(system.x)
    F.cross_entropy(logits, system.y).backward()
    grads = [p.grad.float() for p in system.model.parameters()]
    system.optimizer.zero_grad(set_to_none=True)
    return logits.detach().float(), grads


def difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """Largest elementwise difference, relative to the largest value of `b`, over tensors."""
    pairs = zip(a, b, strict=True)
    return max(((x - y).abs().max() / y.abs().max().clamp_min(1e-30)).item() for x, y in pairs)


def measure(names, precision, batch, warmup, rounds, steps, device, cfg=CONFIG) -> dict[str, tuple]:
    """Median training images/s per variant (interleaved rounds), and how far its logits and
    gradients are from ours on the same batch and weights (relative to ours)."""
    dtype = PRECISIONS[precision]
    systems = {}
    for name in names:
        system = System("ours", cfg, batch, dtype, device)  # same seed: same weights, same batch
        if VARIANTS[name] is not None:
            VARIANTS[name](system.model)
        systems[name] = system
    logits, grads = outputs(systems["ours"])
    diffs = {}
    for name, system in systems.items():
        variant_logits, variant_grads = outputs(system)
        diffs[name] = (difference([variant_logits], [logits]), difference(variant_grads, grads))
    for system in systems.values():
        for _ in range(warmup):
            system.train_step()
    times = {name: [] for name in systems}
    for _ in range(rounds):
        for name, system in systems.items():
            times[name].append(seconds_per_call(system.train_step, steps, device))
    return {name: (batch / statistics.median(times[name]), *diffs[name]) for name in systems}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--precision", default="bf16", choices=list(PRECISIONS))
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--mlp_chunk", type=int, default=ChunkedMLP.chunk, help="tokens per chunk")
    args = parser.parse_args(argv)
    ChunkedMLP.chunk = args.mlp_chunk
    keep_freed_memory()  # as vit's commands do
    names = ["ours", *[v for v in args.variants if v != "ours"]]
    results = measure(names, args.precision, args.batch, args.warmup, args.rounds, args.steps, pick_device())
    print(f"{args.precision}, batch {args.batch}, {args.rounds} interleaved rounds x {args.steps} steps")
    print(f"{'variant':<16} {'train img/s':>11} {'vs ours':>8} {'logits diff':>11} {'grads diff':>10}")
    for name, (ips, logits, grads) in results.items():
        print(f"{name:<16} {ips:>11.1f} {ips / results['ours'][0]:>7.3f}x {logits:>11.1e} {grads:>10.1e}")


if __name__ == "__main__":
    main()
