"""Which heads a ViT uses: `vit.interpret.head_analysis` (ablation, direct logit attribution,
logit lens, high-norm tokens) and `vit-attention heads`. The causal claims are checked on a model
set by hand, whose one working head is known."""

import copy
import json
import math
import re

import pytest
import torch
from helpers import command_error

from vit import ViT
from vit.commands import heads as heads_command
from vit.commands.attention import main as attention_main
from vit.interpret.head_analysis import ATTRIBUTIONS, NORM_RATIO, analyse, attribution, contrast, record
from vit.interpret.score import score
from vit.interpret.stats import interval
from vit.interpret.tables import READINGS


def test_the_command_names_the_library_defaults():
    assert heads_command.NORM_RATIO == NORM_RATIO
    assert heads_command.ATTRIBUTIONS == tuple(ATTRIBUTIONS)
    assert set(READINGS) == set(ATTRIBUTIONS)


@pytest.mark.parametrize(
    "options",
    [{}, {"pool": "mean"}, {"pool": "mean", "fc_norm": True}, {"num_registers": 2, "layer_scale": 0.5},
     {"distilled": True}, {"pre_norm": True, "qkv_bias": False}],
    ids=["cls", "mean", "fc_norm", "registers+layer_scale", "distilled", "pre_norm"],
)  # fmt: skip
def test_the_attribution_parts_sum_to_the_reading_they_split(options):
    torch.manual_seed(0)
    model = ViT(preset="micro", image_size=16, patch_size=4, in_channels=1, num_classes=3, **options).eval()
    with torch.no_grad():  # biases and norms away from their initial zeros and ones
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    found = record(model, torch.rand(6, 1, 16, 16))
    targets = torch.tensor([0, 1, 2, 0, 1, 2])  # not only the predicted class
    readings = {  # weights over the classes -> the reading of the logits they give, computed directly
        "one class": (torch.eye(3)[targets], found.logits[torch.arange(6), targets]),
        "any weights": (torch.randn(6, 3), None),
    }
    for name, (weights, expected) in readings.items():
        parts = attribution(model, found, weights)
        total = (parts["embeddings"] + parts["heads"].sum((0, 1)) + parts["attention_bias"].sum(0)
                 + parts["mlp"].sum(0) + parts["constant"])  # fmt: skip
        expected = (found.logits * weights).sum(-1) if expected is None else expected
        torch.testing.assert_close(total, expected, atol=1e-4, rtol=0, msg=name)
        torch.testing.assert_close(parts["total"], expected, atol=1e-5, rtol=0, msg=name)
        assert parts["heads"].shape == (2, 2, 6) and parts["heads"].abs().min() > 0


def test_the_attributed_readings_are_the_difference_to_the_runner_up_the_centred_and_the_raw_logit():
    logits = torch.tensor([[1.0, 5.0, 2.0, -1.0], [0.0, -2.0, 3.0, 2.5]])
    top, second = [1, 2], [2, 3]
    readings = {
        "difference": logits[[0, 1], top] - logits[[0, 1], second],  # 3.0, 0.5
        "centred": logits[[0, 1], top] - logits.mean(-1),
        "logit": logits[[0, 1], top],
    }
    for kind, expected in readings.items():
        torch.testing.assert_close((contrast(logits, kind) * logits).sum(-1), expected, msg=kind)
    assert set(readings) == set(ATTRIBUTIONS)
    with pytest.raises(ValueError, match="unknown attribution 'softmax'"):
        contrast(logits, "softmax")


def test_the_logit_lens_after_the_last_block_is_the_model(trained):
    classifier, data = trained
    model = classifier.model
    images, labels = data.splits["test"].images[:24], data.splits["test"].labels[:24]
    results = analyse(model, images, labels, batch_size=12)
    lens = results["per_image"]["lens"]  # (layers, images): the class read after each block
    assert torch.equal(lens[-1], model(images).argmax(-1))
    assert results["logit_lens"]["accuracy"][-1] == results["accuracy"]
    assert results["accuracy"]["mean"] == (model(images).argmax(-1) == labels).double().mean().item()
    assert "patches" not in results["logit_lens"]  # the head reads the class token alone

    mean_pooled = ViT(preset="micro", image_size=32, patch_size=8, in_channels=1, num_classes=4, pool="mean")
    results = analyse(mean_pooled.eval(), images, labels, batch_size=24)
    assert torch.equal(results["per_image"]["lens"][-1], mean_pooled(images).argmax(-1))
    assert len(results["logit_lens"]["patches"]) == 2 and len(results["logit_lens"]["patches"][0]) == 16


def one_head_model(head: int = 1) -> ViT:
    """A ViT set by hand (4 channels, 2 blocks of 2 heads, 2x2 patches of 4x4 pixels, 2 classes)
    whose only working part is head `head` of block 0: it copies into the class token whether
    the patches are bright (class 1) or dark (class 0), and the head reads that alone. Every other
    weight and bias is zero, the norms are left at weight 1, bias 0."""
    model = ViT(preset="micro", dim=4, image_size=8, patch_size=4, in_channels=1, num_classes=2).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for norm in (m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)):
            norm.weight.fill_(1.0)
        model.cls_token[0, 0] = torch.tensor([1.0, 0, 0, 0])
        model.patch_embed.proj.weight[1] = 1 / 16  # a patch's mean brightness into channel 1
        # the head's first value: 0 for the class token, 4/sqrt(3) for a bright patch (0 for a
        # dark one: the norm of a zero token is zero); queries and keys zero, so uniform attention
        model.blocks[0].attn.qkv.weight[2 * 4 + 2 * head] = torch.tensor([0.0, 1, 0, -1])
        model.blocks[0].attn.proj.weight[2, 2 * head] = 1.0  # ... written into channel 2
        model.head.weight[:] = torch.tensor([[0.0, 0, -1, 0], [0, 0, 1, 0]])  # channel 2 is the class
    return model


def test_ablating_the_one_working_head_sends_accuracy_to_chance_and_no_other_head_matters():
    model = one_head_model(head=1)
    images = torch.cat([torch.zeros(4, 1, 8, 8), torch.ones(4, 1, 8, 8)])
    labels = torch.tensor([0] * 4 + [1] * 4)
    assert torch.equal(model(images).argmax(-1), labels)
    results = analyse(model, images, labels, batch_size=6)  # chunks of 2 images, 3 copies each
    per_image = results["per_image"]
    assert results["accuracy"]["mean"] == 1.0
    for kind in ("mean", "zero"):
        accuracy = per_image[f"ablation/{kind}/accuracy"]  # (layers, heads, images)
        log_p = per_image[f"ablation/{kind}/log_probability"]
        # zero: every image reads dark (class 0); mean: every image reads half bright (class 1)
        assert accuracy[0, 1].mean() == -0.5, kind
        changed = log_p[0, 1] < 0
        assert changed.all() if kind == "mean" else changed[4:].all() and (log_p[0, 1, :4] == 0).all()
        others = [(0, 0), (1, 0), (1, 1)]
        assert all((accuracy[lh] == 0).all() and (log_p[lh] == 0).all() for lh in others), kind
    attributed = per_image["attribution/heads"]
    assert (attributed[0, 1, 4:] > 0).all() and (attributed[0, 1, :4] == 0).all()  # dark: it writes zero
    assert (attributed[[0, 1, 1], [0, 0, 1]] == 0).all()
    # the other heads' rows of the printed table: no change at all, interval included
    for layer, head in ((0, 0), (1, 0), (1, 1)):
        cell = results["ablation"]["zero"]["accuracy"][layer][head]
        assert cell == {"mean": 0.0, "low": 0.0, "high": 0.0}


def test_a_head_whose_output_projection_is_zero_shows_exactly_no_effect(trained):
    classifier, data = trained
    model = copy.deepcopy(classifier.model)
    images, labels = data.splits["test"].images[:16], data.splits["test"].labels[:16]
    d_head = model.config.dim // model.config.heads
    with torch.no_grad():
        model.blocks[0].attn.proj.weight[:, d_head : 2 * d_head] = 0  # block 0, head 1 writes nothing
    per_image = analyse(model, images, labels, batch_size=16)["per_image"]
    for kind in ("mean", "zero"):
        for measure in ("accuracy", "log_probability"):
            changes = per_image[f"ablation/{kind}/{measure}"]
            assert (changes[0, 1] == 0).all(), (kind, measure)
        assert (per_image[f"ablation/{kind}/log_probability"][0, 0] != 0).any()  # the other head does
    assert (per_image["attribution/heads"][0, 1] == 0).all()
    assert (per_image["attribution/heads"][0, 0] != 0).all()


def test_a_register_of_large_norm_is_flagged_and_its_attention_measured():
    torch.manual_seed(0)
    model = ViT(preset="micro", image_size=16, patch_size=4, in_channels=1, num_classes=3, num_registers=1)
    with torch.no_grad():
        model.reg_token.fill_(100.0)  # norm 200 against patch tokens of norm about 6
    results = analyse(model.eval(), torch.rand(4, 1, 16, 16), batch_size=4)
    first = results["norms"]["layers"][0]
    assert first["registers_flagged"]["mean"] == 1.0 and first["class token_flagged"]["mean"] == 0.0
    assert first["registers_ratio"]["mean"] > NORM_RATIO and first["patches_flagged"]["mean"] == 0.0
    assert 0 <= first["attention_to_flagged"]["mean"] <= 1
    assert math.isclose(first["token_share_flagged"]["mean"], 1 / (2 + 16), rel_tol=1e-6)  # 1 of 18 tokens
    assert "attention_to_flagged" not in results["norms"]["layers"][-1]  # no block after the last


def test_vit_attention_heads_prints_the_tables_and_writes_the_figures(trained_checkpoint, tmp_path, capsys):
    out = tmp_path / "heads"
    attention_main(["heads", "--ckpt", trained_checkpoint, "--num_images", "12", "--batch_size", "12",
                    "--out", out])  # fmt: skip
    printed = capsys.readouterr().out
    assert "analysed 2 layers x 2 heads on 12 test images of TwoCircles" in printed
    titles = ("each head: ablated alone", "the logit difference, predicted class - runner-up",
              "their sum", "logit lens", "high-norm tokens", "each head: attention mass on the evidence",
              "evidence -> evidence, mean ablation: ", "class token's attention")  # fmt: skip
    for title in titles:
        assert title in printed
    assert sorted(p.name for p in out.iterdir()) == [
        "ablation_mean.png", "ablation_zero.png", "attribution.png", "heads.json", "logit_lens.png",
        "token_norms.png",
    ]  # fmt: skip
    results = json.loads((out / "heads.json").read_text())
    assert results["num_images"] == 12 and results["against"] == "labels"
    assert len(results["ablation"]["mean"]["accuracy"]) == 2 and len(results["attribution"]["heads"][1]) == 2
    assert results["settings"]["source"] == str(trained_checkpoint)
    assert results["attribute"] == "difference" and "runner-up" in results["protocol"]["attributed"]
    found = results["evidence"]
    assert len(found["mass"]["query"]) == 2 and set(found["spearman"]) == {"query", "cls"}
    correlation = found["spearman"]["cls"]["mean"]
    assert set(correlation) == {"rho", "p", "low", "high", "n", "images"} and correlation["n"] == 4
    assert 0 < correlation["p"] <= 1 and correlation["low"] <= correlation["high"]


def means(table: list[list[dict]]) -> torch.Tensor:
    """The means of a table of figures [layer][head], flattened."""
    return torch.tensor([[figure["mean"] for figure in row] for row in table]).flatten()


def test_each_heads_mass_on_the_evidence_is_the_one_score_measures_and_ranks_against_its_ablation(trained):
    classifier, data = trained
    model = classifier.model
    images, labels = data.splits["test"].images[:24], data.splits["test"].labels[:24]
    evidence = data.evidence("test")[:24]
    results = analyse(model, images, labels, batch_size=10, evidence=evidence)  # chunks of 10, 10, 4
    found = results["evidence"]
    scored = score(model, images, labels, evidence, ["random"], batch_size=24, sanity=False)
    for name in ("query", "cls"):
        for layer in range(2):
            for head in range(2):
                theirs = scored["layers_heads"][f"{name}/relevance_mass"][layer][head]["mean"]
                assert found["mass"][name][layer][head]["mean"] == pytest.approx(theirs)
    assert found["share"] == pytest.approx(scored["evidence_share"])
    # Spearman's correlation, from the printed means, with ranks counted independently
    for name in ("query", "cls"):
        mass = means(found["mass"][name])
        for kind in ("mean", "zero"):
            loss = -means(results["ablation"][kind]["log_probability"])
            ranks = [v.argsort().argsort().double() for v in (mass, loss)]
            expected = torch.corrcoef(torch.stack(ranks))[0, 1].item()
            assert found["spearman"][name][kind]["rho"] == pytest.approx(expected, abs=1e-6)
    assert "evidence" not in analyse(model, images, labels, batch_size=24)  # nothing known, nothing said
    reseeded = analyse(model, images, labels, batch_size=24, evidence=evidence, seed=1)["evidence"][
        "spearman"
    ]
    for name in ("query", "cls"):  # the same correlation; its resampling follows the seed
        first, second = found["spearman"][name]["mean"], reseeded[name]["mean"]
        assert first["rho"] == second["rho"] and first["n"] == second["n"] == 4
        assert first["p"] != second["p"]


@pytest.mark.parametrize(
    ("options", "status", "message"),
    [
        (["--num_images", "0"], 2, "num_images=0 and batch_size=64 must be at least 1"),
        (["--norm_ratio", "1"], 2, "--norm_ratio 1 must be above 1"),
        (["--out", "{tmp}/file.txt"], 2, "is a file, not a folder"),
        (["--layer", "0"], 2, "--layer"),
        (["--ckpt", "{tmp}/missing.ckpt"], 1, "missing.ckpt"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    trained_checkpoint, tmp_path, capsys, options, status, message
):
    (tmp_path / "file.txt").write_text("the user's")
    options = [o.replace("{tmp}", str(tmp_path)) for o in options]
    args = ["heads", "--ckpt", trained_checkpoint, "--out", tmp_path / "out", *options]
    found, error = command_error(attention_main, args, capsys)
    assert found == status and message in error, error
    assert not (tmp_path / "out").exists() and (tmp_path / "file.txt").read_text() == "the user's"


def imported_models(tmp_path) -> dict:
    """A timm DINOv2 with 4 registers (made small: 2 blocks, 3 classes) and a transformers ViT
    (2 blocks, 5 classes), random and perturbed, each as this project loads it."""
    import timm
    from test_pretrained import hf_source, perturbed_weights

    from vit.pretrained import _from_timm, load_source

    source = timm.create_model(
        "vit_small_patch14_reg4_dinov2", pretrained=False, img_size=(28, 28), depth=2, num_classes=3
    )
    perturbed_weights(source, tmp_path / "unused.safetensors")
    _, folder = hf_source(tmp_path, "ViTForImageClassification")
    return {
        "timm, registers": _from_timm(source, "small vit_small_patch14_reg4_dinov2").eval(),
        "transformers": load_source(f"hf:{folder}")[0].eval(),
    }


@pytest.mark.slow
def test_imported_models_are_analysed_at_the_same_places(tmp_path):
    """timm's (with registers) and transformers' ViTs, as loaded: the attribution's parts sum to the
    logit, the logit lens after the last block is the model, and every head has its figures."""
    for name, model in imported_models(tmp_path).items():
        torch.manual_seed(0)
        images = torch.rand(5, 3, *model.image_size)
        found = record(model, images)
        targets = found.logits.argmax(-1)
        parts = attribution(model, found, contrast(found.logits, "logit"))
        total = (parts["embeddings"] + parts["heads"].sum((0, 1)) + parts["attention_bias"].sum(0)
                 + parts["mlp"].sum(0) + parts["constant"])  # fmt: skip
        torch.testing.assert_close(total, found.logits[torch.arange(5), targets], atol=1e-3, rtol=1e-4)
        results = analyse(model, images, batch_size=64)
        assert torch.equal(results["per_image"]["lens"][-1], targets), name
        assert len(results["ablation"]["mean"]["accuracy"][1]) == model.config.heads, name


# ---------------------------------------------------------------- maths a wrong version would fail


def perturbed_model(**options) -> ViT:
    """A micro ViT (2 blocks of 2 heads, 16 patches, 3 classes), its weights, biases and norms moved
    well away from their initial values, so that no part is neutral by accident."""
    torch.manual_seed(0)
    model = ViT(preset="micro", image_size=16, patch_size=4, in_channels=1, num_classes=3, **options).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return model


def test_mean_ablation_replaces_each_position_with_its_own_mean():
    """With the patch embedding zeroed, every image gives the same tokens, which differ by position
    (the learned positions): each head's output is then its own mean at every position, and mean
    ablation must change nothing. A mean over positions as well would change the prediction."""
    model = perturbed_model()
    with torch.no_grad():
        model.patch_embed.proj.weight.zero_()
    images = torch.rand(6, 1, 16, 16)
    outputs = record(model, images).heads  # (L, B, N, heads * d_head)
    assert (outputs[:, 0] - outputs[:, 0].mean(1, keepdim=True)).abs().amax() > 0.1  # positions differ
    per_image = analyse(model, images, batch_size=30)["per_image"]
    assert per_image["ablation/mean/log_probability"].abs().amax() < 1e-5
    assert per_image["ablation/zero/log_probability"].abs().amax() > 1e-2  # the heads do matter


@pytest.mark.parametrize(
    "options",
    [{}, {"pool": "mean"}, {"pool": "mean", "fc_norm": True}, {"num_registers": 2}],
    ids=["cls", "mean", "fc_norm", "registers"],
)
def test_the_logit_lens_after_each_block_is_the_model_cut_after_that_block(options):
    model = perturbed_model(**options)
    images = torch.rand(5, 1, 16, 16)
    from vit.interpret.head_analysis import lens_logits

    lens = lens_logits(model, record(model, images).residual)
    for layer in range(len(model.blocks)):
        cut = copy.deepcopy(model)
        cut.blocks = torch.nn.ModuleList(list(cut.blocks)[: layer + 1])
        with torch.no_grad():
            torch.testing.assert_close(lens[layer], cut(images), atol=1e-5, rtol=1e-5, msg=f"after {layer}")


def test_each_patch_read_alone_averages_to_the_models_reading_of_the_patch_mean():
    """The head is linear after the final norm (no fc_norm): the mean over patches of each patch's
    logits is the logit lens of a model that reads the patches' mean; the class token, set far
    from the patches, must not be among them."""
    from vit.interpret.head_analysis import lens_logits, patch_lens_logits

    model = perturbed_model(pool="mean")
    with torch.no_grad():
        model.cls_token.mul_(20)
    residual = record(model, torch.rand(4, 1, 16, 16)).residual
    per_patch = patch_lens_logits(model, residual)  # (L, B, patches, classes)
    assert per_patch.shape == (2, 4, 16, 3)
    torch.testing.assert_close(per_patch.mean(2), lens_logits(model, residual), atol=1e-5, rtol=1e-5)


def test_the_attention_to_high_norm_tokens_is_the_next_blocks_and_the_class_tokens_is_its_row():
    from vit.interpret.maps import attention_weights

    model = perturbed_model(num_registers=1)
    with torch.no_grad():
        model.reg_token.fill_(100.0)
    images = torch.rand(4, 1, 16, 16)
    results = analyse(model, images, batch_size=4)
    assert results["per_image"]["ratios"][0, :, 1].min() > NORM_RATIO  # the register, flagged after block 0
    flagged = results["per_image"]["ratios"][0] > NORM_RATIO  # (B, tokens)
    weights = attention_weights(model, images)  # (L, B, heads, T, T)
    row = results["norms"]["layers"][0]
    for block in (0, 1):  # the figure is block 1's, and block 0 gives another
        everyone = (weights[block].mean((1, 2)) * flagged).sum(-1).mean().item()
        of_cls = (weights[block][:, :, 0].mean(1) * flagged).sum(-1).mean().item()
        matches = (row["attention_to_flagged"]["mean"] == pytest.approx(everyone, abs=1e-6),
                   row["cls_attention_to_flagged"]["mean"] == pytest.approx(of_cls, abs=1e-6))  # fmt: skip
        assert all(matches) == (block == 1), block


def test_the_norm_ratio_divides_by_the_median_of_the_patch_tokens_only():
    from vit.interpret.head_analysis import norm_ratios

    model = ViT(preset="micro", image_size=12, patch_size=4, in_channels=1, num_classes=2, num_registers=2)
    assert model.num_prefix_tokens == 3 and model.grid_size == (3, 3)
    norms = torch.tensor([50.0, 60.0, 70.0, 1, 2, 3, 4, 5, 6, 7, 8, 9])  # 3 large prefix tokens, 9 patches
    residual = torch.zeros(1, 1, 12, 8)
    residual[..., 0] = norms
    torch.testing.assert_close(norm_ratios(model, residual)[0, 0], norms / 5)  # the patches' median is 5


def test_each_ablated_copy_is_measured_against_the_intact_copy():
    from vit.interpret.head_analysis import ablation_changes

    logits = torch.tensor([[[2.0, 0.0]], [[0.0, 2.0]], [[0.0, 3.0]]])  # intact, then two ablated copies
    accuracy, log_p = ablation_changes(logits, torch.tensor([0]), torch.tensor([0]))
    assert accuracy.tolist() == [[-1.0], [-1.0]]
    expected = logits.log_softmax(-1)[:, 0, 0]
    torch.testing.assert_close(log_p[:, 0], expected[1:] - expected[0])


def test_two_classes_have_a_runner_up_and_the_default_is_the_difference():
    logits = torch.tensor([[0.5, 2.0], [1.0, -1.0]])
    assert contrast(logits).tolist() == [[-1.0, 1.0], [1.0, -1.0]]
    assert torch.equal(contrast(logits), contrast(logits, "difference"))
    assert contrast(logits[:1]).tolist() == [[-1.0, 1.0]]  # one image has a runner-up too
    with pytest.raises(ValueError, match="choose one of difference, centred, logit"):
        contrast(logits, "probability")


def test_the_prefix_tokens_are_named_by_kind():
    from vit.interpret.head_analysis import token_kinds

    kinds = {
        "class token only": ({}, ["class token"]),
        "distilled, 2 registers": ({"distilled": True, "num_registers": 2},
                                   ["class token", "distillation token", "registers", "registers"]),
        "no class token": ({"class_token": False, "pool": "mean"}, []),
    }  # fmt: skip
    for name, (options, expected) in kinds.items():
        model = ViT(preset="micro", image_size=8, patch_size=4, in_channels=1, num_classes=2, **options)
        assert token_kinds(model) == expected, name
    model = ViT(preset="micro", image_size=(4, 8), patch_size=4, in_channels=1, num_classes=2, distilled=True,
                num_registers=2)  # fmt: skip
    names = ["class token", "distillation token", "register 0", "register 1", "patch (0, 0)", "patch (0, 1)"]
    assert model.token_names() == names  # every position, as the model orders them


def test_chunks_change_no_figure_and_the_high_norm_rows_are_per_image_means():
    """The same images in one batch and in chunks of 5 (the ablations' chunks of 1) give the same
    per-image tensors, so each is joined along its image axis; with a low norm ratio many tokens
    are flagged, some images none, and each high-norm figure is the interval over images of a value
    computed here image by image (2 registers: a kind of several tokens), from the next block's
    attention (3 blocks: not the one before)."""
    torch.manual_seed(0)
    options = dict(depth=3, image_size=16, patch_size=4, in_channels=1, num_classes=3, num_registers=2)
    model = ViT(preset="micro", pool="mean", **options)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
        model.reg_token.mul_(4)  # registers above the patches' median norm, by an image's amount
    model.eval()
    images, labels = torch.rand(12, 1, 16, 16), torch.arange(12) % 3
    whole = analyse(model, images, labels, batch_size=64, norm_ratio=1.2)
    chunked = analyse(model, images, labels, batch_size=5, norm_ratio=1.2)
    assert set(whole["per_image"]) == set(chunked["per_image"]) >= {"lens", "patch_lens", "ratios"}
    for key, value in whole["per_image"].items():
        torch.testing.assert_close(chunked["per_image"][key], value, atol=1e-5, rtol=1e-5, msg=key)

    # a threshold that half the images reach after block 0, their registers among the tokens flagged
    ratios, attention, cls_attention = (
        whole["per_image"][k] for k in ("ratios", "attention", "cls_attention")
    )
    threshold = ratios[0].amax(-1).median().item()  # half the images flag no token after block 0
    assert threshold > 1 and 0 < (ratios[0].amax(-1) > threshold).sum() < 12
    assert 0 < (ratios[0, :, 1:3] > threshold).any(-1).sum() < 12  # the registers: in some images
    results = analyse(model, images, labels, batch_size=64, norm_ratio=threshold)
    prefix = model.num_prefix_tokens
    for layer, row in enumerate(results["norms"]["layers"]):
        flagged = ratios[layer] > threshold  # (images, tokens)
        expected = {
            "max_patch_ratio": [ratios[layer, n, prefix:].max() for n in range(12)],
            "patches_flagged": [flagged[n, prefix:].float().mean() for n in range(12)],
            "registers_ratio": [ratios[layer, n, 1:prefix].mean() for n in range(12)],
            "registers_flagged": [flagged[n, 1:prefix].float().mean() for n in range(12)],
        }
        if layer < 2:  # the next block's attention, in the images that flag any token
            with_some = [n for n in range(12) if flagged[n].any()]
            expected["attention_to_flagged"] = [
                (attention[layer + 1, n] * flagged[n]).sum() for n in with_some
            ]
            expected["cls_attention_to_flagged"] = [
                (cls_attention[layer + 1, n] * flagged[n]).sum() for n in with_some
            ]
            expected["token_share_flagged"] = [flagged[n].float().mean() for n in with_some]
        else:
            assert "attention_to_flagged" not in row
        for name, values in expected.items():
            wanted = interval(torch.stack(values))
            assert row[name] == pytest.approx(wanted, abs=1e-5), (layer, name)


def test_the_patch_lens_accuracy_counts_the_patches_read_as_the_label():
    from vit.interpret.head_analysis import patch_lens_logits

    torch.manual_seed(0)
    model = perturbed_model(pool="mean")
    images, labels = torch.rand(10, 1, 16, 16), torch.arange(10) % 3
    results = analyse(model, images, labels, batch_size=64)
    read = patch_lens_logits(model, record(model, images).residual).argmax(-1)  # (L, B, patches)
    expected = (read == labels[None, :, None]).float().mean(1)
    torch.testing.assert_close(torch.tensor(results["logit_lens"]["patches"]), expected)


def test_the_attribution_splits_the_reading_asked_for_and_the_seed_reaches_every_interval():
    model = perturbed_model()
    images = torch.rand(20, 1, 16, 16)
    raw = analyse(model, images, batch_size=64, attribute="logit")
    logits = model(images)
    expected = logits.max(-1).values.mean().item()  # the predicted class's raw logit
    assert raw["attribution"]["total"]["mean"] == pytest.approx(expected, abs=1e-4)
    default, reseeded = analyse(model, images, batch_size=64), analyse(model, images, batch_size=64, seed=1)
    zero = analyse(model, images, batch_size=64, seed=0)
    assert default["attribution"] == zero["attribution"] and default["ablation"] == zero["ablation"]
    figures = {
        "total": lambda r: r["attribution"]["total"],
        "ablation": lambda r: r["ablation"]["mean"]["log_probability"][0][0],
        "head": lambda r: r["attribution"]["heads"][0][0],
    }
    for name, figure in figures.items():
        a, b = figure(default), figure(reseeded)
        assert a["mean"] == b["mean"] and (a["low"], a["high"]) != (b["low"], b["high"]), name


@pytest.mark.parametrize("num_classes, norm_ratio, message", [
    (0, 4.0, "the model has no head (num_classes 0): it predicts no class"),
    (3, 1.0, "norm_ratio=1.0 must be above 1: the median token's ratio is 1"),
])  # fmt: skip
def test_a_headless_model_or_a_norm_ratio_of_1_is_refused(num_classes, norm_ratio, message):
    model = ViT(preset="micro", image_size=16, patch_size=4, in_channels=1, num_classes=num_classes).eval()
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        analyse(model, torch.rand(2, 1, 16, 16), norm_ratio=norm_ratio)


def test_one_class_and_a_norm_ratio_just_above_1_are_analysed():
    one = ViT(preset="micro", image_size=16, patch_size=4, in_channels=1, num_classes=1).eval()
    results = analyse(one, torch.rand(3, 1, 16, 16), norm_ratio=1.5)
    assert results["accuracy"]["mean"] == 1.0 and results["norms"]["norm_ratio"] == 1.5


def test_the_seed_reaches_the_correlations_interval_over_images():
    from vit.interpret.head_analysis import looking_against_using

    g = torch.Generator().manual_seed(0)
    per_image = {  # 5 layers x 6 heads, 40 images: a correlation of 30 heads varies finely
        "ablation/mean/log_probability": -torch.rand(5, 6, 40, generator=g),
        "ablation/zero/log_probability": -torch.rand(5, 6, 40, generator=g),
        "looks/query": torch.rand(5, 6, 40, generator=g),
    }
    inked = torch.rand(40, 16, generator=g) > 0.7
    first, again = looking_against_using(inked, per_image, 0), looking_against_using(inked, per_image, 1)
    a, b = first["spearman"]["query"]["mean"], again["spearman"]["query"]["mean"]
    assert a["rho"] == b["rho"] and a["images"] != b["images"]
    assert (a["low"], a["high"]) != (b["low"], b["high"])
