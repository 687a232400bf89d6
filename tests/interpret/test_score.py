"""The faithfulness maths of `vit.interpret.score` against answers computed another way: hand-counted
evidence figures, the gradient written out, attention read straight from the weights, curves
rebuilt patch by patch, and the protocol's seeds and defaults."""

from __future__ import annotations

import re

import pytest
import torch

from vit import ViT
from vit.interpret.evidence import evidence_scores, layers_heads_scores, perturbed
from vit.interpret.maps import attention_rollout, attention_weights, input_gradient, pooled_maps
from vit.interpret.score import (
    METHODS,
    default_methods,
    evidence_mass,
    randomisation_steps,
    removal_counts,
    removal_order,
    score,
    scored_maps,
)


def model_of(**options) -> ViT:
    """A micro ViT of 3 blocks on 8x12 colour images (a 2x3 grid: rows and columns differ), its
    weights moved away from their initial values."""
    torch.manual_seed(0)
    config = dict(preset="micro", depth=3, image_size=(8, 12), patch_size=4, in_channels=3, num_classes=3)
    model = ViT(**{**config, **options}).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return model


def test_evidence_figures_by_hand_for_two_images():
    maps = torch.tensor([[0.9, 0.1, 0.5, 0.3, 0.2], [0.05, 0.02, 0.01, 0.04, 0.03]])
    evidence = torch.tensor([[0, 1, 0, 0, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    found = evidence_scores(maps, evidence)
    # image 0: mass (0.1 + 0.2) / 2.0; its top 2 (0.9, 0.5) hold no evidence; its maximum is not evidence
    # image 1: mass 0.05 / 0.15 (a map summing under 1); its top 1 and its maximum are the evidence
    torch.testing.assert_close(found["relevance_mass"], torch.tensor([0.15, 1 / 3]))
    torch.testing.assert_close(found["rank_accuracy"], torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(found["pointing_game"], torch.tensor([0.0, 1.0]))


def test_input_gradient_is_the_gradient_times_the_input_summed_over_channels_and_each_patch():
    model = model_of()
    images, targets = torch.rand(2, 3, 8, 12), torch.tensor([0, 2])
    pixels = images.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(pixels).gather(1, targets[:, None]).sum(), pixels)
    per_pixel = (grad * images).sum(1)  # (B, 8, 12)
    expected = per_pixel.view(2, 2, 4, 3, 4).sum((2, 4)).flatten(1)  # each 4x4 patch's sum, row by row
    torch.testing.assert_close(input_gradient(model, images, targets, model.grid_size), expected)


def test_the_class_token_map_is_the_last_blocks_and_rollout_reads_every_block():
    model = model_of(num_registers=2)
    images, targets = torch.rand(2, 3, 8, 12), torch.tensor([0, 1])
    weights = attention_weights(model, images)  # (L, B, H, T, T)
    prefix = model.num_prefix_tokens
    torch.testing.assert_close(
        scored_maps(model, images, "cls", targets), weights[-1][:, :, 0, prefix:].mean(1)
    )
    rollout = attention_rollout(weights, num_prefix_tokens=prefix)
    expected = pooled_maps(model, rollout).flatten(1)
    torch.testing.assert_close(scored_maps(model, images, "rollout", targets), expected)


def test_a_method_the_model_cannot_give_is_one_exact_line():
    mean_pooled = model_of(pool="mean", class_token=False)
    x, t = torch.rand(1, 3, 8, 12), torch.tensor([0])
    others = re.escape("query, rollout, grad-rollout, input-gradient")
    with pytest.raises(
        ValueError, match=f"^this model has no class token: use another method \\({others}\\)$"
    ):
        scored_maps(mean_pooled, x, "cls", t)
    with pytest.raises(ValueError, match="^unknown method 'nope'; choose one of cls, query, rollout, "):
        scored_maps(mean_pooled, x, "nope", t)
    choices = re.escape(", ".join(METHODS))
    with pytest.raises(ValueError, match=f"^unknown method 'a'; choose from {choices}$"):
        score(mean_pooled, x, methods=["a", "b"])
    with pytest.raises(ValueError, match="^the method evidence needs data that knows its evidence$"):
        score(mean_pooled, x, methods=["evidence"])
    with pytest.raises(ValueError, match="^this model has no class token: leave out the method cls$"):
        score(mean_pooled, x, methods=["cls"])
    assert "cls" not in default_methods(mean_pooled, True) and "evidence" in default_methods(
        mean_pooled, True
    )
    assert "cls" in default_methods(model_of(), False) and "evidence" not in default_methods(
        model_of(), False
    )
    assert list(score(mean_pooled, x, methods=["rollout"], sanity=False)["methods"]) == ["rollout"]


def test_a_colour_fill_sets_each_channel_of_the_removed_patches():
    images = torch.zeros(1, 3, 8, 12)
    removed = torch.tensor([[True, False, False, False, False, True]])  # the 2x3 grid's corners
    out = perturbed(images, removed, torch.tensor([0.1, 0.5, 0.9]), (2, 3))
    for channel, value in enumerate((0.1, 0.5, 0.9)):
        assert (out[0, channel, :4, :4] == value).all() and (out[0, channel, 4:, 8:] == value).all()
        assert (out[0, channel, :4, 4:] == 0).all() and (out[0, channel, 4:, :8] == 0).all()


def test_the_cascade_names_its_steps_and_keeps_each_copy_as_it_was_yielded():
    model = model_of()
    steps = list(randomisation_steps(model))
    names = [name for name, _ in steps]
    assert names == ["head", "head + block 2", "head + blocks 1-2", "head + blocks 0-2"]
    original = [block.attn.qkv.weight for block in model.blocks]
    for n, (_, copy) in enumerate(steps):  # step n has re-drawn the last n blocks, and only those
        for i, block in enumerate(copy.blocks):
            assert torch.equal(block.attn.qkv.weight, original[i]) == (i < 3 - n), (n, i)
    assert torch.equal(steps[0][1].head.weight, next(randomisation_steps(model, 0))[1].head.weight)
    assert not torch.equal(steps[0][1].head.weight, next(randomisation_steps(model, 1))[1].head.weight)


def test_removal_counts_and_a_seeded_order_that_breaks_ties_per_image():
    assert removal_counts(16) == list(range(17))
    assert removal_counts(17) == [0, 2, 3, 5, 7, 8, 10, 12, 14, 15, 17]  # tenths, rounded
    maps = torch.zeros(20, 6)
    maps[:, 4] = 1.0  # one patch first, the other five tied
    orders = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        orders.append(removal_order(maps, torch.Generator().manual_seed(3)))
    assert torch.equal(orders[0], orders[1]) and (orders[0][:, 0] == 4).all()
    assert len({tuple(row.tolist()) for row in orders[0]}) > 5  # the ties fall differently per image


def test_the_heads_evidence_maps_read_the_attention_rows_straight():
    """Per layer, head and image: the evidence patches' rows over the other patches (their own
    column left out, the prefix tokens' columns too), averaged over them, and the class token's
    row, each scored against the evidence."""
    model = model_of()
    images = torch.rand(2, 3, 8, 12)
    evidence = torch.tensor([[1, 0, 0, 1, 1, 0], [0, 1, 0, 0, 0, 0]], dtype=torch.bool)
    found = layers_heads_scores(model, images, evidence)
    weights = attention_weights(model, images)  # (L, B, H, T, T)
    for layer in range(3):
        for b in range(2):
            for h in range(model.config.heads):
                rows = [weights[layer, b, h, 1 + q, 1:].clone() for q in range(6) if evidence[b, q]]
                for q, row in zip([q for q in range(6) if evidence[b, q]], rows, strict=True):
                    row[q] = 0.0
                query = torch.stack(rows).mean(0)
                cls = weights[layer, b, h, 0, 1:]
                for name, m in (("query", query), ("cls", cls)):
                    mass = (m * evidence[b]).sum() / m.sum()
                    alone = evidence_scores(m, evidence[b])  # this one map, scored by itself
                    for figure in ("rank_accuracy", "pointing_game"):
                        got = found[f"{name}/{figure}"][layer, h, b].item()
                        assert got == pytest.approx(alone[figure].item(), abs=1e-6), (name, figure)
                    assert found[f"{name}/relevance_mass"][layer, h, b].item() == pytest.approx(
                        mass.item(), abs=1e-5
                    )


def test_the_callbacks_evidence_mass_reads_the_predicted_class():
    model = model_of()
    images = torch.rand(4, 3, 8, 12)
    evidence = torch.rand(4, 6) > 0.5
    evidence[:, 0] = True
    predicted = model(images).argmax(-1)
    expected = evidence_scores(input_gradient(model, images, predicted, model.grid_size), evidence)
    found = evidence_mass(model, images, evidence, ["input-gradient"])["input-gradient"]
    assert found.item() == pytest.approx(expected["relevance_mass"].nanmean().item(), abs=1e-6)


def test_the_curves_start_at_the_intact_prediction_and_remove_patches_by_the_map():
    """The random method's maps are the first draw of the seeded generator, so its curves can be
    rebuilt here: deletion removes the most relevant patch first, insertion the least; every curve
    starts at the intact image's predicted class (its accuracy against the labels) and ends at the
    image filled with the data's mean colour, channel by channel."""
    model = model_of()
    images, labels = torch.rand(6, 3, 8, 12), torch.tensor([0, 1, 2, 0, 1, 2])
    calls = []
    results = score(
        model, images, labels, methods=["random"], sanity=False, progress=lambda c: calls.append(1) or c
    )
    assert calls == [1]
    maps = torch.rand(6, 6, generator=torch.Generator().manual_seed(0))
    logits = model(images)
    predicted = logits.argmax(-1)
    fill = images.mean(dim=(0, 2, 3))

    def probability(removed):
        return (
            model(perturbed(images, removed, fill, (2, 3)))
            .softmax(-1)[torch.arange(6), predicted]
            .mean()
            .item()
        )

    curves = results["curves"]["random"]
    assert curves["deletion/probability"][0] == pytest.approx(
        logits.softmax(-1).max(-1).values.mean().item(), abs=1e-5
    )
    assert curves["deletion/accuracy"][0] == pytest.approx((predicted == labels).float().mean().item())
    first = torch.nn.functional.one_hot(maps.argmax(-1), 6).bool()
    last = torch.nn.functional.one_hot(maps.argmin(-1), 6).bool()
    assert curves["deletion/probability"][1] == pytest.approx(probability(first), abs=1e-5)
    assert curves["insertion/probability"][1] == pytest.approx(probability(last), abs=1e-5)
    assert curves["deletion/probability"][-1] == pytest.approx(
        probability(torch.ones(6, 6, dtype=torch.bool)), abs=1e-5
    )


def test_score_defaults_to_seed_0_and_the_sanity_checks_and_ignores_the_global_random_state():
    model = model_of()
    images = torch.rand(4, 3, 8, 12)
    evidence = torch.zeros(4, 8, 12, dtype=torch.bool)
    evidence[:, :4, :4] = True  # the first patch
    evidence[:2, 4:, 8:] = True  # and the last, in two images
    runs = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        runs.append(score(model, images, evidence=evidence, methods=["random", "evidence", "rollout"]))
    assert runs[0]["curves"] == runs[1]["curves"] and runs[0]["figures"] == runs[1]["figures"]
    assert "randomisation" in runs[0] and "target_sensitivity" in runs[0]
    seeded = score(
        model, images, evidence=evidence, methods=["random", "evidence", "rollout"], seed=0, sanity=True
    )
    assert seeded["curves"] == runs[0]["curves"] and seeded["randomisation"] == runs[0]["randomisation"]
    other = score(model, images, evidence=evidence, methods=["random", "evidence", "rollout"], seed=1)
    assert other["curves"]["random"] != runs[0]["curves"]["random"]
    assert other["randomisation"]["rollout"] != runs[0]["randomisation"]["rollout"]


def test_the_seed_draws_every_interval_too():
    """`seed` reaches the bootstrap of every interval: a figure that does not depend on the seed
    keeps its mean and gets another interval (16 images: the quantiles of other resamples differ)."""
    model = model_of()
    images = torch.rand(16, 3, 8, 12, generator=torch.Generator().manual_seed(0))
    evidence = torch.zeros(16, 8, 12, dtype=torch.bool)
    evidence[:, :4, :8] = True
    runs = [score(model, images, evidence=evidence, methods=["rollout", "input-gradient"], seed=seed)
            for seed in (0, 3)]  # fmt: skip
    figures = [
        (run["figures"]["rollout"]["relevance_mass"], run["target_sensitivity"]["input-gradient"],
         run["layers_heads"]["query/relevance_mass"][1][0])
        for run in runs
    ]  # fmt: skip
    for before, after in zip(*figures, strict=True):
        assert before["mean"] == pytest.approx(after["mean"], abs=1e-12)
        assert (before["low"], before["high"]) != (after["low"], after["high"])


def test_maps_in_chunks_read_each_chunks_own_targets():
    model = model_of()
    images, targets = torch.rand(5, 3, 8, 12), torch.tensor([0, 1, 2, 0, 1])
    for method in ("input-gradient", "grad-rollout"):
        whole = scored_maps(model, images, method, targets)
        chunked = scored_maps(model, images, method, targets, batch_size=2)
        torch.testing.assert_close(chunked, whole, atol=1e-4, rtol=1e-5, msg=method)  # batches round apart
