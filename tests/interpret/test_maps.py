"""Attention extraction, maps, rollout, gradient rollout and the Figure-7 statistics."""

import itertools
import math
import re

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from tests.helpers import explicit_attention_weights
from vit.interpret.maps import (
    attention_rollout,
    attention_share,
    attention_weights,
    check_head_fusion,
    cls_attention_maps,
    discard_lowest,
    embedding_filter_components,
    embedding_filters,
    gradient_rollout,
    iter_attention,
    mean_attention_distance,
    patch_token,
    pooled_maps,
    pos_embed_similarity,
    query_attention_maps,
    register_share,
    select_heads,
    select_layers,
)
from vit.model import ViT
from vit.two_circles import circle_patch_masks


def tiny_vit(image_size=(16, 24), channels=1, **kwargs):
    torch.manual_seed(0)
    model = ViT(
        preset="micro", num_classes=4, image_size=image_size, patch_size=4, in_channels=channels, **kwargs
    )
    return model.eval()


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_pooled_maps_read_the_rows_the_head_reads(pool):
    """A mean-pooling head never reads the class token: its map is the mean of the patch rows."""
    model = tiny_vit(image_size=(8, 12), pool=pool)  # 2x3 patches, 7 tokens
    relevance = torch.rand(2, 7, 7)
    maps = pooled_maps(model, relevance)
    assert maps.shape == (2, 2, 3)
    rows = relevance[:, 0] if pool == "cls" else relevance[:, 1:].mean(dim=1)
    torch.testing.assert_close(maps, rows[:, 1:].reshape(2, 2, 3))


def test_extraction_matches_the_explicit_path_in_chunks_and_leaves_the_model_fused():
    model = tiny_vit()
    images = torch.randn(5, 1, 16, 24)
    _, reference = explicit_attention_weights(model, images)
    reference = torch.stack(reference)  # (layers, batch, heads, T, T)
    weights = attention_weights(model, images, batch_size=2)  # chunks of 2, 2 and 1
    assert weights.shape == (2, 5, 2, 25, 25)
    torch.testing.assert_close(weights, reference)
    chosen = attention_weights(model, images, layers=-1, heads=[1], batch_size=3)
    torch.testing.assert_close(chosen, reference[-1:, :, 1:2])
    # no hook is left behind and the fused path is still what a plain call runs
    for block in model.blocks:
        assert block.attn.fused and not block.attn._forward_hooks and not block.attn.attend._forward_hooks
    with pytest.raises(ValueError, match="layer=2 is out of range"):
        attention_weights(model, images, layers=2)
    with pytest.raises(ValueError, match="head=-3 is out of range"):
        attention_weights(model, images, heads=-3)


def test_maps_have_the_patch_grid_shape_for_non_square_images():
    model = tiny_vit(image_size=(16, 24))  # a 4x6 grid of patches
    images = torch.randn(3, 1, 16, 24)
    weights = attention_weights(model, images)
    assert cls_attention_maps(model, weights).shape == (2, 3, 2, 4, 6)
    query = query_attention_maps(model, weights, (2, 5))
    assert query.shape == (2, 3, 2, 4, 6)
    # the patch at row 2, column 5 is token 1 + 2 * 6 + 5: its attention to itself sits at [2, 5]
    torch.testing.assert_close(query[..., 2, 5], weights[..., 18, 18])
    torch.testing.assert_close(cls_attention_maps(model, weights)[..., 3, 0], weights[..., 0, 19])
    assert cls_attention_maps(model, attention_rollout(weights)).shape == (3, 4, 6)
    assert cls_attention_maps(model, gradient_rollout(model, images)).shape == (3, 4, 6)
    with pytest.raises(ValueError, match=r"patch \(4, 0\) is outside the 4x6 patch grid"):
        query_attention_maps(model, weights, (4, 0))


def test_rollout_equals_the_hand_computed_product():
    # two layers, two heads, two tokens; (weights + identity) / row sums, then A2 @ A1
    layer1 = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]])
    layer2 = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]]])
    weights = torch.stack((layer1, layer2))[:, None]  # (layers, batch=1, heads, T, T)
    # mean: A1 = [[.75, .25], [.25, .75]], A2 = [[1, 0], [.25, .75]]
    expected = torch.tensor([[0.75, 0.25], [0.375, 0.625]])
    torch.testing.assert_close(attention_rollout(weights)[0], expected)
    # max: A1 = [[2, 1], [1, 2]] / 3, A2 = [[1, 0], [1/3, 2/3]]
    expected_max = torch.tensor([[2 / 3, 1 / 3], [4 / 9, 5 / 9]])
    torch.testing.assert_close(attention_rollout(weights, head_fusion="max")[0], expected_max)
    # min: the fused layers are 0 and [[1, 0], [0, 0]]; plus I and row-normalized both are I
    expected_min = torch.eye(2)
    torch.testing.assert_close(attention_rollout(weights, head_fusion="min")[0], expected_min)


@pytest.mark.parametrize("head_fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("discard_ratio", [0.0, 0.5, 0.9])
def test_rollout_rows_sum_to_one(head_fusion, discard_ratio):
    torch.manual_seed(0)
    weights = torch.randn(4, 3, 2, 10, 10).softmax(-1)
    rollout = attention_rollout(weights, head_fusion=head_fusion, discard_ratio=discard_ratio)
    assert rollout.shape == (3, 10, 10) and (rollout >= 0).all()
    torch.testing.assert_close(rollout.sum(-1), torch.ones(3, 10))


def test_discard_drops_the_lowest_weights_but_never_the_class_token_entries():
    torch.manual_seed(0)
    fused = torch.rand(2, 9, 9) + 0.1
    fused[..., 0] = 0.01  # the class-token column is the lowest of every row: first to go if unguarded
    kept = discard_lowest(fused, ratio=0.5)
    torch.testing.assert_close(kept[..., 0], fused[..., 0])  # includes the class token's own entry
    dropped = kept[..., 1:] == 0
    assert (dropped.sum(-1) == 4).all()  # int(8 patches * 0.5) per row
    # what was dropped is no larger than anything that was kept
    patches = fused[..., 1:]
    largest_dropped = patches.masked_fill(~dropped, -1).amax(-1)
    smallest_kept = patches.masked_fill(dropped, 2).amin(-1)
    assert (largest_dropped < smallest_kept).all()
    torch.testing.assert_close(kept[..., 1:][~dropped], patches[~dropped])
    with pytest.raises(ValueError, match="discard_ratio"):
        discard_lowest(fused, ratio=1.0)


def reference_gradient_rollout(model, images, target):
    """Chefer et al. written out with the model's own explicit path and retain_grad."""
    with torch.enable_grad():
        tokens, attention = explicit_attention_weights(model, images)
        for a in attention:
            a.retain_grad()
        model.forward_head(tokens)[:, target].sum().backward()
    model.zero_grad()
    relevance = torch.eye(attention[0].shape[-1]).expand(len(images), -1, -1)
    for a in attention:
        cam = (a.grad * a).clamp(min=0).mean(1)
        relevance = relevance + cam @ relevance
    return relevance.detach()


@pytest.mark.slow
def test_gradient_rollout_follows_chefer_and_differs_between_classes(trained):
    classifier, datamodule = trained
    model = classifier.model
    images = datamodule.splits["test"].images[:16]
    by_class = [gradient_rollout(model, images, targets=c, batch_size=5) for c in range(2)]
    for c, relevance in enumerate(by_class):
        torch.testing.assert_close(
            relevance, reference_gradient_rollout(model, images, c), atol=1e-5, rtol=1e-4
        )
        assert (relevance - torch.eye(relevance.shape[-1]) >= -1e-6).all()  # only positive parts added
    maps = [cls_attention_maps(model, r) for r in by_class]
    differences = (maps[0] - maps[1]).abs().amax(dim=(-2, -1))  # per image
    assert (differences > 1e-4 * maps[0].abs().amax(dim=(-2, -1))).all()
    # None explains the predicted class: equal to asking for it by number
    predicted = model(images).argmax(-1)
    torch.testing.assert_close(gradient_rollout(model, images), gradient_rollout(model, images, predicted))


def test_mean_attention_distance_is_zero_for_identity_and_known_for_uniform():
    model = tiny_vit(image_size=(8, 8))  # a 2x2 grid of 4-pixel patches
    tokens = 5
    identity = torch.eye(tokens).expand(2, 3, 2, tokens, tokens)  # (layers, batch, heads, T, T)
    torch.testing.assert_close(mean_attention_distance(model, identity), torch.zeros(2, 2))
    uniform = torch.full((2, 3, 2, tokens, tokens), 1 / tokens)
    # by hand: each patch is 0 from itself, 4 from two neighbours and 4 sqrt(2) from the diagonal
    expected = (0 + 4 + 4 + 4 * math.sqrt(2)) / 4
    torch.testing.assert_close(mean_attention_distance(model, uniform), torch.full((2, 2), expected))


def test_mean_attention_distance_of_uniform_attention_on_a_non_square_grid():
    model = tiny_vit(image_size=(12, 20))  # 3x5 patches of 4 pixels
    cells = list(itertools.product(range(3), range(5)))
    brute_force = sum(4 * math.dist(a, b) for a in cells for b in cells) / len(cells) ** 2
    tokens = 1 + len(cells)
    uniform = torch.full((1, 1, 2, tokens, tokens), 1 / tokens)
    torch.testing.assert_close(mean_attention_distance(model, uniform), torch.full((1, 2), brute_force))
    # attending only to the patch to the right (or left on the last column) is 4 pixels away
    neighbour = torch.zeros(tokens, tokens)
    for i, (r, c) in enumerate(cells):
        neighbour[1 + i, 1 + r * 5 + (c + 1 if c < 4 else c - 1)] = 1.0
    neighbour[0, 0] = 1.0
    torch.testing.assert_close(
        mean_attention_distance(model, neighbour[None, None, None]), torch.tensor([[4.0]])
    )


def test_position_embedding_similarity():
    model = tiny_vit(image_size=(16, 24), pos_embed="sincos")
    similarity = pos_embed_similarity(model)
    assert similarity.shape == (4, 6, 4, 6)
    flat = similarity.reshape(24, 24)
    torch.testing.assert_close(flat.diagonal(), torch.ones(24))
    torch.testing.assert_close(flat, flat.T)
    # sin-cos embeddings: the next patch is more alike than the far corner
    assert similarity[0, 0, 0, 1] > similarity[0, 0, 3, 5]
    with pytest.raises(ValueError, match="no position embeddings"):
        pos_embed_similarity(tiny_vit(pos_embed="none"))


def test_embedding_filter_components_follow_the_patch_layout():
    model = tiny_vit(image_size=(8, 8), channels=3)
    linear = model.patch_proj  # input laid out (p1 p2 c), p = 4, c = 3
    with torch.no_grad():
        linear.weight.zero_()
        pixel = (1 * 4 + 2) * 3 + 0  # row 1, column 2, channel 0
        linear.weight[:, pixel] = torch.randn(linear.weight.shape[0]) * 5
        linear.weight.add_(torch.randn_like(linear.weight) * 0.01)
    components, explained = embedding_filter_components(model, k=5)
    assert components.shape == (5, 3, 4, 4)
    first = components[0].abs()
    assert torch.nonzero(first == first.max()).tolist() == [[0, 1, 2]]  # channel 0, row 1, column 2
    assert explained[0] > 0.9 and (explained[:-1] >= explained[1:]).all() and explained.sum() <= 1 + 1e-6
    flat = components.flatten(1)
    torch.testing.assert_close(flat @ flat.T, torch.eye(5), atol=1e-5, rtol=0)


def test_embedding_filters_of_shifted_patches_cover_the_window_they_read():
    """A weight on a shifted copy reads the pixel the shift brought into the patch: with patch 4
    and shift 2, copy (dy, dx) = (2, -2) at patch row 1, column 2 reads the image at row -1,
    column 4 from the patch's corner, so the filters are 8x8 windows starting 2 pixels out."""
    model = tiny_vit(image_size=(8, 8), channels=3, shifted_patches=True)
    linear = model.patch_proj  # input laid out (p1 p2 copies c), p = 4, 5 copies, c = 3
    copies = model.patch_embed.shift.offsets
    copy = copies.index((2, -2))
    with torch.no_grad():
        linear.weight.zero_()
        pixel = ((1 * 4 + 2) * 5 + copy) * 3 + 2  # row 1, column 2, that copy, channel 2
        linear.weight[:, pixel] = torch.randn(linear.weight.shape[0]) * 5
        linear.weight.add_(torch.randn_like(linear.weight) * 0.01)
    components, explained = embedding_filter_components(model, k=5)
    assert components.shape == (5, 3, 8, 8)
    first = components[0].abs()
    assert torch.nonzero(first == first.max()).tolist() == [[2, 2 + 1 - 2, 2 + 2 + 2]]
    assert explained[0] > 0.9


def test_a_conv_stem_has_no_embedding_filters_to_show():
    model = tiny_vit(image_size=(8, 8), channels=3, conv_stem=(4,))
    with pytest.raises(ValueError, match="a model with a conv_stem has no patch filters over pixels"):
        embedding_filters(model)


@pytest.mark.parametrize("shifted", [False, True])
def test_embedding_filters_are_what_the_tokens_compute(shifted):
    """Without patch norm a patch token is its filters applied to the window of pixels it reads
    (zeros beyond the image), plus the bias."""
    model = tiny_vit(image_size=(12, 8), channels=3, shifted_patches=shifted)
    filters = embedding_filters(model)  # (dim, c, window, window)
    m = (filters.shape[-1] - 4) // 2
    assert m == (2 if shifted else 0)
    image = torch.randn(1, 3, 12, 8)
    tokens = model.patch_embed(image)[0]  # (3 * 2 patches, dim)
    padded = F.pad(image, (m, m, m, m))[0]
    for index, (row, col) in enumerate(itertools.product(range(3), range(2))):
        window = padded[:, 4 * row : 4 * row + 4 + 2 * m, 4 * col : 4 * col + 4 + 2 * m]
        expected = (filters * window).sum(dim=(1, 2, 3)) + model.patch_proj.bias
        torch.testing.assert_close(tokens[index], expected, atol=1e-5, rtol=1e-5)


def test_attention_share_against_hand_made_weights():
    # 1 layer, 1 image, 1 head, class token + 4 patches; patch 0 (token 1) looks only at patch 3
    weights = torch.zeros(1, 1, 1, 5, 5)
    weights[..., :, 0] = 1.0
    weights[0, 0, 0, 1] = torch.tensor([0.0, 0.2, 0.0, 0.0, 0.8])
    queries = torch.tensor([[True, False, False, False]])
    keys = torch.tensor([[False, False, False, True]])
    share, chance = attention_share(weights, queries, keys)
    assert share.shape == (1, 1) and share.item() == pytest.approx(0.8)
    assert chance.item() == pytest.approx(1 / 5)


def test_circle_patch_masks_follow_the_circles_round_the_edge():
    centres = torch.tensor([[[4.0, 4.0], [31.5, 16.0]]])  # the second straddles the right edge
    masks = circle_patch_masks(centres, image_size=32, radius=2.5, patch_size=8).reshape(1, 2, 4, 4)
    assert masks[0, 0].nonzero().tolist() == [[0, 0]]
    assert sorted(masks[0, 1].nonzero().tolist()) == [[1, 0], [1, 3], [2, 0], [2, 3]]


@pytest.mark.parametrize(
    "options",
    [
        dict(num_registers=3, no_embed_class=True, layer_scale=0.1),
        dict(distilled=True, pre_norm=True),
        dict(class_token=False, pool="mean", fc_norm=True, num_registers=2),
    ],
)
def test_every_method_works_with_several_prefix_tokens(options):
    """Maps cover the patches only (registers and other prefix tokens are never drawn as patches),
    for a non-square grid, whatever the prefix tokens."""
    from vit.interpret.maps import MapSpec, explain
    from vit.model import ViT

    torch.manual_seed(0)
    model = ViT(num_classes=3, image_size=(16, 24), patch_size=4, dim=32, depth=2, heads=2, **options).eval()
    images = torch.rand(2, 3, 16, 24)
    methods = ["query", "rollout", "grad-rollout", "input-gradient"]
    for method in methods + (["cls"] if model.cls_token is not None else []):
        found = explain(model, images, MapSpec(method, query_patch=(1, 2) if method == "query" else None))
        assert found.maps.shape == (2, 4, 6) and torch.isfinite(found.maps).all(), method
        assert found.logits.shape == (2, 3)
        if model.num_registers and method in ("cls", "query"):  # reported, not drawn
            assert f"of its attention in layer 1 to the {model.num_registers} register tokens" in found.note
    if model.cls_token is None:
        with pytest.raises(ValueError, match="no class token"):
            explain(model, images, MapSpec("cls"))


def test_a_distilled_model_pools_the_rows_of_both_tokens_its_heads_read():
    """DeiT averages the logits of a head on the class token and one on the distillation token:
    rollout and gradient rollout show the mean of those two rows."""
    from vit import ViT
    from vit.interpret.maps import pooled_maps, to_patch_grid

    model = ViT(preset="micro", image_size=16, patch_size=4, num_classes=3, distilled=True)
    relevance = torch.rand(2, model.num_prefix_tokens + 16, model.num_prefix_tokens + 16)
    expected = to_patch_grid(model, (relevance[:, 0] + relevance[:, 1]) / 2)
    torch.testing.assert_close(pooled_maps(model, relevance), expected)


def test_a_map_spec_is_checked_once_when_made_and_against_a_model():
    """Every option of a map is checked where the spec is made (no model needed), and what needs a
    model by `check`; a spec is frozen, so a checked spec stays checked."""
    import dataclasses

    from vit.interpret.maps import MAP_METHODS, MapSpec
    from vit.model import ViT

    bad = {
        "unknown method 'gradcam'; choose one of " + ", ".join(MAP_METHODS): dict(method="gradcam"),
        "--method query needs --query_patch": dict(method="query"),
        "--method query needs --query_patch ROW,COLUMN, and only it takes one": dict(query_patch=(1, 1)),
        "--head does not apply to --method rollout": dict(method="rollout", head=0),
        "--layer does not apply to --method grad-rollout": dict(method="grad-rollout", layer=0),
        "--layer does not apply to --method input-gradient": dict(method="input-gradient", layer=0),
        "unknown head_fusion 'median'": dict(method="rollout", head_fusion="median"),
        "discard_ratio=1.0 must lie in [0, 1)": dict(method="rollout", discard_ratio=1.0),
    }
    for message, options in bad.items():
        with pytest.raises(ValueError, match="^" + re.escape(message)):
            MapSpec(**options)
    spec = MapSpec("query", query_patch=[1, 2])
    assert spec.query_patch == (1, 2)  # a list from a config becomes a tuple: hashable, comparable
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.layer = 5
    model = ViT(num_classes=3, image_size=16, patch_size=4, dim=16, depth=2, heads=2).eval()
    assert MapSpec("query", layer=-1, head=1, query_patch=(3, 3), target=2).check(model).layer == -1
    against_model = {
        "layer=2 is out of range for a model with 2 layers": MapSpec(layer=2),
        "head=-3 is out of range for a model with 2 heads": MapSpec(head=-3),
        "patch (4, 0) is outside the 4x4 patch grid": MapSpec("query", query_patch=(4, 0)),
        "target=3 is not a class of this model (0 to 2)": MapSpec("grad-rollout", target=3),
    }
    for message, spec in against_model.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            spec.check(model)
    pooled = ViT(
        num_classes=3, image_size=16, patch_size=4, dim=16, depth=2, heads=2, class_token=False, pool="mean"
    )
    with pytest.raises(ValueError, match="no class token: use another method"):
        MapSpec("cls").check(pooled)


@pytest.mark.parametrize("method", ["cls", "query", "rollout", "grad-rollout", "input-gradient"])
def test_every_registered_method_draws_the_map_it_scores(method):
    """One road: `explain` (what vit-attention draws) and `method_maps` (what vit-attention score
    scores) give the same map for every method of the registry, batch by batch or at once."""
    from vit.interpret.maps import MAP_METHODS, MapSpec, explain, method_maps
    from vit.model import ViT

    assert method in MAP_METHODS
    torch.manual_seed(0)
    model = ViT(num_classes=3, image_size=(16, 24), patch_size=4, dim=32, depth=3, heads=2).eval()
    images = torch.rand(5, 3, 16, 24)
    options = {
        "query": dict(query_patch=(1, 2), layer=1, head=0),
        "rollout": dict(layer=1, head_fusion="max", discard_ratio=0.5),
        "grad-rollout": dict(target=2),
        "input-gradient": dict(target=2),
    }.get(method, {})
    spec = MapSpec(method, **options)
    drawn = explain(model, images, spec, batch_size=2)
    scored = method_maps(model, images, spec, batch_size=5)
    assert drawn.maps.shape == scored.shape == (5, 4, 6)
    torch.testing.assert_close(drawn.maps, scored)
    assert drawn.name == method.replace("-", "_") or method == "query"
    if method in ("grad-rollout", "input-gradient"):  # the class they explain changes the map
        other = MapSpec(method, target=0)
        assert not torch.allclose(method_maps(model, images, other), scored)


def test_the_maps_of_a_spec_are_the_methods_written_out():
    """`method_maps` against each method computed from the weights directly: rollout through the
    layers up to `layer` only, its discarding sparing every prefix token (two registers here), and
    grad-rollout and input-gradient for the predicted classes when no target is given."""
    from vit.interpret.maps import MapSpec, input_gradient, method_maps
    from vit.model import ViT

    torch.manual_seed(1)
    model = ViT(num_classes=4, image_size=(16, 24), patch_size=4, dim=32, depth=3, heads=2, num_registers=2,
                pool="mean").eval()  # fmt: skip
    torch.nn.init.normal_(model.head.weight, std=3.0)  # logits far apart
    images = 0.1 * torch.rand(6, 3, 16, 24)
    images[torch.arange(6), torch.arange(6) % 3] += 0.9  # red, green and blue: the classes differ
    weights = attention_weights(model, images)  # (L, B, H, T, T)
    prefix = model.num_prefix_tokens
    for layer in (0, 1):
        expected = pooled_maps(model, attention_rollout(weights[: layer + 1], "min", 0.5, prefix))
        spec = MapSpec("rollout", layer=layer, head_fusion="min", discard_ratio=0.5)
        torch.testing.assert_close(method_maps(model, images, spec), expected)
    with torch.no_grad():
        predicted = model(images).argmax(-1)
    assert len(set(predicted.tolist())) > 1  # the images' classes differ: targets per image matter
    expected = pooled_maps(model, gradient_rollout(model, images, predicted))
    torch.testing.assert_close(method_maps(model, images, MapSpec("grad-rollout")), expected)
    expected = input_gradient(model, images, predicted, model.grid_size).unflatten(-1, model.grid_size)
    torch.testing.assert_close(method_maps(model, images, MapSpec("input-gradient"), batch_size=4), expected)


def test_a_target_needs_a_head_to_explain():
    from vit.interpret.maps import MapSpec
    from vit.model import ViT

    headless = ViT(num_classes=0, image_size=16, patch_size=4, dim=16, depth=1, heads=2)
    assert MapSpec("grad-rollout").check(headless).target is None
    with pytest.raises(ValueError, match=r"^target=0 is not a class of this model \(0 to -1\)$"):
        MapSpec("grad-rollout", target=0).check(headless)


def test_explain_names_titles_and_reports_what_it_drew():
    """What vit-attention writes comes from `explain`: each method's file stem, title, layers,
    heads, per-layer maps and note, for a class-token model and one whose head reads the patches'
    mean; the logits are the model's."""
    from vit.interpret.maps import MapSpec, explain
    from vit.model import ViT

    torch.manual_seed(0)
    model = ViT(num_classes=3, image_size=(16, 24), patch_size=4, dim=32, depth=2, heads=2).eval()
    images, names = torch.rand(2, 3, 16, 24), ["a", "b", "c"]
    rollout = "attention rollout (max of heads, discard 0.5)"
    grad = "gradient-weighted rollout for the {} class"
    cls = "class-token attention"
    cases = {  # spec: file stem, title, what (the method in words), layers, heads
        MapSpec(): ("cls", f"{cls}, layer 1, mean of heads", cls, [0, 1], [0, 1]),
        MapSpec(head=1): ("cls", f"{cls}, layer 1, head 1", cls, [0, 1], [1]),
        MapSpec("query", layer=0, query_patch=(1, 2)): ("query_1_2",
            "attention of patch (1, 2), layer 0, mean of heads", "attention of patch (1, 2)", [0], [0, 1]),
        MapSpec("rollout", layer=0, head_fusion="max", discard_ratio=0.5): ("rollout",
            f"class-token {rollout}, layers 0 to 0", rollout, [0], [0, 1]),
        MapSpec("grad-rollout"): ("grad_rollout",
            "class-token " + grad.format("predicted"), grad.format("predicted"), [0, 1], [0, 1]),
        MapSpec("grad-rollout", target=2): ("grad_rollout",
            "class-token " + grad.format("c"), grad.format("c"), [0, 1], [0, 1]),
        MapSpec("input-gradient", target=0): ("input_gradient",
            "gradient times input for the a class", "gradient times input for the a class", [0, 1], [0, 1]),
    }  # fmt: skip
    with torch.no_grad():
        logits = model(images)
    for spec, expected in cases.items():
        found = explain(model, images, spec, class_names=names)
        assert (found.name, found.title, found.what, found.layers, found.heads) == expected, spec
        assert found.note is None
        torch.testing.assert_close(found.logits, logits)
        if spec.method in ("cls", "query"):
            assert found.layer_head_maps.shape == (len(found.layers), 2, len(found.heads), 4, 6)
            torch.testing.assert_close(found.maps, found.layer_head_maps[-1].mean(dim=1))
        else:
            assert found.layer_head_maps is None
    pooled = ViT(num_classes=3, image_size=(16, 24), patch_size=4, dim=32, depth=2, heads=2, pool="mean")
    found = explain(pooled.eval(), images, MapSpec())
    assert found.note.startswith("this model's head reads the mean of the patch tokens, not the class token")
    found = explain(pooled, images, MapSpec("rollout"))
    assert found.title == "mean-pooled-token attention rollout (mean of heads, discard 0.0), layers 0 to 1"


def test_explain_notes_both_what_the_head_reads_and_what_the_registers_hold():
    from vit.interpret.maps import MapSpec, explain
    from vit.model import ViT

    torch.manual_seed(0)
    options = dict(image_size=(16, 24), patch_size=4, dim=32, depth=2, heads=2)
    model = ViT(num_classes=3, pool="mean", num_registers=2, **options).eval()
    images = torch.rand(2, 3, 16, 24)
    head, joined, registers = explain(model, images, MapSpec()).note.partition("; the class token gives ")
    assert head.startswith("this model's head reads the mean") and head.endswith("follow what feeds the head")
    assert joined and registers.endswith("the 2 register tokens, which the maps (patches only) leave out")
    query = explain(model, images, MapSpec("query", query_patch=(1, 2))).note
    assert query.startswith("patch (1, 2) gives ") and "mean" not in query
    assert explain(model, images, MapSpec("grad-rollout", target=2)).title.endswith("for the 2 class")
    headless = ViT(num_classes=0, **options).eval()  # features, no classes: the maps still come
    assert explain(headless, images, MapSpec("rollout")).maps.shape == (2, 4, 6)


def test_iter_attention_yields_the_chunks_attention_weights_joins():
    model = tiny_vit()
    images = torch.randn(5, 1, 16, 24)
    chunks = list(iter_attention(model, images, layers=[0], heads=1, batch_size=2))
    assert [chunk.shape for chunk in chunks] == [(1, 2, 1, 25, 25), (1, 2, 1, 25, 25), (1, 1, 1, 25, 25)]
    torch.testing.assert_close(torch.cat(chunks, dim=1), attention_weights(model, images, [0], 1))
    assert len(list(iter_attention(model, images))) == 1  # 64 at a time by default


def test_discard_counts_the_patch_keys_of_each_row():
    """k = int(patch keys * ratio): 4 patch keys of 5 tokens, so 0.6 drops 2 (not int(5 * 0.6) = 3)
    and 0.25 drops 1 (a single weight is dropped too); three images, five rows each."""
    fused = torch.rand(3, 5, 5) + 0.1
    for ratio, dropped in ((0.6, 2), (0.25, 1), (0.2, 0)):
        kept = discard_lowest(fused, ratio)
        assert ((kept[..., 1:] == 0).sum(-1) == dropped).all(), ratio


def rollout_by_hand(weights, ratio, prefix):
    eye = torch.eye(weights.shape[-1])
    rollout = eye.expand(weights.shape[1], -1, -1)
    for layer in weights:
        a = discard_lowest(layer.mean(1), ratio, prefix) + eye
        rollout = (a / a.sum(-1, keepdim=True)) @ rollout
    return rollout


def test_rollout_discards_after_the_prefix_tokens_it_is_told_of():
    torch.manual_seed(1)
    weights = torch.rand(3, 2, 2, 7, 7).softmax(-1)
    torch.testing.assert_close(
        attention_rollout(weights, discard_ratio=0.5), rollout_by_hand(weights, 0.5, 1)
    )
    two = attention_rollout(weights, discard_ratio=0.5, num_prefix_tokens=2)
    torch.testing.assert_close(two, rollout_by_hand(weights, 0.5, 2))
    assert not torch.allclose(two, rollout_by_hand(weights, 0.5, 1))


def test_gradient_rollout_is_the_same_image_by_image_and_checks_its_inputs():
    model = tiny_vit()
    images = torch.randn(3, 1, 16, 24)
    torch.testing.assert_close(gradient_rollout(model, images, batch_size=1), gradient_rollout(model, images))
    with pytest.raises(ValueError, match=r"^batch_size=0 must be at least 1$"):
        gradient_rollout(model, images, batch_size=0)
    for bad in (4, -1):  # 4 classes: 0 to 3
        with pytest.raises(
            ValueError, match=re.escape(f"target classes must lie in [0, 4), got [{bad}, {bad}, {bad}]")
        ):
            gradient_rollout(model, images, targets=bad)


def test_attention_share_averages_query_patches_heads_apart_and_skips_images_without_queries():
    """Three images, two heads, class token + 4 patches. Image 0's query patches 0 and 1 put 0.6
    and 0.2 (head 0) or 0.1 and 0.3 (head 1) on key patch 3; image 1 has no query patch and would
    put 1.0 everywhere it could; image 2's one query patch puts 0.5 there in both heads."""
    weights = torch.zeros(1, 3, 2, 5, 5)
    weights[0, 0, 0, 1, 4], weights[0, 0, 0, 2, 4] = 0.6, 0.2
    weights[0, 0, 1, 1, 4], weights[0, 0, 1, 2, 4] = 0.1, 0.3
    weights[0, 0, :, 3, 4] = 0.9  # not a query patch
    weights[0, 1] = 1.0
    weights[0, 2, :, 3, 4] = 0.5
    queries = torch.tensor([[True, True, False, False], [False] * 4, [False, False, True, False]])
    keys = torch.tensor([[False, False, False, True], [True] * 4, [False, False, False, True]])
    share, chance = attention_share(weights, queries, keys)
    torch.testing.assert_close(share, torch.tensor([[(0.4 + 0.5) / 2, (0.2 + 0.5) / 2]]))
    assert chance.item() == pytest.approx(1 / 5)  # one key patch of 5 tokens in each image used


def test_patch_tokens_cover_the_grid_and_nothing_else():
    model = tiny_vit()  # 16x24 pixels, patch 4: a 4x6 grid after the class token
    assert [patch_token(model, p) for p in [(0, 0), (0, 5), (1, 0), (3, 5)]] == [1, 6, 7, 24]
    for outside in [(4, 0), (0, 6), (-1, 0), (0, -1)]:
        with pytest.raises(ValueError, match=re.escape(f"patch {outside} is outside the 4x6 patch grid")):
            patch_token(model, outside)


def test_layers_and_heads_count_from_the_end_and_name_what_is_out_of_range():
    model = tiny_vit()  # 2 layers, 2 heads
    assert select_layers(model, -2) == [0] and select_heads(model, [-1, 0]) == [1, 0]
    with pytest.raises(ValueError, match="^layer=2 is out of range for a model with 2 layers$"):
        select_layers(model, 2)
    with pytest.raises(ValueError, match="^head=-3 is out of range for a model with 2 heads$"):
        select_heads(model, -3)
    with pytest.raises(ValueError, match="^batch_size=0 must be at least 1$"):
        attention_weights(model, torch.randn(2, 1, 16, 24), batch_size=0)
    with pytest.raises(ValueError, match=r"^unknown head_fusion 'sum'; choose one of mean, max, min$"):
        check_head_fusion("sum")
    with pytest.raises(ValueError, match=r"^the model has no position embeddings \(pos_embed: none\)$"):
        pos_embed_similarity(tiny_vit(pos_embed="none"))
    with pytest.raises(
        ValueError, match="^a model with a conv_stem has no patch filters over pixels to show$"
    ):
        embedding_filters(tiny_vit(image_size=(8, 8), channels=3, conv_stem=(4,)))


def test_embedding_filter_components_are_those_of_the_centred_filters():
    """Every filter is one shared pattern (large) plus its own multiple of one direction: centred
    across the filters, only the direction varies, so it is the first component and explains
    all the variance; the shared pattern must not show."""
    model = tiny_vit(image_size=(8, 8), channels=3)
    dim, size = model.patch_proj.weight.shape  # 48 pixels a filter: (p1 p2 c)
    shared = torch.randn(size) * 10
    direction = F.normalize(torch.randn(size), dim=0)
    with torch.no_grad():
        model.patch_proj.weight.copy_(shared + torch.randn(dim, 1) * direction)
    components, explained = embedding_filter_components(model, k=3)
    first = rearrange(components[0], "c p1 p2 -> (p1 p2 c)")
    assert abs(float(first @ direction)) == pytest.approx(1, abs=1e-4) and explained[0] == pytest.approx(
        1, abs=1e-4
    )


def test_register_share_reads_the_register_columns_of_the_row_asked_for():
    """Class token, 3 registers, then the 4x6 patches, 3 layers: in the last, the class token puts
    0.1 on each register and patch (0, 1) (token 5) 0.2 on each in head 0 and 0.1 in head 1; the
    other layers are ignored."""
    model = tiny_vit(num_registers=3)
    weights = torch.zeros(3, 1, 2, 28, 28)
    weights[:2] = 0.5
    weights[2, :, :, 0, 1:4] = 0.1
    weights[2, :, 0, 5, 1:4], weights[2, :, 1, 5, 1:4] = 0.2, 0.1
    weights[2, :, :, 0, 4] = weights[2, :, :, 5, 0] = 0.7  # a patch and the class token: not registers
    note = register_share(model, weights, [0, 1, 2], None)
    assert note == "the class token gives 30% of its attention in layer 2 to the 3 register tokens, " + (
        "which the maps (patches only) leave out"
    )
    assert register_share(model, weights, [0, 1, 2], (0, 1)).startswith(
        "patch (0, 1) gives 45% of its attention"
    )
