"""Activation patching: `vit.interpret.activation_patching`, the two-circles counterfactuals it
pairs images with, and `vit-attention patch`. The causal claims are checked on a model set by
hand, whose one working head is known (`test_head_analysis.one_head_model`)."""

import copy
import json
import math

import pytest
import torch
from helpers import command_error
from PIL import Image
from test_head_analysis import imported_models, one_head_model

from vit.commands import patch as patch_command
from vit.commands.attention import main as attention_main
from vit.interpret.activation_patching import (
    MIN_GAP,
    activations,
    analyse,
    logit_difference,
    patched_logits,
    resample_patches,
    restored,
    restored_ratio_of_means,
)
from vit.two_circles import TwoCircles, circle_pixels


def test_the_command_names_the_library_default():
    assert patch_command.MIN_GAP == MIN_GAP


@pytest.mark.parametrize("options", [{}, {"wrap": False}, {"num_classes": 2, "max_distractors": 2}])
def test_a_counterfactual_moves_one_circle_changes_the_class_and_nothing_else(options):
    data = TwoCircles(num_test=64, **options)
    images, labels = data.split("test")[:]
    moved, new_labels = data.counterfactuals("test")
    assert moved.shape == images.shape and (new_labels != labels).all()
    before, after = data.circle_centres("test"), data.counterfactual_centres("test")
    kept = (before == after).all(-1)  # (n, 2): which circle stayed where it was
    assert (kept.sum(1) == 1).all()
    radius, wrap = data.hparams.radius, data.hparams.wrap
    old, new = circle_pixels(before, 32, radius, wrap), circle_pixels(after, 32, radius, wrap)
    untouched = ~(old | new)[~kept].view(len(images), 32, 32)  # outside the moved circle, then and now
    assert torch.equal(moved[:, 0][untouched], images[:, 0][untouched])  # noise and distractors included
    assert (moved != images).any((1, 2, 3)).all()
    # the evidence moves with the circle: where the counterfactual's circles ink, and only there
    evidence = data.counterfactual_evidence("test")
    assert torch.equal(evidence, new.any(1)) and not torch.equal(evidence, data.evidence("test"))
    assert torch.equal(evidence | data.evidence("test"), (old | new).any(1))


def counterfactual_pairs(data, n=8):
    images, labels = data.splits["test"].images[:n], data.splits["test"].labels[:n]
    moved, new_labels = data.counterfactuals("test")
    return images, moved[:n], (labels, new_labels[:n])


def test_patching_every_token_of_the_last_block_restores_all_and_patching_nothing_none(trained):
    classifier, data = trained
    model = classifier.model
    clean, corrupted, (a, b) = counterfactual_pairs(data)
    clean_logits, _, residual = activations(model, clean)
    corrupted_logits = activations(model, corrupted)[0]
    high, low = logit_difference(clean_logits, a, b), logit_difference(corrupted_logits, a, b)
    tokens = residual.shape[2]
    which = torch.stack([torch.ones(tokens, dtype=torch.bool), torch.zeros(tokens, dtype=torch.bool)])
    patched = logit_difference(patched_logits(model, corrupted, 1, "tokens", residual[-1], which), a, b)
    shares = restored(patched, high, low, min_gap=1e-3)
    kept = ~shares[0].isnan()
    assert kept.sum() >= 4
    torch.testing.assert_close(shares[0][kept], torch.ones(int(kept.sum())), atol=1e-5, rtol=0)
    torch.testing.assert_close(shares[1][kept], torch.zeros(int(kept.sum())), atol=1e-5, rtol=0)


def test_the_one_working_head_restores_all_and_every_other_head_none():
    model = one_head_model(head=1)
    bright, dark = torch.ones(4, 1, 8, 8), torch.zeros(4, 1, 8, 8)
    results = analyse(model, bright, dark, batch_size=10)  # 2 pairs of 5 copies at once
    heads = results["per_pair"]["heads"]  # (layers, heads, pairs)
    counts = {"used": 4, "same_class": 0, "in_mean_of_ratios": 4, "gap_under_min_gap": 0}
    assert results["pair_counts"] == counts
    torch.testing.assert_close(heads[0, 1], torch.ones(4), atol=1e-6, rtol=0)
    assert (heads[[0, 1, 1], [0, 0, 1]] == 0).all()
    assert results["restored"]["heads"][0][1]["mean"] == pytest.approx(1.0, abs=1e-6)
    tokens = results["per_pair"]["tokens"]  # the class token carries it all, the patches nothing
    torch.testing.assert_close(tokens[:, 0], torch.ones(2, 4), atol=1e-6, rtol=0)
    assert (tokens[:, 1:] == 0).all()


def test_a_head_whose_output_projection_is_zero_restores_nothing(trained):
    classifier, data = trained
    model = copy.deepcopy(classifier.model)
    d_head = model.config.dim // model.config.heads
    with torch.no_grad():
        model.blocks[0].attn.proj.weight[:, d_head : 2 * d_head] = 0  # block 0, head 1 writes nothing
    clean, corrupted, classes = counterfactual_pairs(data)
    heads = analyse(model, clean, corrupted, classes, batch_size=64, min_gap=1e-3)["per_pair"]["heads"]
    kept = ~heads[0, 1].isnan()
    assert kept.sum() >= 4
    torch.testing.assert_close(heads[0, 1][kept], torch.zeros(int(kept.sum())), atol=1e-5, rtol=0)
    assert (heads[0, 0][kept].abs() > 1e-3).any()  # the other head does restore something


def test_vit_attention_patch_prints_the_tables_and_writes_the_figures(trained_checkpoint, tmp_path, capsys):
    out = tmp_path / "patch"
    attention_main(["patch", "--ckpt", trained_checkpoint, "--num_images", "6", "--batch_size", "34",
                    "--min_gap", "0.001", "--out", out])  # fmt: skip
    printed = capsys.readouterr().out
    assert "on 6 test images of TwoCircles and their counterfactuals" in printed
    assert "restored by each head's output" in printed and "class token" in printed
    assert sorted(p.name for p in out.iterdir()) == ["patch.json", "patch_heads.png", "patch_tokens.png"]
    results = json.loads((out / "patch.json").read_text())
    assert results["num_pairs"] == 6 and results["classes"] == "the labels of each pair"
    assert results["pair_counts"]["used"] == 6 and results["pair_counts"]["in_mean_of_ratios"] >= 3
    assert results["min_gap"] == 0.001 and "ratio of means" in results["protocol"]["restored"]
    assert math.isfinite(results["restored"]["heads"][0][0]["mean"])
    assert len(results["restored"]["heads"]) == 2 and len(results["restored"]["tokens"][1]) == 17
    assert results["settings"]["source"] == str(trained_checkpoint)


@pytest.mark.parametrize(
    ("options", "status", "message"),
    [
        (["--num_images", "0"], 2, "num_images=0 and batch_size=64 must be at least 1"),
        (["--pairs", "{tmp}/missing.csv"], 1, "--pairs: file not found"),
        (["--pairs", "{tmp}/short.csv"], 1, "line 2: 1 fields, expected clean,corrupted"),
        (["--pairs", "{tmp}/gone.csv"], 1, "image not found"),
        (["--images", "{tmp}/a.png", "--corrupt", "counterfactual"], 2, "have no counterfactuals"),
        (["--corrupt", "random:0"], 2, "--corrupt 'random:0'"),
        (["--min_gap", "0"], 2, "--min_gap 0 must be above 0"),
        (["--pairs", "{tmp}/pairs.csv", "--corrupt", "random:2"], 2, "not with --corrupt"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    trained_checkpoint, tmp_path, capsys, options, status, message
):
    Image.new("L", (32, 32)).save(tmp_path / "a.png")
    (tmp_path / "pairs.csv").write_text("clean,corrupted\na.png,a.png\n")
    (tmp_path / "short.csv").write_text("a.png,a.png\na.png\n")
    (tmp_path / "gone.csv").write_text("a.png,b.png\n")
    options = [o.replace("{tmp}", str(tmp_path)) for o in options]
    args = ["patch", "--ckpt", trained_checkpoint, "--out", tmp_path / "out", *options]
    found, error = command_error(attention_main, args, capsys)
    assert found == status and message in error, error
    assert not (tmp_path / "out").exists()


def capture_pairs(monkeypatch) -> list:
    """Record the (clean, corrupted, classes) that `vit-attention patch` hands
    `vit.interpret.activation_patching.analyse`, which still runs."""
    import vit.interpret.activation_patching

    seen, real = [], vit.interpret.activation_patching.analyse

    def recording(model, clean, corrupted, classes=None, *args, **kwargs):
        seen.append((clean.clone(), corrupted.clone(), classes))
        return real(model, clean, corrupted, classes, *args, **kwargs)

    monkeypatch.setattr(vit.interpret.activation_patching, "analyse", recording)
    return seen


def changed_patches(clean: torch.Tensor, corrupted: torch.Tensor, patch: int = 8) -> torch.Tensor:
    """Which patches of each image differ: (B, patches) bool, row by row over the grid."""
    differs = (clean != corrupted).any(1).float()[:, None]
    return torch.nn.functional.max_pool2d(differs, patch).flatten(1).bool()


def test_corrupt_evidence_replaces_the_evidence_patches_and_nothing_else(
    trained, trained_checkpoint, tmp_path, capsys, monkeypatch
):
    _, data = trained
    seen = capture_pairs(monkeypatch)
    attention_main(["patch", "--ckpt", trained_checkpoint, "--num_images", "6", "--corrupt", "evidence",
                    "--min_gap", "0.001", "--out", tmp_path / "out"])  # fmt: skip
    assert "their evidence patches replaced by the mean colour" in capsys.readouterr().out
    clean, corrupted, classes = seen[0]
    assert classes is None  # the clean and corrupted predictions, not labels
    evidence = data.evidence("test")  # the command spreads 6 images over the test split
    indices = [i for i in range(64) if torch.equal(data.splits["test"].images[i], clean[0])]
    assert indices, "the first clean image is a test image"
    inked = torch.nn.functional.max_pool2d(evidence[indices[0]][None, None].float(), 8).flatten().bool()
    assert torch.equal(changed_patches(clean, corrupted)[0], inked)
    assert torch.allclose(corrupted[0, 0][evidence[indices[0]]], clean.mean(dim=(0, 2, 3))[0].expand(1))
    results = json.loads((tmp_path / "out" / "patch.json").read_text())
    assert results["classes"] == "the predicted classes" and results["num_pairs"] == 6


def test_corrupt_random_replaces_k_patches_of_each_image(trained_checkpoint, tmp_path, capsys, monkeypatch):
    seen = capture_pairs(monkeypatch)
    attention_main(["patch", "--ckpt", trained_checkpoint, "--num_images", "5", "--corrupt", "random:3"])
    assert "3 of 16 patches at random replaced by the mean colour" in capsys.readouterr().out
    clean, corrupted, _ = seen[0]
    assert (changed_patches(clean, corrupted).sum(1) == 3).all()


def test_pairs_from_a_csv_patch_the_listed_files_clean_first(
    trained_checkpoint, tmp_path, capsys, monkeypatch
):
    folder = tmp_path / "pairs"
    folder.mkdir()
    rows = ["clean,corrupted"]
    for i in range(3):  # clean: a bright square on the left; corrupted: on the right
        for name, left in (("clean", 0), ("corrupted", 16)):
            canvas = Image.new("L", (32, 32))
            canvas.paste(255, (left, 8 * i, left + 16, 8 * i + 16))
            canvas.save(folder / f"{name}{i}.png")
        rows.append(f"clean{i}.png,corrupted{i}.png")
    (folder / "pairs.csv").write_text("\n".join(rows) + "\n")
    seen = capture_pairs(monkeypatch)
    out = tmp_path / "out"
    attention_main(["patch", "--ckpt", trained_checkpoint, "--pairs", folder / "pairs.csv",
                    "--min_gap", "0.001", "--out", out])  # fmt: skip
    assert "on 3 pairs of image files from" in capsys.readouterr().out
    clean, corrupted, classes = seen[0]
    assert clean.shape == corrupted.shape == (3, 1, 32, 32) and classes is None
    # the clean images are the first column (bright on the left), the corrupted the second
    assert (clean[:, :, :, :16].mean() > 0.4) and (clean[:, :, :, 16:].mean() < 0.1)
    assert (corrupted[:, :, :, 16:].mean() > 0.4) and (corrupted[:, :, :, :16].mean() < 0.1)
    results = json.loads((out / "patch.json").read_text())
    assert results["num_pairs"] == 3 and results["classes"] == "the predicted classes"


def test_imported_models_are_patched_at_the_same_places(tmp_path):
    """The class token after the last block carries the whole logit difference and no other token
    any of it (registers included: the head reads the class token alone)."""
    for name, model in imported_models(tmp_path).items():
        torch.manual_seed(0)
        clean, corrupted = torch.rand(6, 3, *model.image_size), torch.rand(6, 3, *model.image_size)
        classes = (torch.zeros(6, dtype=torch.long), torch.ones(6, dtype=torch.long))  # logit 0 - logit 1
        results = analyse(model, clean, corrupted, classes, batch_size=64, min_gap=1e-3)
        tokens = results["per_pair"]["tokens"]  # (layers, tokens, pairs)
        kept = ~tokens[-1, 0].isnan()
        assert kept.sum() >= 3, name
        prefix = model.num_prefix_tokens
        assert tokens.shape[:2] == (2, prefix + model.grid_size[0] * model.grid_size[1]), name
        torch.testing.assert_close(tokens[-1, 0][kept], torch.ones(int(kept.sum())), atol=1e-4, rtol=0)
        assert tokens[-1, 1:][:, kept].abs().max() < 1e-4, name
        assert results["per_pair"]["heads"].shape[:2] == (2, model.config.heads), name


def test_the_ratio_of_means_and_the_mean_of_ratios_from_hand_numbers():
    clean, corrupted = torch.tensor([2.0, 4.0, 1.0]), torch.tensor([0.0, 0.0, 0.95])
    patched = torch.tensor([[1.0, 3.0, 1.0]])  # one unit; the third pair's gap, 0.05, is under 0.1
    shares = restored(patched, clean, corrupted, min_gap=0.1)
    torch.testing.assert_close(shares[0, :2], torch.tensor([0.5, 0.75]))
    assert shares[0, 2].isnan()
    ratio, (low, high) = restored_ratio_of_means(patched, clean, corrupted)
    # every pair: (mean patched 5/3 - mean corrupted 0.95/3) / (mean clean 7/3 - 0.95/3)
    assert ratio.item() == pytest.approx((5 - 0.95) / (7 - 0.95))
    assert low.item() <= ratio.item() <= high.item() and low.item() < high.item()
    same, (low, high) = restored_ratio_of_means(clean[None], clean, corrupted)  # every pair restored
    assert same.item() == pytest.approx(1.0) and low.item() == pytest.approx(1.0) == high.item()


def test_pairs_whose_corruption_leaves_the_class_are_left_out_and_counted():
    """The one working head of `one_head_model` restores all of every pair the corruption changes;
    a pair of two bright images (both class 1) has nothing to restore and is counted apart, and a
    pair whose gap lies under min_gap leaves the mean of ratios only."""
    model = one_head_model(head=1)
    clean = torch.cat([torch.ones(3, 1, 8, 8), torch.ones(1, 1, 8, 8)])
    corrupted = torch.cat([torch.zeros(3, 1, 8, 8), torch.ones(1, 1, 8, 8)])
    results = analyse(model, clean, corrupted, batch_size=10)
    counts = {"used": 3, "same_class": 1, "in_mean_of_ratios": 3, "gap_under_min_gap": 1}
    assert results["pair_counts"] == counts
    assert results["restored"]["heads"][0][1]["mean"] == pytest.approx(1.0, abs=1e-6)
    assert results["mean_of_ratios"]["heads"][0][1]["mean"] == pytest.approx(1.0, abs=1e-6)
    gap = (results["per_pair"]["clean"] - results["per_pair"]["corrupted"])[0].item()
    results = analyse(model, clean, corrupted, batch_size=10, min_gap=gap + 1)  # every gap under it now
    assert results["pair_counts"]["in_mean_of_ratios"] == 0 and results["pair_counts"]["used"] == 3
    assert math.isnan(results["mean_of_ratios"]["heads"][0][1]["mean"])
    assert results["restored"]["heads"][0][1]["mean"] == pytest.approx(1.0, abs=1e-6)


def test_resampled_patches_come_from_the_same_places_of_an_image_of_another_class():
    model = one_head_model()  # a 2x2 grid of 4-pixel patches
    images = torch.arange(6.0).view(6, 1, 1, 1).expand(6, 1, 8, 8).clone()  # image i: all pixels i
    classes = torch.tensor([0, 0, 1, 1, 2, 2])
    corrupted, donors = resample_patches(model, images, classes, 2, torch.Generator().manual_seed(0))
    assert (classes[donors] != classes).all()
    patches = corrupted.unfold(2, 4, 4).unfold(3, 4, 4).reshape(6, 4, 16)  # (images, patches, pixels)
    for i in range(6):
        taken = (patches[i] == donors[i].item()).all(-1)
        kept = (patches[i] == i).all(-1)
        assert taken.sum() == 2 and (taken | kept).all(), i
    with pytest.raises(ValueError, match="all of class 1"):
        resample_patches(model, images, torch.ones(6, dtype=torch.long), 2, torch.Generator())


def test_corrupt_resample_takes_k_patches_from_other_classes(trained_checkpoint, capsys, monkeypatch):
    seen = capture_pairs(monkeypatch)
    attention_main(["patch", "--ckpt", trained_checkpoint, "--num_images", "6", "--corrupt", "resample:3"])
    printed = capsys.readouterr().out
    assert "3 of 16 patches at random taken from an image of another class (by their labels)" in printed
    clean, corrupted, _ = seen[0]
    assert (changed_patches(clean, corrupted).sum(1) <= 3).all() and changed_patches(clean, corrupted).any()
    assert patch_command.parse_corrupt(None) == (None, None)
    assert patch_command.parse_corrupt("resample") == ("resample", None)
    assert patch_command.parse_corrupt("resample:5") == ("resample", 5)


def test_a_gap_of_exactly_min_gap_is_kept_and_random_patches_take_one_to_all():
    from vit.interpret.activation_patching import random_patches

    shares = restored(
        torch.tensor([[1.0, 1.0]]), torch.tensor([2.0, 0.5]), torch.tensor([0.0, 0.0]), min_gap=0.5
    )
    assert shares.tolist() == [[0.5, 2.0]]
    g = torch.Generator().manual_seed(0)
    assert random_patches(3, 4, 1, g).sum(1).tolist() == [1, 1, 1] and random_patches(3, 4, 4, g).all()
    picked = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)  # the generator decides, not the global state
        picked.append(random_patches(50, 16, 3, torch.Generator().manual_seed(7)))
    assert picked[0].dtype == torch.bool and torch.equal(picked[0], picked[1])
    assert len({tuple(row.tolist()) for row in picked[0]}) > 10  # each image its own patches
    for k in (0, 5):
        with pytest.raises(ValueError, match=f"random:{k} must replace between 1 and 4 patches"):
            random_patches(3, 4, k, g)


def test_resampling_is_seeded_picks_many_donors_and_reads_a_non_square_grid():
    from vit import ViT

    model = ViT(preset="micro", image_size=(8, 12), patch_size=4, in_channels=1, num_classes=2)
    assert model.grid_size == (2, 3)
    images = torch.arange(20.0).view(20, 1, 1, 1).expand(20, 1, 8, 12).clone()
    classes = torch.arange(20) % 2
    runs = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)  # the result must not depend on it
        runs.append(resample_patches(model, images, classes, 6, torch.Generator().manual_seed(0)))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    corrupted, donors = runs[0]
    assert len(set(donors[classes == 0].tolist())) > 2  # each image draws its own donor
    assert torch.equal(corrupted, images[donors])  # all 6 patches of the 2x3 grid taken
    some = []
    for global_seed in (1, 2):  # 2 of the 6 patches: which ones is the generator's to draw
        torch.manual_seed(global_seed)
        some.append(resample_patches(model, images, classes, 2, torch.Generator().manual_seed(0))[0])
    assert torch.equal(some[0], some[1]) and not torch.equal(some[0], corrupted)
    with pytest.raises(ValueError, match="^resampled patches need, for each image, an image of another"):
        resample_patches(model, images, torch.zeros(20, dtype=torch.long), 6, torch.Generator())
    with pytest.raises(ValueError, match="these 1 images are all of class 1"):  # one image: no other class
        resample_patches(model, images[:1], torch.ones(1, dtype=torch.long), 6, torch.Generator())


def test_the_ratio_of_means_bootstrap_is_seeded_and_its_own():
    g = torch.Generator().manual_seed(0)
    clean, corrupted, patched = (
        torch.rand(40, generator=g) + 2,
        torch.rand(40, generator=g),
        torch.rand(3, 40, generator=g),
    )
    ratio, bounds = restored_ratio_of_means(patched, clean, corrupted)  # each unit a ratio of its own means
    for unit in range(3):
        one, one_bounds = restored_ratio_of_means(patched[unit], clean, corrupted)
        torch.testing.assert_close(ratio[unit], one)
        torch.testing.assert_close(bounds[:, unit], one_bounds)
    torch.manual_seed(1)
    first = restored_ratio_of_means(patched, clean, corrupted)
    torch.manual_seed(2)
    again = restored_ratio_of_means(patched, clean, corrupted, samples=1000, seed=0)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[1], restored_ratio_of_means(patched, clean, corrupted, seed=1)[1])


def test_an_unknown_site_is_named_with_the_choices():
    model = one_head_model()
    with pytest.raises(ValueError, match="^unknown site 'neurons'; choose one of heads, tokens$"):
        patched_logits(model, torch.zeros(1, 1, 8, 8), 0, "neurons", torch.zeros(1), torch.zeros(1, 1))


def test_the_gap_rule_counts_pairs_by_their_own_gap_and_the_seed_reaches_the_intervals(trained):
    classifier, data = trained
    clean, corrupted, classes = counterfactual_pairs(data)
    first = analyse(classifier.model, clean, corrupted, classes, batch_size=64, min_gap=1e-3)
    gaps = (first["per_pair"]["clean"] - first["per_pair"]["corrupted"]).abs()
    median = gaps.median().item()
    results = analyse(classifier.model, clean, corrupted, classes, batch_size=64, min_gap=median)
    assert results["pair_counts"]["gap_under_min_gap"] == int((gaps < median).sum()) > 0
    assert results["pair_counts"]["in_mean_of_ratios"] == int((gaps >= median).sum())  # the median: kept
    reseeded = analyse(classifier.model, clean, corrupted, classes, batch_size=64, min_gap=1e-3, seed=1)
    for figures in ("restored", "mean_of_ratios"):
        a, b = first[figures]["heads"][0][0], reseeded[figures]["heads"][0][0]
        assert a["mean"] == pytest.approx(b["mean"]), figures
        assert (a["low"], a["high"]) != (b["low"], b["high"]), figures
    default = analyse(classifier.model, clean, corrupted, classes, batch_size=64, min_gap=1e-3, seed=0)
    assert default["restored"] == first["restored"] and default["mean_of_ratios"] == first["mean_of_ratios"]


def test_a_non_square_grid_is_patched_token_by_token_and_a_headless_model_is_refused():
    from vit import ViT

    torch.manual_seed(0)
    model = ViT(preset="micro", image_size=(8, 12), patch_size=4, in_channels=1, num_classes=2).eval()
    clean, corrupted = torch.rand(3, 1, 8, 12), torch.rand(3, 1, 8, 12)
    classes = torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.long)
    results = analyse(model, clean, corrupted, classes)
    assert results["tokens"] == 7 and results["per_pair"]["patched/tokens"].shape == (2, 7, 3)
    headless = ViT(preset="micro", image_size=8, patch_size=4, in_channels=1, num_classes=0).eval()
    with pytest.raises(ValueError, match=r"^the model has no head \(num_classes 0\): it predicts no class$"):
        analyse(headless, torch.rand(2, 1, 8, 8), torch.rand(2, 1, 8, 8))


def test_ratio_figures_of_one_unit_and_a_one_class_model_whose_pairs_all_share_the_class():
    from vit import ViT
    from vit.interpret.activation_patching import ratio_figures

    one_unit = ratio_figures(torch.tensor(0.5), torch.tensor([0.25, 0.75]))
    assert one_unit == {"mean": 0.5, "low": 0.25, "high": 0.75}
    one = ViT(preset="micro", image_size=8, patch_size=4, in_channels=1, num_classes=1).eval()
    results = analyse(one, torch.rand(3, 1, 8, 8), torch.rand(3, 1, 8, 8))
    counts = {"used": 0, "same_class": 3, "in_mean_of_ratios": 0, "gap_under_min_gap": 3}
    assert results["pair_counts"] == counts
    assert math.isnan(results["restored"]["heads"][0][0]["mean"])
