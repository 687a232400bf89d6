"""A quick run of the benchmark's functions at a tiny size; the real run is benchmarks/throughput.py."""

import importlib.util

import pytest
import torch

from benchmarks.throughput import BUILDERS, System, gemm_peak, measure, table

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


def test_compile_compiles_every_system_and_counts_the_eager_flops():
    """`--compile`: each model trains through torch.compile, and its FLOPs are counted on the eager
    forward (the counter does not see inside compiled code), so they equal the uncompiled count."""
    eager = System("ours", TINY, 4, torch.float32, torch.device("cpu"))
    compiled = System("ours", TINY, 4, torch.float32, torch.device("cpu"), compile=True)
    assert eager.model._compiled_call_impl is None and compiled.model._compiled_call_impl is not None
    before = [p.detach().clone() for p in compiled.model.parameters()]
    compiled.train_step()
    assert any(not torch.equal(a, p) for a, p in zip(before, compiled.model.parameters(), strict=True))
    assert compiled.train_flops() == eager.train_flops() > 0
