"""The benchmark scripts run end to end at a tiny size and report what they say."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import make_folders

ROOT = Path(__file__).resolve().parents[1]


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    """`python benchmarks/NAME ARGS` in a subprocess, as a user runs it."""
    command = [sys.executable, str(ROOT / "benchmarks" / name), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_two_circles_comparison_smoke(tmp_path):
    tiny = ["--steps", "2", "--seeds", "1", "--num_train", "128", "--num_test", "64", "--fields", "3"]
    result = run_script("two_circles.py", *tiny, "--cnn_width", "8", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    table = (tmp_path / "table.md").read_text()
    for name in (
        "ViT",
        "ViT, no position embeddings",
        "ViT, attention window 0",
        "ViT, attention window 1",
        "ResNet",
        "bag CNN, field 3",
    ):
        assert f"| {name} |" in table
    assert "| held-out midpoints |" in table
    for png in ("accuracy_vs_separation.png", "accuracy_vs_receptive_field.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
        (tmp_path / png).unlink()
    result = run_script("two_circles.py", "--replot", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "accuracy_vs_separation.png").read_bytes()[:4] == b"\x89PNG"
    # one model alone (the converged-ViT run); an unknown name is one line
    result = run_script("two_circles.py", *tiny, "--models", "ViT", "--out", str(tmp_path / "vit"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "vit" / "table.md").read_text().count("| ViT") == 1
    result = run_script("two_circles.py", *tiny, "--models", "Vit", "--out", str(tmp_path / "bad"))
    assert result.returncode == 1 and "unknown model(s) ['Vit']" in result.stderr


@pytest.mark.slow
def test_two_circles_depth_smoke(tmp_path):
    tiny = [
        "--depths",
        "1",
        "3",
        "--steps",
        "2",
        "--num_train",
        "128",
        "--num_test",
        "256",
        "--cnn_width",
        "4",
    ]
    from benchmarks.two_circles_depth import model_specs

    result = run_script("two_circles_depth.py", *tiny, "--models", *model_specs(1), "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    table = (tmp_path / "table.md").read_text()
    # fields: plain 2L + 1; downsampling 3 and 11
    for row in (
        "| ViT, relative positions | 3 |",
        "| ViT, learned positions | 1 |",
        "| plain CNN | 1 |",
        "| plain CNN, MLP head | 3 |",
        "| downsampling CNN | 3 |",
    ):
        assert row in table
    assert "| 7 |" in table and "| 11 |" in table
    # a second seed added to one row: two test accuracies there, one elsewhere
    more = ["--add", "--models", "plain CNN", "--depths", "3", "--seeds", "1"]
    result = run_script("two_circles_depth.py", *tiny, *more, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {line.split(" | ")[0] + " | " + line.split(" | ")[1]: line for line in
            (tmp_path / "table.md").read_text().splitlines() if line.startswith("| ")}  # fmt: skip
    assert rows["| plain CNN | 3"].rstrip(" |").split(" | ")[-1].count(", ") == 1
    assert rows["| plain CNN | 1"].rstrip(" |").split(" | ")[-1].count(", ") == 0
    result = run_script("two_circles_depth.py", *tiny[:4], "3", *tiny[5:], *more, "--out", str(tmp_path))
    assert result.returncode == 1 and "--add needs the set-up" in result.stderr
    (tmp_path / "accuracy_vs_depth.png").unlink()
    result = run_script("two_circles_depth.py", "--replot", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "accuracy_vs_depth.png").read_bytes()[:4] == b"\x89PNG"


def test_the_gap_is_measured_between_the_inks_along_the_larger_axis():
    """The gap the depth study bins by is the count of uninked pixel columns (or rows, on the
    larger axis) between the two circles, up to the pixel grid; never below the ViT's patch."""
    import math

    from benchmarks.two_circles_depth import DATA, GAP_BINS, PATCH, gaps
    from vit import TwoCircles

    data = TwoCircles(**DATA, noise=0.0, num_train=1, num_val=1, num_test=500)
    gap = gaps(data, "test")
    assert gap.min() >= PATCH and GAP_BINS[0] <= gap.min() and gap.max() < GAP_BINS[-1]
    images, centres = data.split("test").images, data.circle_centres("test")
    for i in range(50):
        (x0, y0), (x1, y1) = centres[i].tolist()
        on_x = abs(math.remainder(x1 - x0, 32)) >= abs(math.remainder(y1 - y0, 32))
        profile = (images[i, 0] > 0).any(dim=0 if on_x else 1).tolist()  # inked columns (or rows)
        start = profile.index(True)  # walk round the torus from an inked pixel: the runs of blanks
        runs, count = [], 0
        for inked in profile[start:] + profile[:start]:
            if inked and count:
                runs.append(count)
            count = 0 if inked else count + 1
        if count:  # the blanks before the first inked pixel
            runs.append(count)
        assert len(runs) == 2 and math.floor(gap[i]) <= min(runs) <= math.ceil(gap[i]), (i, runs, gap[i])


def test_accuracy_vs_minutes_draws_each_run(tmp_path, capsys):
    from benchmarks.accuracy_vs_minutes import main

    header = "epoch,step,time/minutes,train/lr,val/acc\n"
    (tmp_path / "a.csv").write_text(header + "0,9,,0.001,\n0,10,1.5,,0.40\n1,20,3.0,,0.55\n")
    (tmp_path / "b.csv").write_text(header + "0,10,2.0,,0.30\n1,20,4.0,,0.35\n2,30,6.0,,0.33\n")
    main([f"budget={tmp_path / 'a.csv'}", f"fixed={tmp_path / 'b.csv'}", "--out", str(tmp_path / "m.png")])
    out = capsys.readouterr().out
    assert "budget: last val/acc 0.5500 at 3.0 min, best 0.5500 at 3.0 min" in out
    assert "fixed: last val/acc 0.3300 at 6.0 min, best 0.3500 at 4.0 min" in out
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"
    # PATH*FACTOR: minutes drawn times the factor (a faster machine's run in another's minutes)
    main([f"scaled={tmp_path / 'a.csv'}*1.5", "--out", str(tmp_path / "s.png")])
    assert "scaled: last val/acc 0.5500 at 4.5 min, best 0.5500 at 4.5 min" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="must be a number"):
        main([f"bad={tmp_path / 'a.csv'}*x", "--out", str(tmp_path / "s.png")])
    with pytest.raises(SystemExit, match="no rows with both"):
        (tmp_path / "c.csv").write_text(header)
        main([f"c={tmp_path / 'c.csv'}", "--out", str(tmp_path / "c.png")])


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
def test_short_run_smoke(tmp_path, capsys):
    from benchmarks.short_run import main
    from vit.datamodules import CIFAR10_CLASSES

    root = make_folders(tmp_path / "cifar", classes=CIFAR10_CLASSES, per_class={"train": 2})
    tiny = ["--dim", "16", "--depth", "1", "--heads", "2", "--mlp_ratio", "1"]
    steps = ["--val_size", "4", "--batch_size", "4", "--limit", "2", "--epochs", "2"]
    main(["--root", str(root), *tiny, *steps])
    out = capsys.readouterr().out
    assert "epoch 1/2 val/acc" in out and "epoch 2/2 val/acc" in out
    for bad in (["--epochs", "0"], ["--limit", "0"], ["--model", "vit-pytorch", "--dim", "64"]):
        with pytest.raises(SystemExit):
            main(["--root", str(root), *bad])
    assert "must be at least 1" in capsys.readouterr().err


def test_separation_curves_keep_test_and_far_images_apart():
    """Test separations end at 14.5 pixels, far ones start there, and both have a 14-pixel bin:
    the 14.2-pixel test images and the 14.7-pixel far images stay on different curves."""
    import torch

    from benchmarks.two_circles import by_separation, separation_curve

    run = {
        "test": {"by_separation": by_separation(torch.tensor([1, 1, 0]), torch.tensor([13.9, 14.2, 14.4]))},
        "far": {"by_separation": by_separation(torch.tensor([0, 0, 1]), torch.tensor([14.6, 14.7, 15.1]))},
    }
    assert separation_curve([run], "test", (12.0, 14.5)) == ([13.5, 14.25], [1.0, 0.5])
    assert separation_curve([run], "far", (14.5, 15.9)) == ([14.75, 15.45], [0.0, 1.0])


@pytest.mark.slow
def test_finetune_study_smoke(tmp_path, capsys):
    """Pretrain, export, fine-tune and train from scratch through the commands, on a few images."""
    from benchmarks.finetune import main
    from vit.datamodules import CIFAR10_CLASSES

    cifar = make_folders(tmp_path / "cifar", classes=CIFAR10_CLASSES, per_class={"train": 4, "test": 2})
    tiny = ["--pretrain-epochs", "1", "--epochs", "1", "--per-class", "2", "--val-per-class", "2"]
    main(["--cifar", str(cifar), "--out", str(tmp_path / "out"), "--batch-size", "4", *tiny])
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| fine-tune (layer decay 0.75) | classes 5-9, 10 images | 1 (2) |" in table
    assert "| from scratch | classes 5-9, 10 images | 1 (2) |" in table
    assert (tmp_path / "out" / "pretrained" / "model.safetensors").is_file()
    ckpt = tmp_path / "out" / "finetune" / "run" / "checkpoints" / "last.ckpt"
    recorded = torch.load(ckpt, weights_only=True)
    assert recorded["hyper_parameters"]["pretrained"] == str(tmp_path / "out" / "pretrained")


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
    from vit.interpret.faithfulness import score

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


def test_explore_page_benchmark_smoke(trained_checkpoint, chromium, tmp_path):
    """Both models' pages written, opened in Chromium and redrawn; one row each."""
    tiny = ["--num-images", "2", "--timm", "vit_tiny_patch16_224", "--timm-images", "1", "--queries", "2"]
    options = ["--ckpt", str(trained_checkpoint), *tiny, "--chromium", chromium, "--out", str(tmp_path)]
    result = run_script("explore_page.py", *options)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line.split() for line in result.stdout.splitlines() if line.startswith(("checkpoint", "timm"))]
    rows = {words[1]: words for words in lines}
    assert rows["tiny.ckpt"][2:4] == ["2", "17"] and rows["vit_tiny_patch16_224"][2:4] == ["1", "197"]
    megabytes = float(rows["vit_tiny_patch16_224"][4])  # 12 layers x 3 heads x 197 x 197 bytes, deflated
    assert 0 < megabytes < 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny_ckpt.html", "vit_tiny_patch16_224.html"]


def test_the_heads_benchmark_counts_the_passes_analyse_makes():
    """One intact pass, then per layer its heads, both kinds of ablation, beside an intact copy."""
    from benchmarks.heads import needed, passes_per_image
    from vit import ViT

    model = ViT(preset="micro", image_size=16, patch_size=4, num_classes=3).eval()
    layers, heads = len(model.blocks), model.config.heads
    made = passes_per_image(model, torch.rand(5, 3, 16, 16), batch_size=64)
    assert made == 1 + layers * (2 * heads + 1)
    assert needed(model) == 1 + 2 * layers * heads


def test_patching_split_by_evidence_prints_each_share(trained_checkpoint, capsys):
    from benchmarks.patch_by_evidence import main

    main(["--ckpt", str(trained_checkpoint), "--num-images", "8", "--min-gap", "0.001"])  # a tiny model
    printed = capsys.readouterr().out
    assert printed.startswith("8 pairs; circle patches per pair")
    blocks = printed.split("after block ")[1:]
    assert [block.split("\n")[0] for block in blocks] == ["0", "1"]  # the tiny model's two blocks
    for block in blocks:
        for row in ("circle patches, all", "background patches, all", "the largest background patch",
                    "the class token"):  # fmt: skip
            assert re.search(rf"^  {row} +-?\d\.\d{{3}} \[", block, re.M), row
    # the head reads the class token alone: after the last block it carries all of it
    assert re.search(r"^  the class token +1\.000 \[1\.000, 1\.000\]", blocks[-1], re.M)


def test_circle_attention_splits_each_heads_attention_and_shows_one_by_offset(trained_checkpoint, capsys):
    from benchmarks.circle_attention import main

    main(["--ckpt", str(trained_checkpoint), "--num-images", "16", "--head", "1", "0"])
    printed = capsys.readouterr().out
    rows = re.findall(r"^(\d) +(\d) +([\d.]+) +([\d.]+) +([\d.]+) +(-?[\d.]+)$", printed, re.M)
    assert [(int(r[0]), int(r[1])) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for row in rows:  # itself, the other circle patches, the background, the prefix: all of it
        assert sum(float(v) for v in row[2:]) == pytest.approx(1.0, abs=2e-3)
    for kind in ("circle", "background"):
        table = printed.split(f"{kind} queries: mean attention by offset")[1].split("\n")[1:8]
        assert all(len(line.split()) == 7 for line in table), table  # offsets -3..3 on a 4x4 grid


def test_even_attention_is_a_head_whose_queries_and_keys_are_zero():
    """Zero queries and keys give every score 0, so the softmax spreads 1/tokens: the same model
    built that way predicts what `predictions` gives with the head's weights replaced."""
    import copy

    from benchmarks.even_attention import predictions
    from vit import ViT

    torch.manual_seed(0)
    model = ViT(preset="micro", image_size=16, patch_size=4, in_channels=1, num_classes=5).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    images = torch.rand(64, 1, 16, 16)
    intact = predictions(model, images)
    for layer, head in ((0, 1), (1, 0)):
        zeroed = copy.deepcopy(model)
        dim, d_head = model.config.dim, model.config.dim // model.config.heads
        with torch.no_grad():
            for start in (0, dim):  # the head's query rows, then its key rows
                rows = slice(start + head * d_head, start + (head + 1) * d_head)
                zeroed.blocks[layer].attn.qkv.weight[rows] = 0
                zeroed.blocks[layer].attn.qkv.bias[rows] = 0
        even = predictions(model, images, layer, head)
        assert torch.equal(even, predictions(zeroed, images))
        assert not torch.equal(even, intact)  # the replacement did change something
        assert torch.equal(predictions(model, images), intact)  # and left nothing behind


def test_step_profile_puts_every_operator_in_one_kind(capsys):
    from benchmarks import step_profile

    assert step_profile.kind_of("aten::addmm") == "matmul"
    assert step_profile.kind_of("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert step_profile.kind_of("aten::native_layer_norm_backward") == "layernorm"
    assert step_profile.kind_of("aten::_foreach_lerp_") == "optimizer"
    assert step_profile.kind_of("aten::_to_copy") == "casts and copies"
    assert step_profile.kind_of("aten::where") == "other"
    (result,) = step_profile.main(["--smoke", "--precision", "fp32"]).values()
    kinds = result["kinds"]
    assert kinds["matmul"] > 0 and kinds["optimizer"] > 0
    assert 0 < sum(kinds.values()) <= result["wall"] * 1.05  # own times: no operator counted twice
    assert "step, wall" in capsys.readouterr().out


@pytest.mark.slow
def test_demo_seeds_reports_each_seed_and_goes_on_where_it_stopped(tmp_path):
    tiny = [
        "--", "--model.vit.preset", "micro", "--data.init_args.num_train", "256",
        "--data.init_args.num_val", "64", "--data.init_args.num_test", "64", "--trainer.max_epochs", "2",
    ]  # fmt: skip
    out, runs = tmp_path / "probe", tmp_path / "runs"
    result = run_script("demo_seeds.py", "--seeds", "3", "--out", str(out), "--runs", str(runs), *tiny)
    assert result.returncode == 0, result.stderr[-2000:]
    result = run_script("demo_seeds.py", "--seeds", "3", "4", "--out", str(out), "--runs", str(runs), *tiny)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "seed 3:" not in result.stdout and "seed 4:" in result.stdout  # seed 3 was done
    table = (out / "table.md").read_text()
    rows = re.findall(r"^\| (\d) \| (0\.\d{4}) \| ([0-9., ]+) \|", table, re.MULTILINE)
    assert [r[0] for r in rows] == ["3", "4"] and all(len(r[2].split(", ")) == 2 for r in rows)
    assert "min / median / max" in table
    other = run_script(
        "demo_seeds.py", "--seeds", "5", "--out", str(out), "--runs", str(runs), "--", "--model.lr", "1"
    )
    assert other.returncode != 0 and "holds another config or options" in other.stderr


@pytest.mark.slow
def test_the_heads_study_writes_every_file_docs_heads_reads(tmp_path):
    out = tmp_path / "heads"
    out.mkdir()
    earlier = {"cpu": "another CPU", "test/acc": 0.5}  # a model this run leaves alone keeps its entry
    (out / "machine.json").write_text(json.dumps({"models": {"demo": earlier}}))
    result = run_script("heads_study.py", "--smoke", "--models", "relpos", "--out", str(out),
                        "--runs", str(tmp_path / "runs"))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    suffixes = ["heads.txt", "heads.json", "heads_raw_logit.txt", "heads_raw_logit.json", "patch.txt",
                "patch.json", "patch_by_evidence.txt", "even_attention.txt", "circle_attention.txt",
                "ablation_mean.png", "patch_heads.png"]  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["machine.json"] + [f"relpos_{s}" for s in suffixes]
    )
    models = json.loads((out / "machine.json").read_text())["models"]
    assert models["demo"] == earlier and set(models["relpos"]) >= {"cpu", "test/acc"}
    assert json.loads((out / "relpos_heads_raw_logit.json").read_text())["attribute"] == "logit"
    assert "ratio of means" in (out / "relpos_patch_by_evidence.txt").read_text()
