"""A quick run of the benchmark's functions at a tiny size; the real run is benchmarks/throughput.py."""

import importlib.util
import sys

import pytest
import torch
import yaml

from benchmarks.throughput import BUILDERS, CPU_CONFIG, MODULES, TIE, System, gemm_peak, measure, table
from vit.commands.train import cpu_has_native_bf16

TINY = dict(image_size=8, patch_size=4, dim=16, depth=1, heads=2, mlp_ratio=2.0, num_classes=3)
PEERS = [name for name, module in MODULES.items() if importlib.util.find_spec(module)]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_measure_reports_every_system(precision):
    names = ["ours", *PEERS]
    results = measure(
        names, precision, batch=4, warmup=1, rounds=2, steps=1, device=torch.device("cpu"), cfg=TINY,
        matmuls_alone=True,
    )  # fmt: skip
    assert list(results) == names
    for r in results.values():
        assert r["train_ips"] > 0 and r["infer_ips"] > 0 and r["flops"] > 0
        assert r["matmul_ips"] > 0
    # ours and timm compute the same matmuls, so the counter must agree (SDPA counted as matmuls)
    if "timm" in results:
        assert results["ours"]["flops"] == results["timm"]["flops"]
    text = table(precision, results, peak=gemm_peak(torch.float32, torch.device("cpu"), n=64, rounds=1))
    assert all(name in text for name in names)
    if PEERS:  # the target against the fastest peer of the run, in both columns
        faster = max(PEERS, key=lambda n: results[n]["infer_ips"])
        last = text.splitlines()[-1]
        assert last.startswith(f"{precision} target, ours >= fastest peer ({TIE}x a tie): training ")
        assert f"inference {results['ours']['infer_ips']:.1f} vs {faster} " in last
        assert last.endswith(f"ours' training matmuls alone {results['ours']['matmul_ips']:.1f} img/s")


def test_matmuls_alone_refuses_compile(capsys):
    from benchmarks.throughput import main

    with pytest.raises(SystemExit):
        main(["--compile", "--matmuls-alone"])
    assert "a compiled step runs other kernels" in capsys.readouterr().err


def test_a_missing_peer_library_is_a_one_line_error(monkeypatch, capsys):
    from benchmarks.throughput import main

    monkeypatch.setitem(sys.modules, "vit_pytorch", None)  # import vit_pytorch now fails
    with pytest.raises(SystemExit):
        main(["--systems", "ours", "vit-pytorch", "--precisions", "fp32"])
    err = capsys.readouterr().err
    assert "vit-pytorch needs the vit_pytorch package" in err and ".[bench]" in err


@pytest.mark.parametrize("native", [True, False])
def test_bf16_is_timed_by_default_only_where_it_is_native(monkeypatch, capsys, native):
    import benchmarks.throughput as throughput

    monkeypatch.setattr(throughput, "cpu_has_native_bf16", lambda: native)
    cpu = torch.device("cpu")
    assert throughput.precisions_to_time(None, cpu) == (["fp32", "bf16"] if native else ["fp32"])
    assert ("bf16 left out: emulated on this CPU" in capsys.readouterr().out) is not native
    assert throughput.precisions_to_time(["bf16"], cpu) == ["bf16"]  # asked for: timed anyway


def test_every_builder_is_named():
    assert set(BUILDERS) == {"ours", "timm", "vit-pytorch", "ours+stem"}


def test_ours_with_stem_follows_the_cifar10_cpu_config():
    """`ours+stem` times the stem and token grid configs/cifar10_cpu.yaml trains with, whatever
    they become (it once hard-coded a stem the config had left)."""
    config = yaml.safe_load(CPU_CONFIG.read_text())["model"]["vit"]
    model = BUILDERS["ours+stem"](dict(TINY, image_size=32))
    assert model.config.conv_stem == config["conv_stem"]
    assert model.patch_size == config["patch_size"]
    assert model.grid_size == (32 // config["patch_size"],) * 2
    assert model.config.dim == TINY["dim"]  # the rest is the benchmark's


@pytest.mark.slow
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


def test_matmuls_alone_replays_every_matmul_of_a_step_in_its_layouts():
    """profile_step's estimate: the step's matmuls recorded (every Linear's forward; a weight
    gradient per Linear and an input gradient for all but the patch projection, whose input needs
    none; attention forward and backward per block) with inputs in their strides, and replayed."""
    from torch import nn

    from benchmarks.profile_step import matmuls_alone

    system = System("ours", TINY, 4, torch.float32, torch.device("cpu"))
    system.train_step()
    calls = system.matmul_calls()
    names = [func.name() for func, _, _ in calls]
    linears = sum(isinstance(m, nn.Linear) for m in system.model.modules())
    assert names.count("aten::addmm") == linears  # forward, bias included
    assert names.count("aten::mm") == 2 * linears - 1
    sdpa = [args for func, args, _ in calls if "scaled_dot_product" in func.name()]
    assert len(sdpa) == 2 * TINY["depth"]  # forward, backward
    q = sdpa[0][0]  # a view into the fused QKV projection's output: not contiguous
    assert not q.is_contiguous() and q.stride()[-2] == 3 * TINY["dim"]
    step, alone, count = matmuls_alone(system, rounds=3)
    assert count == len(calls) and 0 < alone < step  # the replay is about 1/20 of the step here


def graph_nodes(tensor: torch.Tensor) -> set[str]:
    """Names of the autograd nodes that produced `tensor`."""
    seen, todo = set(), [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo.extend(next_node for next_node, _ in node.next_functions)
    return {type(node).__name__ for node in seen}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_step_variants_compute_what_ours_computes(monkeypatch, precision):
    """benchmarks/step_variants.py: each variant runs its own autograd Function, and its logits and
    gradients match ours (the chunked MLP over several chunks, the last one partial)."""
    from benchmarks import step_variants

    if precision == "bf16" and not cpu_has_native_bf16():
        pytest.skip("oneDNN bf16 not supported on this CPU")
    monkeypatch.setattr(step_variants.ChunkedMLP, "chunk", 7)  # 4 images x 5 tokens: 3 chunks
    functions = {"linear-layouts": "LayoutsLinear", "onednn-bias": "OneDNNLinear"}
    for name, function in {**functions, "chunked-mlp": "ChunkedMLP"}.items():
        system = System("ours", TINY, 4, step_variants.PRECISIONS[precision], torch.device("cpu"))
        step_variants.VARIANTS[name](system.model)
        with system.autocast():
            assert f"{function}Backward" in graph_nodes(system.model(system.x))
    results = step_variants.measure(
        list(step_variants.VARIANTS), precision, batch=4, warmup=1, rounds=1, steps=1,
        device=torch.device("cpu"), cfg=TINY,
    )  # fmt: skip
    assert list(results) == list(step_variants.VARIANTS)
    tolerance = 1e-5 if precision == "fp32" else 2e-2  # bf16: a few roundings of 2^-8
    for _, logits, grads in results.values():
        assert logits < tolerance and grads < tolerance


def test_table_leaves_out_matmuls_alone_unless_measured():
    results = {
        name: dict(train_ips=ips, infer_ips=3 * ips, flops=1e9, flops_per_s=ips * 1e9, matmul_ips=None)
        for name, ips in (("ours", 300.0), ("ours+stem", 280.0), ("timm", 150.0), ("vit-pytorch", 200.0))
    }
    results["timm"]["infer_ips"] = 920.0  # ours infers at 900: 0.98x, a tie
    text = table("bf16", results, peak=1e12)
    assert "matmuls alone" not in text and "vs ours+stem" not in text  # not a peer
    assert text.splitlines()[-1] == (
        "bf16 target, ours >= fastest peer (0.97x a tie): training 300.0 vs vit-pytorch 200.0 (1.50x, met); "
        "inference 900.0 vs timm 920.0 (0.98x, tie)"
    )
    results["timm"]["infer_ips"] = 1000.0
    assert table("bf16", results, peak=1e12).splitlines()[-1].endswith("(0.90x, missed)")
    for r in results.values():
        r["matmul_ips"] = 450.0
    text = table("bf16", results, peak=1e12)
    assert "matmuls alone" in text.splitlines()[1]
    assert text.splitlines()[-1].endswith("ours' training matmuls alone 450.0 img/s")
