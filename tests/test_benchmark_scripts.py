"""The speed benchmarks of benchmarks/ run end to end at a tiny size and report what they say."""

import subprocess
from pathlib import Path

import helpers
import pytest
import torch
from helpers import make_folders

ROOT = Path(__file__).resolve().parents[1]


def run_script(name: str, *args: str, **options) -> subprocess.CompletedProcess:
    """`python benchmarks/NAME ARGS` (`helpers.run_script`)."""
    return helpers.run_script(ROOT / "benchmarks" / name, *args, **options)


@pytest.mark.slow
def test_data_pipeline_benchmark_smoke(tmp_path, capsys):
    from benchmarks.data_pipeline import main
    from vit.datamodules import CIFAR10_CLASSES

    root = make_folders(tmp_path / "cifar", classes=CIFAR10_CLASSES, per_class={"train": 1})
    tiny = ["--dim", "16", "--depth", "1", "--heads", "2", "--precision", "fp32", "--batch", "4"]
    steps = ["--val_size", "2", "--warmup", "1", "--steps", "2", "--rounds", "1"]
    results = main(["--root", str(root), *tiny, *steps, "--shifted_patches", "--locality_attention"])
    assert results["model_only"] > 0 and results["pipeline"] > 0 and results["augment_ms"] > 0
    assert results["ratio"] == results["pipeline"] / results["model_only"]
    out = capsys.readouterr().out
    assert "(a) model only:" in out and "(b) with pipeline:" in out and "ratio (b)/(a):" in out


@pytest.mark.slow
def test_explanations_benchmark_smoke(trained_checkpoint, tmp_path):
    result = run_script("explanations.py", "speed", "--ckpt", str(trained_checkpoint), "--images", "8",
                        "--timm-images", "0")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "demo model, 8 test images, all 6 methods, deletion and insertion, sanity checks:" in result.stdout
    metrics = tmp_path / "metrics.csv"
    metrics.write_text(
        "epoch,step,val/acc,val/evidence_mass_grad_rollout,val/evidence_mass_rollout,val/evidence_share\n"
        "0,10,0.25,0.33,0.34,0.33\n1,20,0.9,0.36,0.41,0.33\n"
    )
    result = run_script("explanations.py", "training", str(metrics), "--out", str(tmp_path / "curve.png"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "step 20: val/acc 0.900, rollout 0.410, grad-rollout 0.360, chance 0.330" in result.stdout
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_the_passes_the_protocol_needs_are_the_passes_it_makes(trained):
    """benchmarks/explanations.py divides the time of `score` by the forward passes it needs: count
    the images that go through the model (a gradient map adds one backward pass, counted as 2)."""
    from benchmarks.explanations import passes_needed
    from vit.interpret.score import score

    classifier, data = trained
    model = classifier.model
    images = data.split("test")[:8][0]
    seen = []
    handle = model.register_forward_hook(lambda module, args, out: seen.append(len(args[0])))
    methods = ["cls", "rollout", "grad-rollout", "input-gradient", "random"]
    try:
        for sanity in (False, True):
            seen.clear()
            score(model, images, methods=methods, batch_size=8, sanity=sanity)
            gradients = 2 * (1 + sanity * (len(model.blocks) + 2))  # grad-rollout and input-gradient
            needed = passes_needed(methods, 16, len(model.blocks), sanity)
            assert sum(seen) / len(images) == needed - 2 * gradients
    finally:
        handle.remove()


@pytest.mark.slow
def test_explore_page_benchmark_smoke(trained_checkpoint, chromium, tmp_path):
    """Both models' pages written, opened in Chromium and redrawn; one row each."""
    tiny = ["--num-images", "2", "--timm", "vit_tiny_patch16_224", "--timm-images", "1", "--queries", "2"]
    options = ["--ckpt", str(trained_checkpoint), *tiny, "--chromium", chromium, "--out", str(tmp_path)]
    result = run_script("explore_page.py", *options, own_process=True)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line.split() for line in result.stdout.splitlines() if line.startswith(("checkpoint", "timm"))]
    rows = {words[1]: words for words in lines}
    assert rows["tiny.ckpt"][2:4] == ["2", "17"] and rows["vit_tiny_patch16_224"][2:4] == ["1", "197"]
    megabytes = float(rows["vit_tiny_patch16_224"][4])  # 12 layers x 3 heads x 197 x 197 bytes, deflated
    assert 0 < megabytes < 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny_ckpt.html", "vit_tiny_patch16_224.html"]


def test_the_heads_benchmark_counts_the_passes_analyse_makes():
    """One intact pass, then per layer its heads, both kinds of ablation, beside an intact copy."""
    from benchmarks.heads_cost import needed, passes_per_image
    from vit import ViT

    model = ViT(preset="micro", image_size=16, patch_size=4, num_classes=3).eval()
    layers, heads = len(model.blocks), model.config.heads
    made = passes_per_image(model, torch.rand(5, 3, 16, 16), batch_size=64)
    assert made == 1 + layers * (2 * heads + 1)
    assert needed(model) == 1 + 2 * layers * heads


def test_profile_step_puts_every_operator_in_one_kind(capsys):
    from benchmarks import profile_step

    assert profile_step.kind_of("aten::addmm") == "matmul"
    assert profile_step.kind_of("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert profile_step.kind_of("aten::native_layer_norm_backward") == "layernorm"
    assert profile_step.kind_of("aten::_foreach_lerp_") == "optimizer"
    assert profile_step.kind_of("aten::_to_copy") == "casts and copies"
    assert profile_step.kind_of("aten::where") == "other"
    options = ["--smoke", "--precision", "fp32", "--top", "3", "--matmuls-alone"]
    (result,) = profile_step.main(options).values()
    kinds = result["kinds"]
    assert kinds["matmul"] > 0 and kinds["optimizer"] > 0
    assert 0 < sum(kinds.values()) <= result["wall"] * 1.05  # own times: no operator counted twice
    report = result["matmuls_alone"]
    assert report["calls"] > 0 and 0 < report["alone"] < report["step"]
    out = capsys.readouterr().out
    assert "step, wall" in out and "Self CPU" in out and "matmul calls alone, back to back" in out


@pytest.mark.slow
def test_streaming_speed_benchmark_smoke(capsys):
    pytest.importorskip("litdata")
    from benchmarks.streaming import main

    pytest.importorskip("moto.server")
    results = main(["speed", "--smoke", "--s3"])
    assert set(results) == {16}
    figures = results[16]
    assert len(figures) == 5 and all(value > 0 for name, value in figures.items() if "decode" not in name)
    out = capsys.readouterr().out
    assert "16 px, 12 JPEGs, batches of 4: images/s out of the training loader" in out
    assert "streaming (StreamingImages, 2 workers)" in out and "machine: " in out
    assert "streaming from S3 (2 workers)" in out


@pytest.mark.slow
def test_attention_maps_cost_benchmark_smoke(capsys):
    from benchmarks.attention_maps_cost import main

    results = main(["--smoke", "--tensorboard"])
    assert len(results["validations"]) == 2
    assert all(len(s) == 2 and min(s) > 0 for s in results["callbacks"].values())
    assert set(results["parts"]) == {
        "predicted classes",
        "rollout maps",
        "grad-rollout maps",
        "the picture",
        "its PNG",
    }
    assert "AttentionMaps: median" in capsys.readouterr().out


def test_memory_format_benchmark_smoke(capsys):
    """Every network in every layout trains and infers, and its logits are NCHW's (rounding only)."""
    from benchmarks.memory_format import LAYOUTS, main

    results = main(["--smoke"])
    names = ("config", "depth0", "airbench", "plain")
    assert set(results) == {(n, layout) for n in names for layout in LAYOUTS}
    assert all(r["train"] > 0 and r["infer"] > 0 and r["difference"] < 1e-4 for r in results.values())
    assert all(results[n, "nchw"]["difference"] == 0 for n in names)
    flops = {n: results[n, "nchw"]["flops"] for n in names}  # training FLOPs per image
    assert all(results[n, layout]["flops"] == flops[n] for n, layout in results)  # layouts: same work
    assert flops["airbench"] > flops["config"] > flops["depth0"] > 0  # the blocks' work counted
    out = capsys.readouterr().out
    assert "family" in out and "airbench  nhwc+weights" in out and "of rate" in out
