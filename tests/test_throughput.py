"""A quick run of the benchmark's functions at a tiny size; the real run is benchmarks/throughput.py."""

import importlib.util
import json
import sys

import pytest
import torch
import yaml

import benchmarks.throughput as throughput
from benchmarks.throughput import (
    BUILDERS,
    CPU_CONFIG,
    GPU_CONFIG,
    MODELS,
    STEM_CONFIGS,
    TIE,
    System,
    gemm_peak,
    main,
    measure,
    table,
)
from lab.peers import MODULES
from vit.config import PRESETS
from vit.optim import cpu_has_native_bf16

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
        assert r["train_ips"] > 0 and r["infer_ips"] > 0 and r["matmul_ips"] > 0
        # backward costs twice the forward, less the patch projection's input gradient
        assert 2 * r["infer_flops"] < r["train_flops"] <= 3 * r["infer_flops"]
        assert r["infer_flops_per_s"] == pytest.approx(r["infer_flops"] * r["infer_ips"])
    # ours and timm compute the same matmuls, so the counter must agree (SDPA counted as matmuls)
    if "timm" in results:
        for flops in ("train_flops", "infer_flops"):
            assert results["ours"][flops] == results["timm"][flops]
    text = table(precision, results, peak=gemm_peak(torch.float32, torch.device("cpu"), n=64, rounds=1))
    assert all(name in text for name in names)
    if PEERS:  # the target against the fastest peer of the run, in both columns
        faster = max(PEERS, key=lambda n: results[n]["infer_ips"])
        last = text.splitlines()[-1]
        assert last.startswith(f"{precision} target, ours >= fastest peer ({TIE}x a tie): training ")
        assert f"inference {results['ours']['infer_ips']:.1f} vs {faster} " in last
        assert last.endswith(f"ours' training matmuls alone {results['ours']['matmul_ips']:.1f} img/s")


def test_matmuls_alone_refuses_compile(capsys):
    with pytest.raises(SystemExit):
        main(["--compile", "--matmuls-alone"])
    assert "a compiled step runs other kernels" in capsys.readouterr().err


def test_a_missing_peer_library_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vit_pytorch", None)  # import vit_pytorch now fails
    with pytest.raises(SystemExit):
        main(["--systems", "ours", "vit-pytorch", "--precisions", "fp32"])
    err = capsys.readouterr().err
    assert "vit-pytorch needs the vit_pytorch package" in err and ".[bench]" in err


@pytest.mark.parametrize("native", [True, False])
def test_bf16_is_timed_by_default_only_where_it_is_native(monkeypatch, capsys, native):
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


def figures(train_ips: float, infer_ips: float) -> dict:
    """A system's results as `measure` gives them: 1 GFLOP per image to train, a third to infer."""
    return dict(
        train_ips=train_ips, infer_ips=infer_ips, matmul_ips=None, train_flops=1e9, infer_flops=1e9 / 3,
        train_flops_per_s=train_ips * 1e9, infer_flops_per_s=infer_ips * 1e9 / 3,
    )  # fmt: skip


def test_table_leaves_out_matmuls_alone_unless_measured():
    results = {
        name: figures(ips, 3 * ips)
        for name, ips in (("ours", 300.0), ("ours+stem", 280.0), ("timm", 150.0), ("vit-pytorch", 200.0))
    }
    results["timm"] = figures(150.0, 920.0)  # ours infers at 900: 0.98x, a tie
    text = table("bf16", results, peak=1e12)
    assert "matmuls alone" not in text and "vs ours+stem" not in text  # not a peer
    # training 300 GFLOP/s and inference 900 / 3 GFLOP/s: 30.0% of the peak each; timm infers 30.7%
    assert "train of peak infer of peak" in text.splitlines()[1]
    assert text.splitlines()[2].split()[5:7] == ["30.0%", "30.0%"]
    assert text.splitlines()[4].split()[5:7] == ["15.0%", "30.7%"]
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


def transformer_shape(name: str, model: torch.nn.Module, images: torch.Tensor) -> dict:
    """Width, depth, heads, MLP width and classes of a built system, read off its own modules, and
    the tokens entering its blocks (class token included) in a forward pass of `images`."""
    if name == "vit-pytorch":
        blocks, head, entry = model.transformer.layers, model.mlp_head, model.transformer
        attn, mlp = blocks[0]
        heads, hidden = attn.heads, mlp.net[1].out_features
    else:  # ours, ours+stem, timm: timm's blocks, head and MLP names
        blocks, head, entry = model.blocks, model.head, model.blocks[0]
        attn = blocks[0].attn
        heads, hidden = getattr(attn, "heads", None) or attn.num_heads, blocks[0].mlp.fc1.out_features
    tokens = []
    hook = entry.register_forward_pre_hook(lambda module, args: tokens.append(args[0].shape[1]))
    with torch.no_grad():
        model.eval()(images)
    hook.remove()
    return dict(
        dim=head.in_features, depth=len(blocks), heads=heads, hidden=hidden, tokens=tokens[0],
        classes=head.out_features,
    )  # fmt: skip


def test_cifar10_gpu_gives_every_system_the_config_transformer():
    """--model cifar10_gpu: the transformer of configs/cifar10_gpu.yaml (its preset's width and
    heads, its depth and MLP ratio) for every system; the peers on plain 4x4 patches (64 tokens),
    `ours+stem` on the config's conv stem, whose 8x8 map gives as many."""
    vit = yaml.safe_load(GPU_CONFIG.read_text())["model"]["vit"]
    preset = PRESETS[vit["preset"]]
    sizes = dict(dim=preset["dim"], depth=vit["depth"], heads=preset["heads"], mlp_ratio=vit["mlp_ratio"])
    cfg = MODELS["cifar10_gpu"]()
    assert cfg == dict(image_size=32, patch_size=4, **sizes, num_classes=10)
    expected = dict(sizes, hidden=int(sizes.pop("mlp_ratio") * sizes["dim"]), tokens=64 + 1, classes=10)
    assert STEM_CONFIGS["cifar10_gpu"] == GPU_CONFIG
    systems = {
        name: System(name, cfg, 1, torch.float32, torch.device("cpu"), stem_config=GPU_CONFIG)
        for name in ["ours", "ours+stem", *PEERS]
    }
    for name, system in systems.items():
        assert transformer_shape(name, system.model, system.x) == expected, name
    stem = systems["ours+stem"].model.config
    assert (stem.conv_stem, stem.conv_stem_strides) == (vit["conv_stem"], vit["conv_stem_strides"])
    assert systems["ours"].model.config.conv_stem is None
    # the same transformer, the same work; the stem adds its convolutions
    flops = {name: system.infer_flops() for name, system in systems.items()}
    assert all(flops[name] == flops["ours"] for name in PEERS) and flops["ours+stem"] > flops["ours"]


def test_vit_s16_is_vit_s_at_224(monkeypatch, capsys):
    """--model vit-s16 builds ViT-S/16 (196 patches of 16x16, width 384, 12 blocks of 6 heads,
    1000 classes) for every peer, and the header shows that config; built, not timed."""
    cfg = MODELS["vit-s16"]()
    vit_s = dict(dim=384, depth=12, heads=6, mlp_ratio=4.0)
    assert cfg == dict(image_size=224, patch_size=16, **vit_s, num_classes=1000)
    expected = dict(dim=384, depth=12, heads=6, hidden=1536, tokens=196 + 1, classes=1000)
    for name in ["ours", *PEERS]:
        system = System(name, cfg, 1, torch.float32, torch.device("cpu"))
        assert transformer_shape(name, system.model, system.x) == expected, name
    seen = {}

    def fake_measure(names, precision, batch, *args, cfg, **kwargs):
        seen.update(cfg=cfg, batch=batch)
        return {name: figures(10.0, 30.0) for name in names}

    monkeypatch.setattr(throughput, "measure", fake_measure)
    monkeypatch.setattr(throughput, "gemm_peak", lambda dtype, device: 1e12)
    main(["--model", "vit-s16", "--systems", "ours", "--precisions", "fp32", "--batch", "256"])
    assert seen == dict(cfg=cfg, batch=256)
    assert f"model vit-s16: config {cfg}, batch 256," in capsys.readouterr().out
    with pytest.raises(SystemExit):  # no config gives ViT-S/16 a stem
        main(["--model", "vit-s16", "--systems", "ours", "ours+stem"])
    assert "ours+stem: --model vit-s16 has no stem" in capsys.readouterr().err


def test_gemm_peak_sizes_its_product_by_device(monkeypatch):
    """n=8192 on a GPU (an H100's bf16 rate needs it), 2048 on a CPU, unless given."""
    assert throughput.GEMM_SIZES == {"cpu": 2048, "cuda": 8192}
    monkeypatch.setitem(throughput.GEMM_SIZES, "cpu", 64)
    monkeypatch.setattr(throughput, "seconds_per_call", lambda fn, calls, device: 1.0)
    assert gemm_peak(torch.float32, torch.device("cpu")) == 2 * 64**3
    assert gemm_peak(torch.float32, torch.device("cpu"), n=32) == 2 * 32**3


def test_json_holds_what_the_table_shows(monkeypatch, capsys, tmp_path):
    """--json: the run's settings, and per precision the peak, every system's figures (positive;
    shares of the peak consistent) and the target's verdicts, as the text gives them."""
    cfg = dict(TINY, image_size=16)  # the GPU config's stem (stride 4) on 16x16 images: 16 tokens
    monkeypatch.setitem(throughput.MODELS, "cifar10_gpu", lambda: cfg)
    monkeypatch.setitem(throughput.GEMM_SIZES, "cpu", 128)
    path = tmp_path / "run.json"
    names = ["ours", "ours+stem", *PEERS]
    argv = ["--model", "cifar10_gpu", "--systems", *names, "--precisions", "fp32", "--batch", "2"]
    main([*argv, "--warmup", "1", "--rounds", "1", "--steps", "1", "--json", str(path)])
    text = capsys.readouterr().out
    report = json.loads(path.read_text())
    vit = yaml.safe_load(GPU_CONFIG.read_text())["model"]["vit"]
    assert report["model"] == "cifar10_gpu" and report["config"] == cfg and report["device"] == "cpu"
    assert report["stem"] == {name: vit[name] for name in ("conv_stem", "conv_stem_strides", "patch_size")}
    assert (report["batch"], report["rounds"], report["compile"]) == (2, 1, None)
    assert report["torch"] == torch.__version__
    assert report["hardware"] == text.splitlines()[0] and report["gemm_n"] == 128
    assert report["text"] == text.rstrip("\n")
    fp32 = report["precisions"]["fp32"]
    assert list(report["precisions"]) == ["fp32"] and fp32["gemm_peak"] > 0
    assert list(fp32["systems"]) == names
    for r in fp32["systems"].values():
        numbers = [value for key, value in r.items() if key != "matmul_ips"]
        assert all(value > 0 for value in numbers) and r["matmul_ips"] is None
        assert r["train_share_of_peak"] == pytest.approx(r["train_flops_per_s"] / fp32["gemm_peak"])
        infer_flops_per_s = r["infer_flops"] * r["infer_ips"]
        assert r["infer_share_of_peak"] == pytest.approx(infer_flops_per_s / fp32["gemm_peak"])
        assert f"{r['train_share_of_peak']:.1%}" in text and f"{r['infer_share_of_peak']:.1%}" in text
    if not PEERS:
        assert fp32["target"] is None
        return
    last = text.splitlines()[-1]
    assert last.startswith("fp32 target")
    for job, v in fp32["target"].items():
        assert v["ratio"] == pytest.approx(v["ours_ips"] / v["peer_ips"])
        assert v["verdict"] == ("met" if v["ratio"] >= 1 else "tie" if v["ratio"] >= TIE else "missed")
        column = "train_ips" if job == "training" else "infer_ips"
        assert v["peer"] == max(PEERS, key=lambda n: fp32["systems"][n][column])
        ips = f"{v['ours_ips']:.1f} vs {v['peer']} {v['peer_ips']:.1f}"
        assert f"{job} {ips} ({v['ratio']:.2f}x, {v['verdict']})" in last
    assert list(fp32["target"]) == ["training", "inference"]
