"""Where bf16 inference on a CPU goes: ours against vit-pytorch, with the parts that differ switched.

    python benchmarks/bf16_inference.py          # about a minute on 2 cores (compilation included)

Inference of the throughput benchmark's model (32x32, patch 4, width 192, depth 6, 3 heads, MLP
ratio 4, batch 128) under bf16 autocast, interleaved rounds, medians: ours as it runs (SDPA's fused
kernel: `vit.layers.explicit_is_faster` leaves inference to it), ours without the Q, K, V bias
(vit-pytorch has none), ours through the explicit path (what training takes on a CPU in bf16), ours
through torch.compile (default mode; and max-autotune with inductor's freezing, the weights
folded in as constants and prepacked for oneDNN), and vit-pytorch (`pip install -e ".[bench]"`).
The first two calls of each are timed apart: a compiled model's compilation, and the number of
images after which it has paid for itself (its seconds against the images/s it gains over ours).
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

import vit.model
from vit.memory import keep_freed_memory
from vit.model import ViT

CONFIG = dict(image_size=32, patch_size=4, num_classes=10)


def images_per_second(
    model: torch.nn.Module, x: torch.Tensor, explicit: bool = False, calls: int = 3
) -> float:
    rule = vit.model.explicit_is_faster
    if explicit:  # every Attention takes the explicit path
        vit.model.explicit_is_faster = lambda q: True
    try:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            start = time.perf_counter()
            for _ in range(calls):
                model(x)
            return calls * len(x) / (time.perf_counter() - start)
    finally:
        vit.model.explicit_is_faster = rule


def main(rounds: int = 9) -> None:
    try:
        from vit_pytorch import ViT as VitPytorch
    except ImportError:
        raise SystemExit("error: the peer needs vit-pytorch: pip install -e '.[bench]'") from None

    keep_freed_memory()  # as vit's commands do
    torch.manual_seed(0)
    ours = ViT(preset="cifar", **CONFIG).eval()
    # name -> (model, explicit path, inductor's freezing: weights folded in and prepacked)
    systems = {
        "ours": (ours, False, False),
        "ours, no qkv bias": (ViT(preset="cifar", qkv_bias=False, **CONFIG).eval(), False, False),
        "ours, explicit path": (ours, True, False),
        "ours, compiled": (torch.compile(copy.deepcopy(ours)), False, False),
        "ours, frozen, max-autotune": (torch.compile(copy.deepcopy(ours), mode="max-autotune"), False, True),
        "vit-pytorch": (
            VitPytorch(dim=192, depth=6, heads=3, dim_head=64, mlp_dim=768, **CONFIG).eval(),
            False,
            False,
        ),
    }
    x = torch.randn(128, 3, 32, 32)
    results = {name: [] for name in systems}
    warmup = {}  # seconds of the first calls: a compiled model's compilation
    for name, (model, explicit, freezing) in systems.items():
        start = time.perf_counter()
        with torch._inductor.config.patch(freezing=freezing):  # read when the first call compiles
            images_per_second(model, x, explicit, calls=2)
        warmup[name] = time.perf_counter() - start
    for _ in range(rounds):
        for name, (model, explicit, _) in systems.items():
            results[name].append(images_per_second(model, x, explicit))
    peer, eager = statistics.median(results["vit-pytorch"]), statistics.median(results["ours"])
    for name, values in results.items():
        median = statistics.median(values)
        line = f"{name:<27} {median:7.1f} img/s   {median / peer:.3f}x vit-pytorch"
        line += f"   first 2 calls {warmup[name]:5.1f} s"
        if name in ("ours, compiled", "ours, frozen, max-autotune") and median > eager:
            compiling = max(warmup[name] - warmup["ours"], 0.0)
            line += f"; pays after {compiling / (1 / eager - 1 / median):,.0f} images"
        print(line)


if __name__ == "__main__":
    main()
