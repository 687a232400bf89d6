"""Each study of studies/ at a tiny size: its script runs end to end (or its core function on tiny
data) and reports what it says. The real runs, and what they showed, are in each study's README."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import helpers
import pytest
import torch
from helpers import make_folders

ROOT = Path(__file__).resolve().parents[1]
TWO = "two_circles/two_circles.py"
DEPTH = "two_circles_depth/two_circles_depth.py"


def run_script(name: str, *args: str, **options) -> subprocess.CompletedProcess:
    """`python studies/NAME ARGS` (`helpers.run_script`)."""
    return helpers.run_script(ROOT / "studies" / name, *args, **options)


@pytest.mark.slow
def test_two_circles_comparison_smoke(tmp_path):
    tiny = ["--steps", "2", "--seeds", "1", "--num_train", "128", "--num_test", "64", "--fields", "3"]
    result = run_script(TWO, *tiny, "--cnn_width", "8", "--out", str(tmp_path))
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
    result = run_script(TWO, "--replot", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "accuracy_vs_separation.png").read_bytes()[:4] == b"\x89PNG"
    # one model alone (the converged-ViT run); an unknown name is one line
    result = run_script(TWO, *tiny, "--models", "ViT", "--out", str(tmp_path / "vit"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "vit" / "table.md").read_text().count("| ViT") == 1
    result = run_script(TWO, *tiny, "--models", "Vit", "--out", str(tmp_path / "bad"))
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
    from studies.two_circles_depth.two_circles_depth import model_specs

    result = run_script(DEPTH, *tiny, "--models", *model_specs(1), "--out", str(tmp_path))
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
    result = run_script(DEPTH, *tiny, *more, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {line.split(" | ")[0] + " | " + line.split(" | ")[1]: line for line in
            (tmp_path / "table.md").read_text().splitlines() if line.startswith("| ")}  # fmt: skip
    assert rows["| plain CNN | 3"].rstrip(" |").split(" | ")[-1].count(", ") == 1
    assert rows["| plain CNN | 1"].rstrip(" |").split(" | ")[-1].count(", ") == 0
    result = run_script(DEPTH, *tiny[:4], "3", *tiny[5:], *more, "--out", str(tmp_path))
    assert result.returncode == 1 and "--add needs the set-up" in result.stderr
    (tmp_path / "accuracy_vs_depth.png").unlink()
    result = run_script(DEPTH, "--replot", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "accuracy_vs_depth.png").read_bytes()[:4] == b"\x89PNG"


def test_the_gap_is_measured_between_the_inks_along_the_larger_axis():
    """The gap the depth study bins by is the count of uninked pixel columns (or rows, on the
    larger axis) between the two circles, up to the pixel grid; never below the ViT's patch."""
    import math

    from studies.two_circles_depth.two_circles_depth import DATA, GAP_BINS, PATCH, gaps
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


@pytest.mark.slow
def test_short_run_smoke(tmp_path, capsys):
    from studies.cifar10_cpu.short_run import main
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

    from studies.two_circles.two_circles import by_separation, separation_curve

    run = {
        "test": {"by_separation": by_separation(torch.tensor([1, 1, 0]), torch.tensor([13.9, 14.2, 14.4]))},
        "far": {"by_separation": by_separation(torch.tensor([0, 0, 1]), torch.tensor([14.6, 14.7, 15.1]))},
    }
    assert separation_curve([run], "test", (12.0, 14.5)) == ([13.5, 14.25], [1.0, 0.5])
    assert separation_curve([run], "far", (14.5, 15.9)) == ([14.75, 15.45], [0.0, 1.0])


@pytest.mark.slow
def test_finetune_study_smoke(tmp_path, monkeypatch):
    """Pretrain, export, fine-tune and train from scratch through the commands, on a few images
    (the commands run in this process: `run_in_process`)."""
    from studies.finetune import finetune
    from studies.finetune.finetune import main
    from vit.datamodules import CIFAR10_CLASSES

    cifar = make_folders(tmp_path / "cifar", classes=CIFAR10_CLASSES, per_class={"train": 4, "test": 2})
    tiny = ["--pretrain-epochs", "1", "--epochs", "1", "--per-class", "2", "--val-per-class", "2"]
    monkeypatch.setattr(finetune.subprocess, "run", helpers.run_in_process)
    main(["--cifar", str(cifar), "--out", str(tmp_path / "out"), "--batch-size", "4", *tiny])
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| fine-tune (layer decay 0.75) | classes 5-9, 10 images | 1 (2) |" in table
    assert "| from scratch | classes 5-9, 10 images | 1 (2) |" in table
    assert (tmp_path / "out" / "pretrained" / "model.safetensors").is_file()
    ckpt = tmp_path / "out" / "finetune" / "run" / "checkpoints" / "last.ckpt"
    recorded = torch.load(ckpt, weights_only=True)
    assert recorded["hyper_parameters"]["pretrained"] == str(tmp_path / "out" / "pretrained")


def test_patching_split_by_evidence_prints_each_share(trained_checkpoint, capsys):
    from studies.heads.patch_by_evidence import main

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
    from studies.heads.circle_attention import main

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

    from studies.heads.even_attention import predictions
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


@pytest.mark.slow
def test_the_heads_study_writes_every_file_docs_heads_md_reads(tmp_path):
    out = tmp_path / "heads"
    out.mkdir()
    earlier = {"cpu": "another CPU", "test/acc": 0.5}  # a model this run leaves alone keeps its entry
    (out / "machine.json").write_text(json.dumps({"models": {"demo": earlier}}))
    result = run_script("heads/heads_study.py", "--smoke", "--models", "relpos", "--out", str(out),
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


def test_the_half_hour_table_gives_each_variants_seeds_and_the_figure_draws_them(tmp_path):
    """Runs laid out as the study commits them: the table's min / median / max are those of the
    seeds' test top-1, read from each run's sweep.json and the peer's JSON."""
    from studies.cifar10_cpu.half_hour import figure

    committed = ROOT / "studies/cifar10_cpu/half_hour/levers_seed0"
    for seed, top1 in ((0, 0.85), (1, 0.87), (2, 0.80)):
        run = tmp_path / f"levers_seed{seed}"
        run.mkdir()
        (run / "metrics.csv").write_text((committed / "metrics.csv").read_text())
        sweep = json.loads((committed / "sweep.json").read_text())
        sweep["variants"]["levers"]["test_top1"] = top1
        (run / "sweep.json").write_text(json.dumps(sweep))
    peer = json.loads((ROOT / "studies/cifar10_cpu/half_hour/cnn_peer_cpu_seed0.json").read_text())
    (tmp_path / "cnn_peer_cpu_seed0.json").write_text(json.dumps(peer))
    (tmp_path / "notes").mkdir()  # folders that are no run, or no finished run, are passed over
    (tmp_path / "levers_seed9").mkdir()
    (tmp_path / "notes" / "sweep.json").write_text((committed / "sweep.json").read_text())

    runs = figure.read_runs(tmp_path)
    assert sorted(runs) == ["cnn_peer", "levers"] and sorted(runs["levers"]) == [0, 1, 2]
    minutes, accuracy = runs["levers"][1]["curve"]
    assert 29 < minutes[-1] < 31 and len(minutes) == len(accuracy) > 50  # an epoch's validation each
    table = figure.table(runs)
    assert "| `levers` | 3 | 0.8000 / 0.8500 / 0.8700 | 0: 0.8500, 1: 0.8700, 2: 0.8000 |" in table
    assert f"| `cnn_peer` | 1 | {peer['runs'][0]['reports'][-1]['acc']:.4f} / " in table
    assert table.index("cnn_peer") < table.index("levers")

    figure.main(["--runs", str(tmp_path), "--out", str(tmp_path / "f.png")])
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"


def test_the_half_hour_figure_draws_no_two_variants_alike():
    """More variants than the palette's ten colours: each legend entry still has its own colour
    and line style, each variant's end dot its own colour and marker."""
    from studies.cifar10_cpu.half_hour import figure

    runs = figure.read_runs(ROOT / "studies/cifar10_cpu/half_hour")
    assert len(runs) > 10
    ax = figure.figure(runs, "title").axes[0]
    lines = ax.get_legend().get_lines()
    styles = {(line.get_color(), line.get_linestyle()) for line in lines}
    assert len(lines) == len(runs) == len(styles)
    ends = {
        (line.get_color(), line.get_marker()) for line in ax.get_lines() if list(line.get_xdata()) == [30]
    }
    assert len(ends) == len(runs)  # the test top-1 dots at 30 minutes, one look a variant


def test_the_half_hour_runs_table_reads_train_acc_at_the_last_full_epoch_not_the_budgets_stub():
    """train/acc is logged once an epoch; a run's last epoch is cut by its budget after a few
    steps, so the table gives the epoch before it. levers_seed1 logged 0.9647 at the end of its
    last full epoch (351 steps) and 0.9655 after the 89 steps of the stub after it."""
    from studies.cifar10_cpu.half_hour import figure

    assert figure.last_full_epoch([350, 701, 1052, 1060], [0.1, 0.2, 0.3, 0.4]) == 0.3
    assert figure.last_full_epoch([350, 701, 1052], [0.1, 0.2, 0.3]) == 0.3
    assert figure.last_full_epoch([], []) is None
    runs = figure.read_runs(ROOT / "studies/cifar10_cpu/half_hour")
    levers = runs["levers"][1]
    assert round(levers["train_acc"], 4) == 0.9647 and levers["epochs"] == 58
    rows = figure.runs_table(runs)
    assert "| `levers` | 1 | 58 | 1,430 | 0.965 | 0.8560 | 0.8539 |" in rows
    assert "| `cnn_peer` | 1 | 19.01 | 529 |  |  | 0.8990 |" in rows
    assert figure.title_of(runs) == "CIFAR-10 in 30 minutes on AMD EPYC, family 26, model 2"


def sweep_out(tmp_path: Path, names: tuple[str, ...] = ("levers", "levers_depth0")) -> Path:
    """A folder as `gpu_sweep.py --out` leaves it, made of the committed seed-1 runs of `names`,
    and a variant that failed."""
    out = tmp_path / "out"
    study = ROOT / "studies/cifar10_cpu/half_hour"
    sweep = json.loads((study / "levers_seed1/sweep.json").read_text())
    for name in names:
        kept = study / f"{name}_seed1"
        sweep["variants"].update(json.loads((kept / "sweep.json").read_text())["variants"])
        for source, target in (("metrics.json", f"eval/{name}"), ("metrics.csv", f"runs/{name}/version_0")):
            (out / target).mkdir(parents=True)
            shutil.copyfile(kept / source, out / target / source)
    sweep["variants"]["broken"] = {"status": "failed", "why": "made up"}
    (out / "sweep.json").write_text(json.dumps(sweep))
    (out / "sweep.md").write_text("the sweep's table\n")
    return out


def test_keep_lays_each_finished_run_of_a_sweep_out_as_the_study_reads_it(tmp_path, capsys):
    from studies.cifar10_cpu.half_hour import figure, keep

    out, into = sweep_out(tmp_path), tmp_path / "study"
    assert keep.keep(out, into) == [into / "levers_seed1", into / "levers_depth0_seed1"]
    assert "broken: not kept (failed)" in capsys.readouterr().out
    study = ROOT / "studies/cifar10_cpu/half_hour"
    for name in ("levers", "levers_depth0"):
        folder = into / f"{name}_seed1"
        files = sorted(p.name for p in folder.iterdir())
        assert files == ["metrics.csv", "metrics.json", "sweep.json", "sweep.md"]
        assert (folder / "metrics.csv").read_bytes() == (study / f"{name}_seed1/metrics.csv").read_bytes()
        assert list(json.loads((folder / "sweep.json").read_text())["variants"]) == [name]
    runs = figure.read_runs(into)
    assert runs["levers_depth0"][1]["top1"] == figure.read_runs(study)["levers_depth0"][1]["top1"]

    with pytest.raises(SystemExit, match="levers_seed1 exists already"):
        keep.keep(out, into)


def test_keep_writes_nothing_when_a_runs_file_is_missing(tmp_path, capsys):
    from studies.cifar10_cpu.half_hour import keep

    out, into = sweep_out(tmp_path), tmp_path / "study"
    (out / "eval/levers_depth0/metrics.json").unlink()  # the second run's: the first is not kept either
    sweep = json.loads((out / "sweep.json").read_text())
    sweep["variants"] = {"broken": sweep["variants"].pop("broken"), **sweep["variants"]}
    (out / "sweep.json").write_text(json.dumps(sweep))  # the failed variant first: met before the gap
    with pytest.raises(SystemExit, match=r"levers_depth0/metrics.json is missing"):
        keep.main([str(out), "--into", str(into)])
    assert not into.exists()
    assert capsys.readouterr().out == ""  # no "not kept" for a keep that keeps nothing
    with pytest.raises(SystemExit, match="holds no sweep.json"):
        keep.main([str(tmp_path), "--into", str(into)])
