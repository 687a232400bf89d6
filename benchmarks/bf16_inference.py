"""Where bf16 inference on a CPU goes: ours against vit-pytorch, with the parts that differ switched.

    python benchmarks/bf16_inference.py          # about 30 s on 2 cores

Inference of the throughput benchmark's model (32x32, patch 4, width 192, depth 6, 3 heads, MLP
ratio 4, batch 128) under bf16 autocast, interleaved rounds, medians: ours as it runs (SDPA's fused
kernel: `vit.layers.explicit_is_faster` leaves inference to it), ours without the Q, K, V bias
(vit-pytorch has none), ours through the explicit path (what training takes on a CPU in bf16), and
vit-pytorch (`pip install -e ".[bench]"`).
"""

from __future__ import annotations

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
    systems = {
        "ours": (ours, False),
        "ours, no qkv bias": (ViT(preset="cifar", qkv_bias=False, **CONFIG).eval(), False),
        "ours, explicit path": (ours, True),
        "vit-pytorch": (
            VitPytorch(dim=192, depth=6, heads=3, dim_head=64, mlp_dim=768, **CONFIG).eval(),
            False,
        ),
    }
    x = torch.randn(128, 3, 32, 32)
    results = {name: [] for name in systems}
    for model, explicit in systems.values():  # warm-up
        images_per_second(model, x, explicit)
    for _ in range(rounds):
        for name, (model, explicit) in systems.items():
            results[name].append(images_per_second(model, x, explicit))
    peer = statistics.median(results["vit-pytorch"])
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name:<20} {median:7.1f} img/s   {median / peer:.3f}x vit-pytorch")


if __name__ == "__main__":
    main()
