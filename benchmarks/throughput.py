"""Training and inference throughput of our ViT against timm's and vit-pytorch's, same config.

    python benchmarks/throughput.py                # the README table (CPU here, CUDA when present)
    python benchmarks/throughput.py --rounds 3     # shorter

One training step = forward, cross-entropy, backward, AdamW step. Systems run interleaved after a
warm-up, for several rounds; we report medians. FLOPs per image, of a training step and of an
inference forward pass, come from `torch.utils.flop_counter.FlopCounterMode` (matmuls only, as
usual); the peak is a large square matmul in the same precision (2048 on a CPU, 8192 on a GPU,
where a smaller one underestimates the tensor cores), measured in the same run. The table gives
training's and inference's FLOP/s as shares of that peak. Each precision ends with the target:
ours at least as fast as the fastest peer in training and in inference, with 3% (the spread
between rounds) counting as a tie.

    python benchmarks/throughput.py --model cifar10_gpu --systems ours ours+stem timm vit-pytorch
    python benchmarks/throughput.py --model vit-s16 --batch 256 --json vit-s16.json   # on a GPU

`--model` picks the transformer every system gets: `cifar` (the default: width 192, depth 6,
4x4 patches of 32x32 images), `cifar10_gpu` (configs/cifar10_gpu.yaml's transformer, on plain
patches of its patch size: the token grid of its stem, 64 tokens today) or `vit-s16` (ViT-S/16
on 224x224 images, 1000 classes). `--json PATH` also writes everything measured to PATH, after
each precision: the machine, the model and its config, the run's settings, and per precision the
GEMM peak, each system's images/s, FLOPs and shares of the peak, and the target's verdicts; and
the text printed.

    python benchmarks/throughput.py --systems ours ours+stem timm   # the CPU config's stem and tokens

`ours+stem` is ours with the stem and the patch size that goes with it of the model's config
file (configs/cifar10_cpu.yaml for `cifar`: today five 3x3 convolutions and 16 tokens instead of
64, so less work than `ours`; configs/cifar10_gpu.yaml for `cifar10_gpu`: three convolutions and
the peers' 64 tokens), not a peer; `vit-s16` has none.

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
import json
import statistics
import sys
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: `lab` and `vit` import from the checkout

from lab.machine import hardware  # noqa: E402
from lab.peers import CONFIG, MODULES, PEERS  # noqa: E402
from vit.config import PRESETS  # noqa: E402
from vit.memory import keep_freed_memory  # noqa: E402
from vit.model import ViT  # noqa: E402
from vit.optim import adamw, cpu_has_native_bf16  # noqa: E402

# ViT-S/16 at 224, ImageNet's classes: the ViT paper's small model
VIT_S16 = dict(image_size=224, patch_size=16, **PRESETS["s"], num_classes=1000)
CPU_CONFIG = ROOT / "configs" / "cifar10_cpu.yaml"
GPU_CONFIG = ROOT / "configs" / "cifar10_gpu.yaml"
STEM_OPTIONS = ("conv_stem", "conv_stem_strides", "patch_size")
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}
# The target: ours / the fastest peer, in training and in inference; 0.97 is a tie.
TIE = 0.97
# Operator-name fragments of the matmuls (attention and convolutions included); SDPA's fused
# kernels count as matmuls, softmax and scaling included.
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "scaled_dot_product", "convolution")
COMPILE_MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
# gemm_peak's n per device: a GPU reaches its bf16 peak only on large products (an H100 about
# 800 TFLOP/s at n=8192); 2048 keeps a CPU's measurement to seconds
GEMM_SIZES = {"cpu": 2048, "cuda": 8192}


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_ours(cfg: dict) -> nn.Module:
    return ViT(preset="cifar", **cfg)


def read_vit(path: Path) -> dict:
    """The `model.vit` section of a training config."""
    return yaml.safe_load(path.read_text())["model"]["vit"]


def stem_options(config: Path) -> dict:
    """A training config's stem and the patch size that goes with it (its token grid)."""
    vit = read_vit(config)
    return {name: vit.get(name) for name in STEM_OPTIONS}


def build_ours_with_stem(cfg: dict, config: Path = CPU_CONFIG) -> nn.Module:
    """Ours with the stem of a training config (`stem_options`), the rest `cfg`."""
    return ViT(preset="cifar", **{**cfg, **stem_options(config)})


def plain_transformer(config: Path) -> dict:
    """The transformer of a CIFAR-10 training config (its preset's sizes, where the file gives none)
    on plain patches of its patch size: the token grid of its stem, without the stem, which the
    peers do not have."""
    vit = read_vit(config)
    sizes = {name: vit.get(name, value) for name, value in PRESETS[vit.get("preset", "cifar")].items()}
    return dict(image_size=32, patch_size=vit.get("patch_size", 4), **sizes, num_classes=10)


BUILDERS: dict[str, Callable[[dict], nn.Module]] = {
    "ours": build_ours,
    **PEERS,
    "ours+stem": build_ours_with_stem,  # not a peer; not run by default
}
# --model: the transformer every system gets (read when asked for), and the config whose stem
# `ours+stem` adds to it
MODELS: dict[str, Callable[[], dict]] = {
    "cifar": lambda: CONFIG,
    "cifar10_gpu": partial(plain_transformer, GPU_CONFIG),
    "vit-s16": lambda: VIT_S16,
}
STEM_CONFIGS = {"cifar": CPU_CONFIG, "cifar10_gpu": GPU_CONFIG}


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
        stem_config: Path = CPU_CONFIG,  # where `ours+stem` reads its stem
    ):
        torch.manual_seed(0)
        self.name, self.dtype, self.device = name, dtype, device
        build = partial(build_ours_with_stem, config=stem_config) if name == "ours+stem" else BUILDERS[name]
        self.model = build(cfg).to(device)
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
        return counted_flops(self.eager_gradients)

    @torch.inference_mode()
    def infer_flops(self) -> int:
        """FLOPs of one inference step (the forward pass in eval mode), counted as `train_flops`
        counts them."""
        self.model.eval()
        with self.autocast():
            return counted_flops(lambda: self.model.forward(self.x))


def counted_flops(work: Callable[[], object]) -> int:
    """The FLOPs `torch.utils.flop_counter` counts in `work()`: matmuls and convolutions. SDPA runs
    its math backend meanwhile, which spells attention out as matmuls the counter sees; it does not
    count the CPU flash kernel, so models on SDPA would look cheaper than they are."""
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        work()
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
    dtype: torch.dtype, device: torch.device, n: int | None = None, calls: int = 3, rounds: int = 5
) -> float:
    """FLOP/s of the fastest of several rounds of n x n x n matmuls in `dtype`: the machine's
    dense-math ceiling in that precision. n: the device's `GEMM_SIZES` unless given."""
    n = n or GEMM_SIZES[device.type]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    seconds_per_call(lambda: a @ b, 2, device)
    fastest = min(seconds_per_call(lambda: a @ b, calls, device) for _ in range(rounds))
    return 2 * n**3 / fastest


def measure(
    names,
    precision,
    batch,
    warmup,
    rounds,
    steps,
    device,
    cfg=CONFIG,
    compile=None,
    matmuls_alone=False,
    stem_config=CPU_CONFIG,
) -> dict[str, dict]:
    """Median images/s (training, inference and, with `matmuls_alone`, a training step's matmuls
    alone), FLOPs per image and FLOP/s of training and inference per system, interleaved rounds."""
    dtype = PRECISIONS[precision]
    systems = [System(name, cfg, batch, dtype, device, compile, stem_config) for name in names]
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
        train_flops, infer_flops = system.train_flops() / batch, system.infer_flops() / batch
        train_ips = batch / statistics.median(train[system.name])
        infer_ips = batch / statistics.median(infer[system.name])
        results[system.name] = dict(
            train_ips=train_ips,
            infer_ips=infer_ips,
            matmul_ips=batch / statistics.median(alone[system.name]) if matmuls_alone else None,
            train_flops=train_flops,
            infer_flops=infer_flops,
            train_flops_per_s=train_flops * train_ips,
            infer_flops_per_s=infer_flops * infer_ips,
        )
    return results


def table(precision: str, results: dict[str, dict], peak: float) -> str:
    names = list(results)
    peers = [n for n in names if n in PEERS]
    head = f"{'system':<12} {'train img/s':>11} {'infer img/s':>11} {'GFLOP/img':>9} {'GFLOP/s':>9}"
    alone = all(r["matmul_ips"] is not None for r in results.values())
    head += f" {'train of peak':>13} {'infer of peak':>13}" + (f" {'matmuls alone':>13}" if alone else "")
    head += "".join(f" {'vs ' + p:>14}" for p in peers)
    lines = [f"{precision}: GEMM peak {peak / 1e9:.0f} GFLOP/s; GFLOP/img and GFLOP/s of training", head]
    for name, r in results.items():
        row = (
            f"{name:<12} {r['train_ips']:>11.1f} {r['infer_ips']:>11.1f} {r['train_flops'] / 1e9:>9.3f} "
            f"{r['train_flops_per_s'] / 1e9:>9.1f} {r['train_flops_per_s'] / peak:>13.1%} "
            f"{r['infer_flops_per_s'] / peak:>13.1%}"
        )
        row += f" {r['matmul_ips']:>13.1f}" if alone else ""
        row += "".join(f" {r['train_ips'] / results[p]['train_ips']:>13.2f}x" for p in peers)
        lines.append(row)
    if has_target(results):
        lines.append(target_line(precision, results))
    return "\n".join(lines)


def has_target(results: dict[str, dict]) -> bool:
    """Whether the run has ours and a peer to hold it against."""
    return "ours" in results and any(n in PEERS for n in results)


def verdicts(results: dict[str, dict]) -> dict[str, dict]:
    """The target, per job (training, inference): ours' images/s against the fastest peer's of
    this run, their ratio and the verdict: met (ratio >= 1), tie (within 3%) or missed."""
    ours, jobs = results["ours"], {}
    for column, job in (("train_ips", "training"), ("infer_ips", "inference")):
        peer = max((n for n in results if n in PEERS), key=lambda n: results[n][column])
        ratio = ours[column] / results[peer][column]
        verdict = "met" if ratio >= 1 else "tie" if ratio >= TIE else "missed"
        jobs[job] = dict(
            ours_ips=ours[column], peer=peer, peer_ips=results[peer][column], ratio=ratio, verdict=verdict
        )
    return jobs


def target_line(precision: str, results: dict[str, dict]) -> str:
    """The target's verdicts in one line, and, when measured, ours' training matmuls alone (what
    the step would reach if nothing else took time)."""
    parts = [
        f"{job} {v['ours_ips']:.1f} vs {v['peer']} {v['peer_ips']:.1f} ({v['ratio']:.2f}x, {v['verdict']})"
        for job, v in verdicts(results).items()
    ]
    line = f"{precision} target, ours >= fastest peer ({TIE}x a tie): " + "; ".join(parts)
    alone = results["ours"]["matmul_ips"]
    if alone is not None:
        line += f"; ours' training matmuls alone {alone:.1f} img/s"
    return line


def precision_report(results: dict[str, dict], peak: float) -> dict:
    """One precision's measurements for --json: the peak, each system's figures with their shares
    of the peak, and the target's verdicts (None without ours or a peer)."""
    systems = {
        name: {
            **r,
            "train_share_of_peak": r["train_flops_per_s"] / peak,
            "infer_share_of_peak": r["infer_flops_per_s"] / peak,
        }
        for name, r in results.items()
    }
    return dict(gemm_peak=peak, systems=systems, target=verdicts(results) if has_target(results) else None)


def add_malloc_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--system-malloc", action="store_true",
        help="leave the C library's malloc as it is (vit.memory): memory a step frees goes back to "
        "the system, and the next step takes it again, page fault by page fault",
    )  # fmt: skip


def set_allocator(system_malloc: bool) -> str:
    """What vit's commands do (`vit.memory.keep_freed_memory`), unless `system_malloc`; says which."""
    if system_malloc:
        return "the C library's defaults (--system-malloc)"
    kept = keep_freed_memory()
    return "freed memory kept for the next step (vit.memory)" if kept else "the C library's (not glibc)"


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
    parser.add_argument(
        "--model", default="cifar", choices=list(MODELS),
        help="the transformer every system gets (default: cifar)",
    )  # fmt: skip
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
    parser.add_argument(
        "--json", type=Path, metavar="PATH",
        help="also write everything measured to PATH (JSON), after each precision",
    )  # fmt: skip
    add_malloc_option(parser)
    args = parser.parse_args(argv)
    if args.compile and args.matmuls_alone:
        parser.error("--matmuls-alone replays eager matmuls; a compiled step runs other kernels")
    allocator = set_allocator(args.system_malloc)
    stem_config = STEM_CONFIGS.get(args.model)
    if "ours+stem" in args.systems and stem_config is None:
        parser.error(f"ours+stem: --model {args.model} has no stem; choose {' or '.join(STEM_CONFIGS)}")
    for name in args.systems:
        if name in MODULES:
            try:
                importlib.import_module(MODULES[name])
            except ImportError:
                parser.error(f"{name} needs the {MODULES[name]} package: pip install -e '.[bench]'")
    cfg = MODELS[args.model]()
    device = pick_device()
    stem = stem_options(stem_config) if "ours+stem" in args.systems else None
    lines = [
        hardware(device),
        f"model {args.model}: config {cfg}, batch {args.batch}, {args.rounds} rounds x {args.steps} steps",
        *([f"ours+stem: {stem} from {stem_config.relative_to(ROOT)}"] if stem else []),
        "torch.compile: " + (f"every model, mode {args.compile}" if args.compile else "no (eager)"),
        f"allocator: {allocator}",
    ]
    print("\n".join(lines))
    report = dict(
        hardware=hardware(device),
        torch=torch.__version__,
        device=device.type,
        model=args.model,
        config=cfg,
        stem=stem,
        stem_config=str(stem_config.relative_to(ROOT)) if stem else None,
        batch=args.batch,
        warmup=args.warmup,
        rounds=args.rounds,
        steps=args.steps,
        compile=args.compile,
        allocator=allocator,
        gemm_n=GEMM_SIZES[device.type],
        tie=TIE,
        precisions={},
        text="",  # what was printed: the header and each precision's table
    )
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
            cfg=cfg,
            compile=args.compile,
            matmuls_alone=args.matmuls_alone,
            stem_config=stem_config,
        )
        lines += ["", table(precision, results, peak)]
        print("\n".join(lines[-2:]))
        if args.json:  # after each precision: a run cut short keeps what it measured
            report["precisions"][precision] = precision_report(results, peak)
            report["text"] = "\n".join(lines)
            args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
