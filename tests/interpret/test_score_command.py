"""Which map tells the truth: the scores of vit.interpret.score, the evidence of the data
modules, `vit-attention score` and the EvidenceMass callback."""

import csv
import json

import pytest
import torch
from helpers import SIZES, command_error, make_folders, tiny_args, write_image
from PIL import Image
from torch import nn

from vit import ImageFolders, TwoCircles, compat
from vit.commands import score as score_command
from vit.commands import train as cli
from vit.commands.attention import main as attention_main
from vit.interpret.evidence import evidence_scores, patch_evidence
from vit.interpret.score import (
    METHODS,
    area,
    headline,
    perturbation_curves,
    randomisation_steps,
    removal_counts,
    removal_order,
    scored_maps,
)
from vit.interpret.stats import interval, spearman


def test_the_command_names_every_method():
    assert score_command.METHOD_NAMES == tuple(METHODS)


def test_the_evidence_scores_one_and_a_uniform_random_map_scores_the_evidence_share():
    data = TwoCircles(num_train=1, num_val=1, num_test=512, radius=3.0, separation=(10.0, 15.5))
    evidence = torch.nn.functional.adaptive_max_pool2d(data.evidence("test")[:, None].float(), (4, 4))
    evidence = evidence.flatten(1).bool()
    perfect = evidence_scores(evidence.float(), evidence)
    for name in ("relevance_mass", "rank_accuracy", "pointing_game"):
        assert interval(perfect[name]) == {"mean": 1.0, "low": 1.0, "high": 1.0}
    share = evidence.float().mean(-1)  # per image: what a map that knows nothing scores on average
    random = evidence_scores(torch.rand(evidence.shape, generator=torch.Generator().manual_seed(0)), evidence)
    for name in ("relevance_mass", "rank_accuracy", "pointing_game"):
        found = interval(random[name])
        assert found["low"] <= share.mean() <= found["high"], (name, found, share.mean())


class OnePatch(nn.Module):
    """Two logits; class 0 wins while patch (0, 0) of a 2x2 grid keeps its pixels (bright), class
    1 once it is replaced by the fill (dark). Nothing else is read."""

    def forward(self, x):
        brightness = x[:, :, :4, :4].mean(dim=(1, 2, 3))
        return torch.stack([10 * (brightness - 0.5), torch.zeros_like(brightness)], dim=1)


@pytest.mark.parametrize("rank, expected", [(0, [1, 0, 0, 0, 0]), (3, [1, 1, 1, 1, 0])])
def test_a_model_that_reads_one_patch_loses_its_class_when_that_patch_goes(rank, expected):
    images = torch.ones(3, 1, 8, 8)  # a 2x2 grid of 4x4 patches
    maps = torch.zeros(3, 4)
    others = [p for p in range(4) if p != 0]
    ranked = others[:rank] + [0] + others[rank:]  # patch 0 at position `rank` of the order
    for position, patch in enumerate(ranked):
        maps[:, patch] = 4 - position
    order = removal_order(maps, torch.Generator().manual_seed(0))
    assert order[0].tolist() == ranked
    counts = removal_counts(4)
    assert counts == [0, 1, 2, 3, 4]
    targets, truth = torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long)
    probability, correct = perturbation_curves(
        OnePatch(), images, order, targets, truth, torch.zeros(1), (2, 2), counts
    )
    assert correct[:, 0].tolist() == expected
    bright, dark = torch.sigmoid(torch.tensor(5.0)).item(), torch.sigmoid(torch.tensor(-5.0)).item()
    assert probability[:, 0].tolist() == pytest.approx([bright if c else dark for c in expected])
    # areas by the trapezoid over [0, 1]: half a step of the first, or all but half the last
    assert area(correct, counts, 4).tolist() == pytest.approx([0.125 if rank == 0 else 0.875] * 3)


def test_removal_counts_are_every_patch_for_small_grids_and_tenths_for_large():
    assert removal_counts(16) == list(range(17))
    assert removal_counts(196) == [0, 20, 39, 59, 78, 98, 118, 137, 157, 176, 196]


def test_spearman_with_ties_and_reversal():
    a = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 2.0, 3.0]])
    assert spearman(a, a).tolist() == pytest.approx([1.0, 1.0])
    assert spearman(a, -a).tolist() == pytest.approx([-1.0, -1.0])
    tied = torch.tensor([[1.0, 1.0, 2.0, 2.0]])
    assert spearman(tied, torch.tensor([[1.0, 2.0, 3.0, 4.0]])).item() == pytest.approx(0.894427, abs=1e-5)


def test_rollout_ignores_the_target_and_gradient_rollout_does_not(trained):
    classifier, data = trained
    model = classifier.model
    images = data.split("test")[:16][0]
    zeros, ones = torch.zeros(16, dtype=torch.long), torch.ones(16, dtype=torch.long)
    for method in ("rollout", "cls"):
        torch.testing.assert_close(
            scored_maps(model, images, method, zeros), scored_maps(model, images, method, ones)
        )
    for method in ("grad-rollout", "input-gradient"):
        assert not torch.allclose(
            scored_maps(model, images, method, zeros), scored_maps(model, images, method, ones)
        )


def test_randomising_every_block_changes_the_input_gradient_map(trained):
    classifier, data = trained
    model = classifier.model
    images = data.split("test")[:32][0]
    predicted = model(images).argmax(-1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trained_maps = scored_maps(model, images, "input-gradient", predicted)
    assert spearman(trained_maps, trained_maps).mean().item() == pytest.approx(1.0)
    *_, (step, randomised) = randomisation_steps(model)
    assert step == f"head + blocks 0-{len(model.blocks) - 1}"
    randomised_maps = scored_maps(randomised, images, "input-gradient", predicted)
    assert spearman(trained_maps, randomised_maps).mean().item() < 0.5
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # copies were randomised


def test_patch_evidence_is_the_circles_patches(trained):
    classifier, data = trained
    model = classifier.model
    from vit.two_circles import circle_patch_masks

    hp = data.hparams
    expected = circle_patch_masks(data.circle_centres("test"), hp.image_size, hp.radius, 8, hp.wrap).any(1)
    assert torch.equal(patch_evidence(model, data.evidence("test")), expected)


@pytest.mark.slow
def test_vit_attention_score_prints_and_writes_every_figure(trained_checkpoint, tmp_path, capsys):
    out = tmp_path / "scores"
    attention_main(
        ["score", "--ckpt", trained_checkpoint, "--num_images", "24", "--batch_size", "16", "--out", out]
    )
    printed = capsys.readouterr().out
    assert "scored 24 test images of TwoCircles (4x4 patches)" in printed
    assert "relevance mass" in printed and "runner-up class" in printed
    assert {p.name for p in out.iterdir()} == {
        "scores.json", "perturbation.png", "perturbation_accuracy.png", "evidence.png", "layers_heads.png",
        "randomisation.png",
    }  # fmt: skip
    results = json.loads((out / "scores.json").read_text())
    assert list(results["methods"]) == list(METHODS)
    assert results["counts"] == list(range(17)) and results["num_images"] == 24
    assert results["figures"]["evidence"]["relevance_mass"]["mean"] == 1.0
    deletion = results["curves"]["rollout"]["deletion/probability"]
    insertion = results["curves"]["rollout"]["insertion/probability"]
    assert len(deletion) == 17 and deletion[0] == insertion[0] and deletion[-1] == insertion[-1]
    assert results["target_sensitivity"]["rollout"]["mean"] == pytest.approx(1.0)
    assert len(results["randomisation"]["rollout"]) == 1 + 2  # head, then each of the 2 blocks
    assert len(results["layers_heads"]["cls/relevance_mass"]) == 2  # layers
    assert "deletion" in results["protocol"] and results["settings"]["seed"] == 0


def folders_checkpoint(root, trained, tmp_path):
    """The trained two-circles model saved as if it had been trained on image folders at `root`."""
    model, _ = trained
    path = tmp_path / "folders.ckpt"
    data = {"root": str(root), "image_size": 32, "channels": 1, "classes": ["a", "b", "c", "d"]}
    torch.save(
        {
            "state_dict": model.state_dict(),
            "hyper_parameters": {**model.hparams, "_class_path": "vit.classifier.ViTClassifier"},
            "datamodule_hyper_parameters": {**data, "_class_path": "vit.datamodules.ImageFolders"},
            compat.CHECKPOINT_KEY: compat.FORMAT_VERSION,
        },
        path,
    )
    return path


def write_masks(root, split, classes, count, size_of=lambda k: SIZES[k % 4]):
    """White left half as evidence, for each image of `make_folders`."""
    for c, name in enumerate(classes):
        for j in range(count):
            w, h = size_of(c * count + j)
            mask = Image.new("L", (w, h), 0)
            mask.paste(255, (0, 0, w // 2, h))
            (root / "masks" / split / name).mkdir(parents=True, exist_ok=True)
            mask.save(root / "masks" / split / name / f"{j:02d}.png")


def test_image_folders_read_masks_prepared_as_their_images(tmp_path):
    classes = ("a", "b", "c", "d")
    root = make_folders(tmp_path / "data", classes, {"train": 5, "test": 2})
    data = ImageFolders(str(root), image_size=8, channels=1, val_size=4)
    assert data.evidence("test") is None  # no masks folder: no evidence
    write_masks(root, "test", classes, 2)
    write_masks(root, "train", classes, 5)
    masks = data.evidence("test")
    # stretched to 8x8 as the images are (13x9, 7x31, ...): the left half white, its edge blended
    assert masks.shape == (8, 8, 8) and masks[:, :, :3].all() and not masks[:, :, 5:].any()
    train, val = data.evidence("train"), data.evidence("val")
    assert len(train) == len(data.split("train").labels) == 16 and len(val) == 4


def test_score_on_image_folders_with_masks_and_without(trained, tmp_path, capsys):
    classes = ("a", "b", "c", "d")
    root = make_folders(tmp_path / "data", classes, {"train": 1, "test": 3})
    ckpt = folders_checkpoint(root, trained, tmp_path)
    attention_main(["score", "--ckpt", ckpt, "--no-sanity", "--methods", "rollout", "random"])
    printed = capsys.readouterr().out
    assert "no evidence figures: ImageFolders does not know which pixels carry its labels" in printed
    assert "relevance mass" not in printed
    write_masks(root, "test", classes, 3)
    attention_main(["score", "--ckpt", ckpt, "--no-sanity", "--methods", "rollout", "evidence"])
    printed = capsys.readouterr().out
    assert "relevance mass" in printed and "no evidence figures" not in printed


@pytest.mark.parametrize(
    "options, status, message",
    [
        (["--methods", "gradcam"], 2, "unknown method 'gradcam'; choose from cls, rollout"),
        (["--num_images", "0"], 2, "num_images=0 and batch_size=64 must be at least 1"),
        (["--methods", "evidence"], 2, "--methods evidence needs data with evidence: ImageFolders does not"),
        (["--masks", "wrong size"], 1, "is 9x9 pixels, its image"),
        (["--out", "{tmp}/file.txt"], 2, "is a file, not a folder"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(trained, tmp_path, capsys, options, status, message):
    classes = ("a", "b", "c", "d")
    root = make_folders(tmp_path / "data", classes, {"train": 1, "test": 1})
    if options[0] == "--masks":
        write_image(root / "masks" / "test" / "a" / "00.png", 255, "L", (9, 9))
        options = []
    (tmp_path / "file.txt").write_text("the user's")
    options = [o.replace("{tmp}", str(tmp_path)) for o in options]
    ckpt = folders_checkpoint(root, trained, tmp_path)
    found, error = command_error(
        attention_main, ["score", "--ckpt", ckpt, "--out", tmp_path / "out", *options], capsys
    )
    assert found == status and message in error, error
    assert not (tmp_path / "out").exists() and (tmp_path / "file.txt").read_text() == "the user's"


@pytest.mark.slow
def test_training_logs_the_evidence_mass_after_each_validation(runs):
    cli.main(["fit", *tiny_args(runs, "--trainer.max_epochs", "2")])
    with open(runs / "tiny" / "version_0" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/evidence_mass_rollout")]
    assert len(rows) == 3  # before training, at step 0, then after each epoch
    assert [r["step"] for r in rows][0] == "0" and not rows[0]["val/acc"] and rows[1]["val/acc"]
    for row in rows:
        for key in ("val/evidence_mass_rollout", "val/evidence_mass_grad_rollout", "val/evidence_share"):
            assert 0.0 < float(row[key]) < 1.0


def assert_page_file_refused(option, good, other, kind, checkpoint, tmp_path, capsys):
    """A results file for the page (`--scores`, `--heads`) is refused without --html (exit 2), and a
    JSON file of something else with one line (exit 1), before the page is written."""
    status, error = command_error(attention_main, ["--ckpt", checkpoint, option, good], capsys)
    assert status == 2 and f"{option} goes with --html" in error
    (tmp_path / "other.json").write_text(other)
    args = ["--ckpt", checkpoint, "--html", tmp_path / "p2.html", option, tmp_path / "other.json"]
    status, error = command_error(attention_main, args, capsys)
    assert status == 1 and f"is not {kind}" in error
    assert not (tmp_path / "p2.html").exists()


@pytest.mark.slow
def test_the_page_shows_the_scores_of_vit_attention_score(trained_checkpoint, tmp_path, capsys):
    """The explore page leaves a place for these scores: `vit-attention --html --scores FILE`."""
    attention_main(["score", "--ckpt", trained_checkpoint, "--num_images", "8", "--no-sanity",
                    "--methods", "rollout", "evidence", "--out", tmp_path / "scores"])  # fmt: skip
    scores = tmp_path / "scores" / "scores.json"
    expected = headline(json.loads(scores.read_text()))
    assert expected["evidence"]["relevance mass ↑"] == "1.000 [1.000, 1.000]"
    page = tmp_path / "page.html"
    attention_main(["--ckpt", trained_checkpoint, "--num_images", "2", "--html", page, "--scores", scores])
    text = page.read_text()
    for method, figures in expected.items():
        for name, value in figures.items():
            assert json.dumps(name)[1:-1] in text and value in text, (method, name)
    assert_page_file_refused("--scores", scores, '{"top1": 0.9}', "a scores.json of vit-attention score",
                             trained_checkpoint, tmp_path, capsys)  # fmt: skip


def test_score_on_image_files_leaves_out_the_evidence_and_says_why(trained_checkpoint, tmp_path, capsys):
    for i in range(3):
        write_image(tmp_path / "photos" / f"{i}.png", 40 * i, "L", SIZES[i])
    attention_main(["score", "--ckpt", trained_checkpoint, "--images", tmp_path / "photos", "--no-sanity"])
    printed = capsys.readouterr().out
    assert "scored 3 image files (4x4 patches)" in printed
    assert "no evidence figures: image files given with --images carry no evidence" in printed
    assert "relevance mass" not in printed and "input-gradient" in printed


@pytest.mark.slow
def test_the_class_token_map_is_called_cls_as_in_vit_attention_and_the_old_name_is_read(
    trained_checkpoint, tmp_path, capsys
):
    """`--methods cls` names the map `vit-attention --method cls` draws; `attention`, its name in
    earlier versions, gives the same scores under the new name, with a one-line note."""
    results = {}
    for name in ("cls", "attention"):
        attention_main(["score", "--ckpt", trained_checkpoint, "--num_images", "8", "--no-sanity",
                        "--methods", name, "--out", tmp_path / name])  # fmt: skip
        results[name] = json.loads((tmp_path / name / "scores.json").read_text())["figures"]
        note = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
        assert note == ([] if name == "cls" else ["note: the method 'attention' is now called 'cls'"])
    assert list(results["cls"]) == list(results["attention"]) == ["cls"]
    assert results["cls"] == results["attention"]


def test_ties_count_as_their_expectation_wherever_the_evidence_is():
    """A map that ties every patch scores the evidence's share, whether the evidence is on the first
    patch or the last (a stable sort gave 1 and 0)."""
    for where in (0, 3):
        evidence = torch.zeros(1, 4, dtype=torch.bool)
        evidence[0, where] = True
        scores = evidence_scores(torch.zeros(1, 4), evidence)
        assert scores["rank_accuracy"].item() == scores["pointing_game"].item() == 0.25
    # two of three tied patches make the top 2 next to an untied first one: 1 + 2/3 of a hit, of 2
    scores = evidence_scores(torch.tensor([[3.0, 1.0, 1.0, 1.0]]), torch.tensor([[True, True, False, False]]))
    assert scores["rank_accuracy"].item() == pytest.approx((1 + 1 / 3) / 2)


def test_the_last_randomisation_step_leaves_no_trained_parameter_of_the_head_or_the_blocks():
    """Relative position tables (held outside the blocks), LayerScale, LSA's temperature, the
    distillation head and the norm after pooling are drawn anew too."""
    from vit import ViT

    for options in (
        dict(depth=1, rel_pos_bias=True, pool="mean", pos_embed="none"),
        dict(depth=2, layer_scale=0.1, locality_attention=True, distilled=True),
        dict(depth=2, fc_norm=True, pool="mean"),
    ):
        model = ViT(preset="mini", image_size=16, patch_size=4, num_classes=3, **options)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))  # "trained": away from any initialisation
        *_, (_, last) = randomisation_steps(model)
        trained = dict(model.named_parameters())
        for name, p in last.named_parameters():
            if name.startswith(("blocks.", "rel_pos.", "head", "fc_norm")):
                assert not torch.equal(p, trained[name]), (options, name)


def test_the_page_takes_the_heads_of_vit_attention_heads(trained_checkpoint, tmp_path, capsys):
    """`vit-attention --html --heads heads.json` puts the mean-ablation grid on the page; without
    --html, or with a file that is not a heads.json, it is one line and nothing is written."""
    attention_main(["heads", "--ckpt", trained_checkpoint, "--num_images", "8", "--out", tmp_path / "heads"])
    heads = tmp_path / "heads" / "heads.json"
    page = tmp_path / "page.html"
    attention_main(["--ckpt", trained_checkpoint, "--num_images", "2", "--html", page, "--heads", heads])
    cells = json.loads(heads.read_text())["ablation"]["mean"]["accuracy"]
    means = [[cell["mean"] for cell in row] for row in cells]
    intervals = [[[cell["low"], cell["high"]] for cell in row] for row in cells]
    text = page.read_text()
    assert '"head_effects":{"title":"mean ablation of each head' in text
    assert f'"values":{json.dumps(means, separators=(",", ":"))}' in text
    assert f'"intervals":{json.dumps(intervals, separators=(",", ":"))}' in text
    capsys.readouterr()
    assert_page_file_refused("--heads", heads, "{}", "a heads.json of vit-attention heads",
                             trained_checkpoint, tmp_path, capsys)  # fmt: skip
