"""A quick run of the benchmark's functions at a tiny size; the real run is benchmarks/throughput.py."""

import importlib.util

import pytest
import torch

from benchmarks.throughput import BUILDERS, gemm_peak, measure, table

TINY = dict(image_size=8, patch_size=4, dim=16, depth=1, heads=2, mlp_ratio=2.0, num_classes=3)
PEERS = [
    name
    for name, module in (("timm", "timm"), ("vit-pytorch", "vit_pytorch"))
    if importlib.util.find_spec(module)
]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_measure_reports_every_system(precision):
    names = ["ours", *PEERS]
    results = measure(
        names, precision, batch=4, warmup=1, rounds=2, steps=1, device=torch.device("cpu"), cfg=TINY
    )
    assert list(results) == names
    for r in results.values():
        assert r["train_ips"] > 0 and r["infer_ips"] > 0 and r["flops"] > 0
    # ours and timm compute the same matmuls, so the counter must agree (SDPA counted as matmuls)
    if "timm" in results:
        assert results["ours"]["flops"] == results["timm"]["flops"]
    text = table(precision, results, peak=gemm_peak(torch.float32, torch.device("cpu"), n=64, rounds=1))
    assert all(name in text for name in names)


def test_every_builder_is_named():
    assert set(BUILDERS) == {"ours", "timm", "vit-pytorch"}


def test_compiled_systems_count_the_same_flops():
    """`--compile`: a compiled model trains, and its FLOPs are counted on the eager forward, so
    they equal the uncompiled count (the counter does not see inside compiled code)."""
    run = dict(precision="fp32", batch=4, warmup=1, rounds=1, steps=1, device=torch.device("cpu"), cfg=TINY)
    eager = measure(["ours"], **run)["ours"]
    compiled = measure(["ours"], **run, compile=True)["ours"]
    assert compiled["flops"] == eager["flops"] > 0 and compiled["train_ips"] > 0
