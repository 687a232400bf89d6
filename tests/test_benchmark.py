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
    compiled = System("ours", TINY, 4, torch.float32, torch.device("cpu"), compile="default")
    assert eager.model._compiled_call_impl is None and compiled.model._compiled_call_impl is not None
    before = [p.detach().clone() for p in compiled.model.parameters()]
    compiled.train_step()
    assert any(not torch.equal(a, p) for a, p in zip(before, compiled.model.parameters(), strict=True))
    assert compiled.train_flops() == eager.train_flops() > 0


def test_matmul_floor_replays_every_matmul_of_a_step():
    """The profile's floor: the step's matmuls recorded (every Linear's forward, one weight gradient
    per Linear, attention forward and backward per block) and replayed alone, faster than the step."""
    from torch import nn

    from benchmarks.profile_step import matmul_floor, page_faults_per_step, record_matmuls

    system = System("ours", TINY, 4, torch.float32, torch.device("cpu"))
    system.train_step()
    names = [func.name() for func, _, _ in record_matmuls(system)]
    linears = sum(isinstance(m, nn.Linear) for m in system.model.modules())
    blocks = TINY["depth"]
    assert names.count("aten::addmm") == linears  # forward, bias included
    assert names.count("aten::mm") >= linears  # backward: weight gradients (and input gradients)
    assert sum("scaled_dot_product" in n for n in names) == 2 * blocks  # forward, backward
    step, alone, count = matmul_floor(system, rounds=3)
    assert count == len(names) and 0 < alone < step
    assert page_faults_per_step(system, steps=1) >= 0


def test_step_variants_compute_what_ours_computes(monkeypatch):
    """benchmarks/step_variants.py: each variant's logits and gradients match ours (the chunked MLP
    over several chunks, the last one partial), and each trains."""
    from benchmarks import step_variants

    monkeypatch.setattr(step_variants.ChunkedMLP, "chunk", 7)  # 4 images x 5 tokens: 3 chunks
    results = step_variants.measure(
        list(step_variants.VARIANTS), "fp32", batch=4, warmup=1, rounds=1, steps=1,
        device=torch.device("cpu"), cfg=TINY,
    )  # fmt: skip
    assert list(results) == list(step_variants.VARIANTS)
    for ips, logits, grads in results.values():
        assert ips > 0 and logits < 1e-5 and grads < 1e-5
