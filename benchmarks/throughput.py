"""Training and inference throughput of our ViT against timm's and vit-pytorch's, same config.

    python benchmarks/throughput.py                # the README table (CPU here, CUDA when present)
    python benchmarks/throughput.py --rounds 3     # shorter

One training step = forward, cross-entropy, backward, AdamW step. Systems run interleaved after a
warm-up, for several rounds; we report medians. Training FLOPs per image come from
`torch.utils.flop_counter.FlopCounterMode` (matmuls only, as usual); the peak is a
large square matmul in the same precision, measured in the same run. Each precision ends with
issue 16's target: ours at least as fast as the fastest peer in training and in inference, with
3% (the spread between rounds) counting as a tie.

    python benchmarks/throughput.py --systems ours ours+stem timm   # the CPU config's stem and tokens

`ours+stem` is ours with configs/cifar10_cpu.yaml's stem and the patch size that goes with it
(read from the file: today three 3x3 stride-2 convolutions and 16 tokens instead of 64, so less
work than `ours`), not a peer.

    python benchmarks/throughput.py --matmuls-alone   # adds a column: each step's matmuls alone

`--matmuls-alone` records the matmul calls of one training step of each system (with copies of
their inputs) after the timed rounds, and replays them back to back, systems interleaved, for as
many rounds: how fast the step would be, with the same (eager) kernels, if nothing else (norms,
activations, softmax, casts, adds, the optimizer) took time. Not with `--compile`: a compiled
step runs other kernels.
Peers: `pip install -e ".[bench]"`.
"""

from __future__ import annotations

import argparse
import importlib
import platform
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from vit.classifier import adamw
from vit.commands.train import cpu_has_native_bf16
from vit.model import ViT

# The configuration: CIFAR-sized images, a ViT-Ti-wide model of 6 blocks.
CONFIG = dict(image_size=32, patch_size=4, dim=192, depth=6, heads=3, mlp_ratio=4.0, num_classes=10)
# `ours+stem` takes these from the CIFAR-10 CPU config
CPU_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "cifar10_cpu.yaml"
STEM_OPTIONS = ("conv_stem", "conv_stem_strides", "patch_size")
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Issue 16's target: ours / the fastest peer, in training and in inference; 0.97 is a tie.
TIE = 0.97
# Operator-name fragments of the matmuls (attention and convolutions included); SDPA's fused
# kernels count as matmuls, softmax and scaling included.
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "scaled_dot_product", "convolution")
COMPILE_MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_ours(cfg: dict) -> nn.Module:
    return ViT(preset="cifar", **cfg)


def build_ours_with_stem(cfg: dict) -> nn.Module:
    """Ours with the CIFAR-10 CPU config's stem and patch size (its token grid), the rest `cfg`."""
    vit = yaml.safe_load(CPU_CONFIG.read_text())["model"]["vit"]
    return ViT(preset="cifar", **{**cfg, **{name: vit.get(name) for name in STEM_OPTIONS}})


def build_timm(cfg: dict) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        img_size=cfg["image_size"], patch_size=cfg["patch_size"], num_classes=cfg["num_classes"],
        embed_dim=cfg["dim"], depth=cfg["depth"], num_heads=cfg["heads"], mlp_ratio=cfg["mlp_ratio"],
    )  # fmt: skip


def build_vit_pytorch(cfg: dict) -> nn.Module:
    from vit_pytorch import ViT

    return ViT(
        image_size=cfg["image_size"], patch_size=cfg["patch_size"], num_classes=cfg["num_classes"],
        dim=cfg["dim"], depth=cfg["depth"], heads=cfg["heads"], dim_head=cfg["dim"] // cfg["heads"],
        mlp_dim=int(cfg["dim"] * cfg["mlp_ratio"]),
    )  # fmt: skip


BUILDERS: dict[str, Callable[[dict], nn.Module]] = {
    "ours": build_ours,
    "timm": build_timm,
    "vit-pytorch": build_vit_pytorch,
    "ours+stem": build_ours_with_stem,  # not a peer; not run by default
}
PEERS = ("timm", "vit-pytorch")
MODULES = {"timm": "timm", "vit-pytorch": "vit_pytorch"}  # what each peer imports


def make_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    """Ours uses the optimizer of `ViTClassifier`; the peers torch's default AdamW, as their users would."""
    if name not in PEERS:
        return adamw(model, lr=1e-3, weight_decay=0.05)
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)


class System:
    """One model with its optimizer and a fixed batch on one device, in one precision."""

    def __init__(
        self,
        name: str,
        cfg: dict,
        batch: int,
        dtype: torch.dtype,
        device: torch.device,
        compile: str | None = None,
    ):
        torch.manual_seed(0)
        self.name, self.dtype, self.device = name, dtype, device
        self.model = BUILDERS[name](cfg).to(device)
        if compile:  # in place: the parameters keep their names; the first steps compile
            self.model.compile(mode=compile)
        self.optimizer = make_optimizer(name, self.model)
        size = cfg["image_size"]
        self.x = torch.randn(batch, 3, size, size, device=device)
        self.y = torch.randint(cfg["num_classes"], (batch,), device=device)

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)

    def train_step(self) -> None:
        self.model.train()
        with self.autocast():
            loss = F.cross_entropy(self.model(self.x), self.y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    @torch.inference_mode()
    def infer_step(self) -> None:
        self.model.eval()
        with self.autocast():
            self.model(self.x)

    def eager_gradients(self) -> None:
        """Forward and backward of one training step, without the optimizer step, the gradients
        dropped: the work that `matmul_calls` and `train_flops` look inside. `.forward` runs a
        compiled model eagerly, where a dispatch mode sees every operator."""
        self.model.train()
        with self.autocast():
            loss = F.cross_entropy(self.model.forward(self.x), self.y)
        loss.backward()
        self.optimizer.zero_grad(set_to_none=True)

    def matmul_calls(self) -> list:
        """The matmul calls of one training step (forward and backward; the optimizer has none), in
        order, with copies of their inputs."""
        with MatmulRecorder() as recorder:
            self.eager_gradients()
        return recorder.calls

    def train_flops(self) -> int:
        """FLOPs of one training step (forward + backward; the optimizer's are negligible)."""
        # The math backend spells attention out as matmuls, which the counter sees; it does not
        # count the CPU flash kernel, so systems on SDPA would look cheaper than they are.
        with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
            self.eager_gradients()
        return counter.get_total_flops()


def copy_strided(tensor: torch.Tensor) -> torch.Tensor:
    """A copy with the same sizes and strides (clone() makes non-dense views contiguous)."""
    copy = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=tensor.device)
    return copy.copy_(tensor)


class MatmulRecorder(TorchDispatchMode):
    """Records every matmul operator (`MATMULS`) run inside it, with a copy of its inputs in the
    same strides, so that they can be run again without the rest."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(part in func.name() for part in MATMULS):
            copy = [copy_strided(a) if isinstance(a, torch.Tensor) else a for a in args]
            self.calls.append((func, copy, kwargs))
        return func(*args, **kwargs)


def replay(calls: list) -> None:
    """Runs recorded calls again, back to back."""
    for func, args, kwargs in calls:
        func(*args, **kwargs)


def seconds_per_call(fn: Callable[[], None], calls: int, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / calls


def gemm_peak(
    dtype: torch.dtype, device: torch.device, n: int = 2048, calls: int = 3, rounds: int = 5
) -> float:
    """FLOP/s of the fastest of several rounds of n x n x n matmuls in `dtype`: the machine's
    dense-math ceiling in that precision."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    seconds_per_call(lambda: a @ b, 2, device)
    fastest = min(seconds_per_call(lambda: a @ b, calls, device) for _ in range(rounds))
    return 2 * n**3 / fastest


def measure(
    names, precision, batch, warmup, rounds, steps, device, cfg=CONFIG, compile=None, matmuls_alone=False
) -> dict[str, dict]:
    """Median images/s (training, inference and, with `matmuls_alone`, a training step's matmuls
    alone), FLOPs and FLOP/s per system, interleaved rounds."""
    dtype = PRECISIONS[precision]
    systems = [System(name, cfg, batch, dtype, device, compile) for name in names]
    for system in systems:
        for _ in range(warmup):
            system.train_step()
            system.infer_step()
    train = {s.name: [] for s in systems}
    infer = {s.name: [] for s in systems}
    alone = {s.name: [] for s in systems}
    for _ in range(rounds):
        for system in systems:
            train[system.name].append(seconds_per_call(system.train_step, steps, device))
            infer[system.name].append(seconds_per_call(system.infer_step, steps, device))
    if matmuls_alone:  # after the timed steps: the copies (GBs at batch 128) would weigh on them
        calls = {s.name: s.matmul_calls() for s in systems}
        for _ in range(rounds):
            for name, mm in calls.items():
                alone[name].append(seconds_per_call(partial(replay, mm), steps, device))
        del calls
    results = {}
    for system in systems:
        flops = system.train_flops() / batch
        train_ips = batch / statistics.median(train[system.name])
        results[system.name] = dict(
            train_ips=train_ips,
            infer_ips=batch / statistics.median(infer[system.name]),
            matmul_ips=batch / statistics.median(alone[system.name]) if matmuls_alone else None,
            flops=flops,
            flops_per_s=flops * train_ips,
        )
    return results


def table(precision: str, results: dict[str, dict], peak: float) -> str:
    names = list(results)
    peers = [n for n in names if n in PEERS]
    head = f"{'system':<12} {'train img/s':>11} {'infer img/s':>11} {'GFLOP/img':>9} {'GFLOP/s':>8}"
    alone = all(r["matmul_ips"] is not None for r in results.values())
    head += f" {'of peak':>7}" + (f" {'matmuls alone':>13}" if alone else "")
    head += "".join(f" {'vs ' + p:>14}" for p in peers)
    lines = [f"{precision}: GEMM peak {peak / 1e9:.0f} GFLOP/s", head]
    for name, r in results.items():
        row = (
            f"{name:<12} {r['train_ips']:>11.1f} {r['infer_ips']:>11.1f} {r['flops'] / 1e9:>9.3f} "
            f"{r['flops_per_s'] / 1e9:>8.1f} {r['flops_per_s'] / peak:>7.1%}"
        )
        row += f" {r['matmul_ips']:>13.1f}" if alone else ""
        row += "".join(f" {r['train_ips'] / results[p]['train_ips']:>13.2f}x" for p in peers)
        lines.append(row)
    if "ours" in results and peers:
        lines.append(target_line(precision, results))
    return "\n".join(lines)


def target_line(precision: str, results: dict[str, dict]) -> str:
    """Issue 16's target: ours against the fastest peer of this run, in training and in inference
    (within 3% a tie), and, when measured, its training matmuls alone (what the step would reach
    if nothing else took time)."""
    ours, parts = results["ours"], []
    for column, job in (("train_ips", "training"), ("infer_ips", "inference")):
        peer = max((n for n in results if n in PEERS), key=lambda n: results[n][column])
        ratio = ours[column] / results[peer][column]
        verdict = "met" if ratio >= 1 else "tie" if ratio >= TIE else "missed"
        parts.append(
            f"{job} {ours[column]:.1f} vs {peer} {results[peer][column]:.1f} ({ratio:.2f}x, {verdict})"
        )
    line = f"{precision} target, ours >= fastest peer ({TIE}x a tie): " + "; ".join(parts)
    alone = ours["matmul_ips"]
    if alone is not None:
        line += f"; ours' training matmuls alone {alone:.1f} img/s"
    return line


def hardware(device: torch.device) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
    return f"{name}; {torch.get_num_threads()} threads; torch {torch.__version__}; device {device.type}"


def precisions_to_time(asked: list[str] | None, device: torch.device) -> list[str]:
    """The precisions asked for; by default fp32, and bf16 where the device runs it natively (CUDA,
    or a CPU with AVX-512 BF16 or AMX). Emulated bf16 is many times slower than fp32: on a 2-core
    AMD EPYC with AVX2 only a default run had not finished its bf16 rows after 16 minutes."""
    if asked:
        return asked
    if device.type == "cuda" or cpu_has_native_bf16():
        return list(PRECISIONS)
    print(
        "bf16 left out: emulated on this CPU (no AVX-512 BF16 or AMX), many times slower than "
        "fp32; --precisions fp32 bf16 times it anyway"
    )
    return ["fp32"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", nargs="+", default=["ours", *PEERS], choices=list(BUILDERS))
    parser.add_argument(
        "--precisions", nargs="+", choices=list(PRECISIONS),
        help="default: fp32, and bf16 where it is native (CUDA; CPUs with AVX-512 BF16 or AMX)",
    )  # fmt: skip
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=3, help="training and inference steps per system")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds; medians are reported")
    parser.add_argument("--steps", type=int, default=3, help="steps per system per round")
    parser.add_argument(
        "--compile", nargs="?", const="default", metavar="MODE", choices=COMPILE_MODES,
        help=f"torch.compile every system's model, in this mode: {', '.join(COMPILE_MODES)}",
    )  # fmt: skip
    parser.add_argument(
        "--matmuls-alone", action="store_true",
        help="also time each system's training-step matmuls alone, replayed back to back",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.compile and args.matmuls_alone:
        parser.error("--matmuls-alone replays eager matmuls; a compiled step runs other kernels")
    for name in args.systems:
        if name in MODULES:
            try:
                importlib.import_module(MODULES[name])
            except ImportError:
                parser.error(f"{name} needs the {MODULES[name]} package: pip install -e '.[bench]'")
    device = pick_device()
    print(hardware(device))
    print(f"config {CONFIG}, batch {args.batch}, {args.rounds} rounds x {args.steps} steps")
    print("torch.compile: " + (f"every model, mode {args.compile}" if args.compile else "no (eager)"))
    for precision in precisions_to_time(args.precisions, device):
        peak = gemm_peak(PRECISIONS[precision], device)
        results = measure(
            args.systems,
            precision,
            args.batch,
            args.warmup,
            args.rounds,
            args.steps,
            device,
            compile=args.compile,
            matmuls_alone=args.matmuls_alone,
        )
        print()
        print(table(precision, results, peak))


if __name__ == "__main__":
    main()
