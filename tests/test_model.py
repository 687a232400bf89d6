import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from tests.helpers import explicit_attention_weights
from vit import ViTClassifier
from vit.config import PRESETS, ViTConfig
from vit.interpret.maps import attention_weights
from vit.layers import RelativePositionBias, ShiftedPatches, sincos_2d
from vit.model import Attention, LocalityAttention, ViT


def make_attention(dim: int, heads: int, locality: bool = False, fused: bool = True) -> Attention:
    config = ViTConfig(dim=dim, heads=heads, fused_attn=fused)
    return (LocalityAttention if locality else Attention)(config)


def explicit_attention(attn: Attention, x: torch.Tensor, mask: torch.Tensor | None = None):
    """The explicit path's output and its weights, recorded by a hook on `attend`."""
    weights, fused = [], attn.fused
    handle = attn.attend.register_forward_hook(lambda module, args, output: weights.append(output))
    try:
        attn.fused = False
        out = attn(x, mask=mask)
    finally:
        attn.fused = fused
        handle.remove()
    return out, weights[0]


def features_and_attention(model: ViT, x: torch.Tensor):
    """Tokens and every block's attention weights (batch, heads, tokens, tokens)."""
    return explicit_attention_weights(model, x)


def make_mask(batch: int, tokens: int, seed: int = 0) -> torch.Tensor:
    """Random boolean mask (True = may attend) that keeps the diagonal, so no row is empty."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, 1, tokens, tokens, generator=g) > 0.4
    return mask | torch.eye(tokens, dtype=torch.bool)


@pytest.mark.parametrize("locality", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_fused_and_explicit_paths_agree(masked, dtype, tolerance, locality):
    torch.manual_seed(0)
    attn = make_attention(32, 4, locality=locality)
    x = torch.randn(3, 10, 32)
    mask = make_mask(3, 10) if masked else None
    reference, _ = explicit_attention(attn, x, mask)  # explicit, fp32
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        fused = attn(x, mask=mask)
        explicit, weights = explicit_attention(attn, x, mask)
    assert weights.shape == (3, 4, 10, 10)
    assert fused.dtype == explicit.dtype == dtype
    torch.testing.assert_close(fused, explicit, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(fused.float(), reference, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("mask_kind", [None, "bool", "additive"])
def test_locality_attention_skips_the_diagonal_and_learns_its_temperature(mask_kind):
    """LSA: softmax(Q K^T * t) V with a learned t, starting at 1/sqrt(d_head), and no token
    attending to itself; the fused and explicit paths agree, under masks of both kinds."""
    attn = make_attention(8, 1, locality=True)
    assert attn.log_scale.exp().item() == pytest.approx(8**-0.5)
    with torch.no_grad():  # q = k = x, v = x
        attn.qkv.weight.copy_(torch.cat([torch.eye(8)] * 3))
        attn.qkv.bias.zero_()
        attn.log_scale.fill_(math.log(0.7))
    x = torch.randn(2, 6, 8)
    mask = make_mask(2, 6, seed=2) | torch.eye(6, dtype=torch.bool).roll(1, -1)  # a key besides itself
    if mask_kind == "additive":
        mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    fused = attn(x, mask=None if mask_kind is None else mask)
    explicit, weights = explicit_attention(attn, x, None if mask_kind is None else mask)
    scores = (x @ x.transpose(1, 2) * 0.7)[:, None].masked_fill(torch.eye(6, dtype=torch.bool), float("-inf"))
    if mask_kind is not None:
        scores = scores.masked_fill(mask.isinf() if mask_kind == "additive" else ~mask, float("-inf"))
    torch.testing.assert_close(weights, scores.softmax(-1))
    assert (weights.diagonal(dim1=-2, dim2=-1) == 0).all()
    torch.testing.assert_close(fused, explicit)
    # the temperature learns, in the bf16 training path too
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attn(x)
    out.float().square().sum().backward()
    assert attn.log_scale.grad is not None and attn.log_scale.grad.abs() > 0


@pytest.mark.parametrize("additive", [False, True])
def test_locality_attention_lets_a_token_with_no_other_key_attend_to_itself(additive):
    """A mask that leaves token 0 only itself: locality attention must not empty its row (NaN)."""
    attn = make_attention(8, 2, locality=True)
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[0] = False
    mask[0, 0] = True
    if additive:
        mask = torch.zeros(5, 5).masked_fill(~mask, float("-inf"))
    x = torch.randn(2, 5, 8)
    explicit, weights = explicit_attention(attn, x, mask)
    fused = attn(x, mask=mask)
    assert torch.isfinite(explicit).all()
    torch.testing.assert_close(weights[:, :, 0, 0], torch.ones(2, 2))
    assert (weights[:, :, 1:].diagonal(offset=1, dim1=-2, dim2=-1) == 0).all()  # others skip themselves
    torch.testing.assert_close(fused, explicit)


def pixels_seen(token: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
    """(H, W) bool: the pixels of `image` (over batch and channels) that `token` depends on."""
    (grad,) = torch.autograd.grad(token.square().sum(), image)
    return grad.abs().sum(dim=(0, 1)) > 0


def test_shifted_patches_see_their_neighbours():
    """SPT stacks the image and four copies moved half a patch diagonally (zeros fill in), so a
    patch token reads the pixels up to half a patch around its patch, and no further."""
    x = torch.randn(2, 3, 8, 8)
    shifted = ShiftedPatches(2)
    out = shifted(x)
    assert out.shape == (2, 15, 8, 8)
    assert sorted(shifted.offsets) == [(-2, -2), (-2, 2), (0, 0), (2, -2), (2, 2)]
    padded = F.pad(x, (2, 2, 2, 2))  # padded[y + 2, x + 2] = image[y, x]
    for i, (dy, dx) in enumerate(shifted.offsets):  # copy[y, x] = image[y - dy, x - dx]
        torch.testing.assert_close(out[:, 3 * i : 3 * i + 3], padded[..., 2 - dy : 10 - dy, 2 - dx : 10 - dx])

    model = ViT(preset="micro", num_classes=3, image_size=16, patch_size=4, shifted_patches=True)
    assert model.patch_proj.in_features == 4 * 4 * 3 * 5
    image = torch.randn(1, 3, 16, 16, requires_grad=True)
    token = model.patch_embed(image)[0, 5]  # the patch at row 1, column 1: pixels 4..7
    seen = pixels_seen(token, image)
    expected = torch.zeros(16, 16, dtype=torch.bool)
    expected[2:10, 2:10] = True
    assert torch.equal(seen, expected)
    assert model(image).shape == (1, 3)


def test_a_classifier_gives_its_network_channels_last_images_and_the_same_logits():
    """The classifier hands its network NHWC images (oneDNN's and cuDNN's faster convolutions),
    on the CPU as on a GPU: the stem's first convolution sees channels-last memory, and the logits
    are the ones of the same images in NCHW, in training (batch statistics) and in eval."""
    torch.manual_seed(0)
    stem = ViTConfig(preset="micro", patch_size=4, conv_stem=(8, 16))
    classifier = ViTClassifier(num_classes=3, image_size=16, vit=stem)
    seen = []
    classifier.model.stem[0].register_forward_pre_hook(
        lambda module, args: seen.append(args[0].is_contiguous(memory_format=torch.channels_last))
    )
    images, labels = torch.rand(6, 3, 16, 16), torch.randint(3, (6,))
    assert images.is_contiguous() and not images.is_contiguous(memory_format=torch.channels_last)
    for mode in (classifier.train, classifier.eval):
        mode()
        with torch.no_grad():
            logits, _ = classifier.loss(images, labels)
            assert seen.pop() is True
            torch.testing.assert_close(logits, classifier.model(images), rtol=1e-5, atol=1e-5)
            assert seen.pop() is False
    # plain patches, no convolution: the images as they are (a copy would buy nothing)
    plain = ViTClassifier(num_classes=3, image_size=16, vit=ViTConfig(preset="micro", patch_size=4))
    plain.model.register_forward_pre_hook(lambda module, args: seen.append(args[0].is_contiguous()))
    plain.loss(images, labels)
    assert seen == [True]


def test_conv_stem_keeps_the_patch_grid_and_reads_a_window_around_each_patch():
    """Two 3x3 stride-2 convolutions take a 4-pixel patch's share of the stride, so the grid and
    the token count stay the patch size's; the token of patch (1, 1), pixels 4..7, reads the
    pixels 1..7 (each convolution's padding looks one step up and left), and no others. A batch of
    images, because in one image every ReLU on a corner pixel's path can be off (5 seeds in 200)."""
    torch.manual_seed(0)
    model = ViT(preset="micro", num_classes=3, image_size=16, patch_size=4, conv_stem=(8, 16))
    assert model.grid_size == (4, 4) and model.patch_proj.in_features == 16  # 1x1 patches, 16 channels
    image = torch.randn(16, 3, 16, 16, requires_grad=True)
    model.eval()  # BatchNorm's running statistics: each image on its own
    token = model.patch_embed(model.stem(image))[:, 5]
    seen = pixels_seen(token, image)
    expected = torch.zeros(16, 16, dtype=torch.bool)
    expected[1:8, 1:8] = True
    assert torch.equal(seen, expected)
    assert model(image).shape == (16, 3)
    assert model.layer_of("stem.0.weight") == 0  # with the embeddings, for layer-wise decay
    # patch 8 leaves a 2x2 patch of the stem's output per token
    wide = ViT(preset="micro", num_classes=3, image_size=16, patch_size=8, conv_stem=(8, 16))
    assert wide.patch_proj.in_features == 2 * 2 * 16
    for options, message in (
        (dict(patch_size=2), "patch_size=2 is not divisible by the stem's 4"),
        (dict(shifted_patches=True), "conv_stem and shifted_patches do not combine"),
    ):
        with pytest.raises(ValueError, match=message):
            ViT(
                preset="micro", num_classes=3, image_size=16, conv_stem=(8, 16), **{"patch_size": 4} | options
            )


def test_a_stride_1_convolution_in_the_stem_widens_the_window_and_keeps_the_grid():
    """conv_stem_strides [1, 2, 2]: a stride-1 convolution first, then the two stride-2 ones; the
    grid stays 4x4 and the token of patch (1, 1) reads one pixel more on each side: 0..8."""
    torch.manual_seed(0)
    model = ViT(
        preset="micro",
        num_classes=3,
        image_size=16,
        patch_size=4,
        conv_stem=(4, 8, 16),
        conv_stem_strides=(1, 2, 2),
    )
    assert model.grid_size == (4, 4) and model.patch_proj.in_features == 16
    image = torch.randn(16, 3, 16, 16, requires_grad=True)
    model.eval()
    seen = pixels_seen(model.patch_embed(model.stem(image))[:, 5], image)
    expected = torch.zeros(16, 16, dtype=torch.bool)
    expected[0:9, 0:9] = True
    assert torch.equal(seen, expected)
    assert list(model.config.conv_stem_strides) == [1, 2, 2]  # exported with the weights
    for options, message in (
        (dict(conv_stem_strides=(2,)), r"conv_stem_strides=\[2\] needs one stride per conv_stem entry"),
        (dict(conv_stem_strides=(1, 3)), "conv_stem_strides must be 1s and 2s"),
    ):
        with pytest.raises(ValueError, match=message):
            ViT(preset="micro", num_classes=3, image_size=16, patch_size=4, conv_stem=(8, 16), **options)


def test_an_airbench_stem_is_airbench94s_blocks_each_halving_the_map():
    """conv_stem_block 'airbench': each conv_stem entry one of airbench94's blocks, here computed by
    hand from the stem's own weights (3x3 convolution, zero padding, no bias; max-pool 2;
    BatchNorm of scale fixed at 1; GELU; 3x3 convolution; BatchNorm; GELU), its first filters
    the identity (Dirac). [8, 16] makes 32 pixels an 8x8 map of 16 channels: patch 4, 64 tokens."""
    torch.manual_seed(0)
    airbench = dict(
        preset="micro", num_classes=3, patch_size=4, conv_stem=(8, 16), conv_stem_block="airbench"
    )
    model = ViT(**airbench)
    assert model.config.stem_stride == 4 and model.grid_size == (8, 8)
    assert model.patch_proj.in_features == 16  # 1x1 patches of the 16-channel map
    for block in model.stem:  # BatchNorm's moving statistics, random: in eval mode they count
        for norm in (block[2], block[5]):
            assert not norm.weight.requires_grad and torch.equal(norm.weight, torch.ones_like(norm.weight))
            norm.running_mean.normal_()
            norm.running_var.uniform_(0.5, 2)
            norm.bias.data.normal_()
    first = model.stem[0][0].weight
    assert torch.equal(first[:3], torch.eye(3)[:, :, None, None] * F.pad(torch.ones(1, 1), (1, 1, 1, 1)))
    model.eval()
    x = torch.randn(2, 3, 32, 32)

    def norm(x, bn):
        return (x - bn.running_mean[:, None, None]) / (
            bn.running_var[:, None, None] + bn.eps
        ).sqrt() + bn.bias[:, None, None]

    expected = x
    for block in model.stem:
        expected = F.gelu(norm(F.max_pool2d(F.conv2d(expected, block[0].weight, padding=1), 2), block[2]))
        expected = F.gelu(norm(F.conv2d(expected, block[4].weight, padding=1), block[5]))
    assert expected.shape == (2, 16, 8, 8)
    torch.testing.assert_close(model.stem(x), expected)
    assert model(x).shape == (2, 3)
    # strides of 2 are what the blocks do anyway (a config's strides overridden on the command line)
    assert ViT(**airbench, conv_stem_strides=(2, 2)).grid_size == (8, 8)
    for options, message in (
        (
            dict(conv_stem_strides=(1, 2)),
            "an 'airbench' stem's blocks each halve the map: its conv_stem_strides are 2s",
        ),
        (dict(patch_size=2), "patch_size=2 is not divisible by the stem's 4"),
        (dict(conv_stem_block="resnet"), "conv_stem_block must be 'conv' or 'airbench', got 'resnet'"),
    ):
        with pytest.raises(ValueError, match=message):
            ViT(**airbench | options)


def test_additive_mask_equals_boolean_mask():
    torch.manual_seed(0)
    attn = make_attention(16, 2)
    x = torch.randn(2, 6, 16)
    mask = make_mask(2, 6, seed=1)
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    for fused in (True, False):
        attn.fused = fused
        torch.testing.assert_close(attn(x, mask=additive), attn(x, mask=mask))


@pytest.mark.parametrize("masked", [False, True])
def test_equals_torch_multihead_attention(masked):
    torch.manual_seed(0)
    dim, heads = 24, 3
    ours = make_attention(dim, heads, fused=False)
    theirs = nn.MultiheadAttention(dim, heads, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(ours.qkv.weight)
        theirs.in_proj_bias.copy_(ours.qkv.bias)
        theirs.out_proj.weight.copy_(ours.proj.weight)
        theirs.out_proj.bias.copy_(ours.proj.bias)
    x = torch.randn(2, 7, dim)
    mask = make_mask(2, 7) if masked else None
    out, weights = explicit_attention(ours, x, mask)
    # nn.MultiheadAttention's boolean mask means the opposite (True = blocked), per batch*heads
    their_mask = None if mask is None else (~mask).expand(2, heads, 7, 7).reshape(2 * heads, 7, 7)
    expected, expected_weights = theirs(x, x, x, attn_mask=their_mask, average_attn_weights=False)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)


def test_weights_are_distributions_and_masked_entries_are_zero():
    torch.manual_seed(0)
    attn = make_attention(32, 4)
    x = torch.randn(3, 10, 32)
    mask = make_mask(3, 10)
    _, weights = explicit_attention(attn, x, mask)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 10))
    assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()
    assert (weights.masked_select(mask.expand_as(weights)) > 0).all()


def test_scores_are_scaled_by_sqrt_head_dim():
    attn = make_attention(8, 1)
    with torch.no_grad():  # q = k = x, v = x: the weights are softmax(x x^T / sqrt(8))
        attn.qkv.weight.copy_(torch.cat([torch.eye(8)] * 3))
        attn.qkv.bias.zero_()
    x = torch.randn(1, 5, 8)
    _, weights = explicit_attention(attn, x)
    torch.testing.assert_close(weights[0, 0], (x[0] @ x[0].T / 8**0.5).softmax(-1))


@pytest.mark.parametrize(
    "options",
    [
        {},
        dict(shifted_patches=True, locality_attention=True, patch_dropout=0.5, patch_norm=True),
        dict(rel_pos_bias=True),
        dict(rel_pos_bias=True, locality_attention=True, class_token=False, pool="mean"),
    ],
)
@pytest.mark.parametrize("fused", [True, False])
def test_gradients_reach_every_parameter(fused, options):
    torch.manual_seed(0)
    model = ViT(
        preset="micro", num_classes=3, image_size=16, patch_size=4, fused_attn=fused, drop_path=0.1, **options
    )
    model(torch.randn(4, 3, 16, 16)).logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        assert torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize(
    "image_size, channels, pool, pos_embed",
    [
        (16, 3, "cls", "learned"),
        ((16, 24), 1, "mean", "sincos"),
        ((24, 8), 3, "cls", "none"),
        ((16, 24), 1, "cls", "periodic"),
    ],
)
def test_output_shapes(image_size, channels, pool, pos_embed):
    model = ViT(preset="micro", num_classes=5, image_size=image_size, patch_size=4, in_channels=channels,
        pool=pool, pos_embed=pos_embed,
    )  # fmt: skip
    h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
    x = torch.randn(2, channels, h, w)
    tokens, attention = features_and_attention(model, x)
    assert model.grid_size == (h // 4, w // 4)
    assert tokens.shape == (2, 1 + (h // 4) * (w // 4), PRESETS["micro"]["dim"])
    assert len(attention) == PRESETS["micro"]["depth"]
    assert attention[0].shape == (2, PRESETS["micro"]["heads"], tokens.shape[1], tokens.shape[1])
    logits = model(x)
    assert logits.shape == (2, 5) and torch.isfinite(logits).all()
    torch.testing.assert_close(model.forward_head(tokens), logits)


@pytest.mark.parametrize("periodic", [True, False])
def test_periodic_position_table_wraps_around(periodic):
    """With `periodic`, the similarity of two positions depends only on their offset around the
    torus: shifting both by one column (wrapping at the edge) changes nothing. The plain sin-cos
    table does not wrap."""
    grid_h, grid_w = 4, 6
    table = sincos_2d(grid_h, grid_w, 32, periodic=periodic).view(grid_h, grid_w, 32)
    similarity = torch.einsum("ijd,kld->ijkl", table, table)
    shifted = similarity.roll(shifts=(1, 1), dims=(1, 3))  # both positions one column on
    assert torch.allclose(similarity, shifted, atol=1e-4) == periodic
    shifted = similarity.roll(shifts=(1, 1), dims=(0, 2))  # both one row on
    assert torch.allclose(similarity, shifted, atol=1e-4) == periodic


def test_patch_norm_makes_the_model_blind_to_pixel_scale():
    """LayerNorm before and after the patch projection: scaling the pixels leaves the output
    unchanged; without it, the output changes."""
    torch.manual_seed(0)
    x = torch.rand(2, 1, 16, 16) + 0.1
    for patch_norm in (True, False):
        model = ViT(
            preset="micro", num_classes=3, image_size=16, patch_size=4, in_channels=1, patch_norm=patch_norm
        ).eval()
        close = torch.allclose(model(x), model(5 * x), atol=1e-4)
        assert close == patch_norm
        assert model.patch_proj.in_features == 16


def test_init_choices():
    """timm's N(0, 0.02) start, or PyTorch's default linear init with unit-scale class token and
    positions (vit-pytorch's); anything else is refused."""
    torch.manual_seed(0)
    timm = ViT(preset="mini", num_classes=3, image_size=32, init="timm")
    torch_init = ViT(preset="mini", num_classes=3, image_size=32, init="torch")
    assert timm.pos_embed.std().item() == pytest.approx(0.02, rel=0.1)
    assert torch_init.pos_embed.std().item() == pytest.approx(0.88, rel=0.1)  # N(0, 1) cut at +-2
    assert timm.blocks[0].mlp.fc1.weight.std().item() == pytest.approx(0.02, rel=0.1)
    fan_in = torch_init.blocks[0].mlp.fc1.in_features  # kaiming uniform, a = sqrt(5)
    assert torch_init.blocks[0].mlp.fc1.weight.std().item() == pytest.approx((3 * fan_in) ** -0.5, rel=0.1)
    with pytest.raises(ValueError, match="init must be"):
        ViT(preset="mini", num_classes=3, init="xavier")
    # the default is PyTorch's: it learned faster in every comparison we ran (docs/model.md)
    torch.manual_seed(1)
    default = ViT(preset="mini", num_classes=3, image_size=32)
    torch.manual_seed(1)
    explicit = ViT(preset="mini", num_classes=3, image_size=32, init="torch")
    assert all(torch.equal(a, b) for a, b in zip(default.parameters(), explicit.parameters(), strict=True))


def test_image_size_not_divisible_by_patch_size():
    with pytest.raises(ValueError, match=r"30x32 is not divisible by patch size 4"):
        ViT(num_classes=2, image_size=(30, 32), patch_size=4)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        ViT(preset="huge", num_classes=2)


def test_position_embeddings_matter_only_when_present():
    """Without position embeddings the model sees a bag of patches: swapping two patches swaps
    their output tokens and changes nothing else. With them, a patch's token depends on where
    it is."""
    torch.manual_seed(0)
    x = torch.randn(2, 1, 16, 16)
    swapped = x.clone()  # swap the top-left and bottom-right 4x4 patches (tokens 1 and 16)
    swapped[..., :4, :4], swapped[..., 12:, 12:] = x[..., 12:, 12:], x[..., :4, :4]
    for pos_embed, invariant in (("none", True), ("learned", False), ("sincos", False)):
        model = ViT(
            preset="micro", num_classes=3, image_size=16, patch_size=4, in_channels=1, pos_embed=pos_embed
        )
        if pos_embed == "learned":
            nn.init.normal_(model.pos_embed)
        a, b = model.forward_features(x), model.forward_features(swapped)
        difference = max((a[:, 0] - b[:, 0]).abs().max(), (a[:, 1] - b[:, 16]).abs().max()).item()
        assert (difference < 1e-5) == invariant, (pos_embed, difference)


def test_attention_window_limits_how_far_information_travels():
    """With a window of 1 patch and 2 blocks, a patch's token depends only on patches at most 2
    rows and columns away; the class token is cut off, so the model pools the patch tokens."""
    torch.manual_seed(0)
    model = ViT(
        preset="micro", num_classes=3, image_size=32, patch_size=4, in_channels=1, pool="mean", attn_window=1
    )
    x = torch.randn(1, 1, 32, 32)
    changed = x.clone()
    changed[..., 28:, 28:] += 1.0  # the bottom-right patch: row 7, column 7
    a, b = model.forward_features(x)[0, 1:], model.forward_features(changed)[0, 1:]
    moved = (a - b).abs().amax(-1).reshape(8, 8) > 1e-6
    rows, cols = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    within_two = ((7 - rows) <= 2) & ((7 - cols) <= 2)
    assert torch.equal(moved, within_two)
    _, weights = features_and_attention(model, x)
    assert (weights[0][0, :, 0, 1:] == 0).all() and (weights[0][0, :, 1:, 0] == 0).all()


def test_patch_dropout_keeps_a_random_subset_of_patches_in_training_only():
    """In training the class token and a different random half of the patch tokens go on, each
    with its own position; in evaluation every token goes on and the output is the plain model's."""
    torch.manual_seed(0)
    kwargs = dict(num_classes=3, image_size=16, patch_size=4, pos_embed="sincos")
    model = ViT(preset="micro", patch_dropout=0.5, **kwargs)
    plain = ViT(preset="micro", **kwargs)
    plain.load_state_dict(model.state_dict())
    model.blocks = nn.ModuleList()  # tokens straight to the final norm: we can see which went on
    plain.blocks = nn.ModuleList()
    x = torch.randn(4, 3, 16, 16)
    everything = plain.eval().forward_features(x)
    kept = model.train().forward_features(x)
    assert kept.shape == (4, 1 + 8, 32)
    torch.testing.assert_close(kept[:, 0], everything[:, 0])  # the class token is always kept
    sources = []
    for image in range(4):  # every kept token is one of this image's patch tokens, none twice
        match = torch.cdist(kept[image, 1:], everything[image, 1:]).argmin(dim=1)
        torch.testing.assert_close(kept[image, 1:], everything[image, 1 + match])
        assert len(set(match.tolist())) == 8
        sources.append(tuple(sorted(match.tolist())))
    assert len(set(sources)) > 1  # a different subset per image
    torch.testing.assert_close(model.eval().forward_features(x), everything)
    # a whole model in training: logits for every image, gradients to the positions
    full = ViT(preset="micro", num_classes=3, image_size=16, patch_size=4, pool="mean", patch_dropout=0.5)
    logits = full.train()(torch.randn(32, 3, 16, 16))
    logits.sum().backward()
    assert logits.shape == (32, 3)  # each patch is dropped from all 32 images with chance 2^-32:
    assert full.pos_embed.grad[0, 1:].abs().sum(-1).gt(0).all()  # all positions learn
    # attention maps are drawn from every patch, even of a model left in training mode
    weights = attention_weights(full, x)
    assert weights.shape == (2, 4, 2, 17, 17) and full.training
    with pytest.raises(ValueError, match="patch_dropout"):
        ViT(preset="micro", patch_dropout=1.0, **kwargs)


@pytest.mark.parametrize("class_token", [True, False])
def test_relative_position_bias_depends_on_the_offset_only(class_token):
    """Two pairs of patches share a bias exactly when they are the same rows and columns apart;
    the class token's row, column and own entry are three more, BEiT's."""
    grid, prefix = (3, 4), int(class_token)
    rel = RelativePositionBias(grid, heads=2, class_token=class_token)
    assert rel.relative_position_bias_table.shape == (5 * 7 + 3 * prefix, 2)
    with torch.no_grad():
        rel.relative_position_bias_table.copy_(torch.randn_like(rel.relative_position_bias_table))
    bias = rel()
    assert bias.shape == (2, 12 + prefix, 12 + prefix)
    rows, cols = (c.flatten() for c in torch.meshgrid(torch.arange(3), torch.arange(4), indexing="ij"))
    offset = torch.stack((rows[:, None] - rows, cols[:, None] - cols), -1)  # (12, 12, 2)
    same_offset = (offset[:, :, None, None] == offset[None, None]).all(-1)  # (i, j) and (k, l)
    patches = bias[0, prefix:, prefix:]
    same_bias = patches[:, :, None, None] == patches[None, None]
    assert torch.equal(same_bias, same_offset)
    if class_token:
        table = rel.relative_position_bias_table
        assert (bias[:, 0, 1:] == table[35, :, None]).all() and (bias[:, 1:, 0] == table[36, :, None]).all()
        torch.testing.assert_close(bias[:, 0, 0], table[37])


@pytest.mark.parametrize("class_token", [True, False])
def test_relative_position_bias_fused_and_explicit_agree(class_token):
    """The bias reaches SDPA as an additive mask and the explicit path as the same: both give one
    output, and one gradient for the tables."""
    torch.manual_seed(0)
    kwargs = dict(num_classes=3, image_size=16, patch_size=4, rel_pos_bias=True, class_token=class_token)
    fused = ViT(preset="micro", pool="cls" if class_token else "mean", **kwargs)
    explicit = ViT(preset="micro", pool="cls" if class_token else "mean", fused_attn=False, **kwargs)
    with torch.no_grad():
        for rel in fused.rel_pos:
            rel.relative_position_bias_table.normal_()
    explicit.load_state_dict(fused.state_dict())
    x = torch.randn(4, 3, 16, 16)
    outputs = [model(x) for model in (fused, explicit)]
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)
    for out in outputs:
        out.logsumexp(-1).sum().backward()
    for a, b in zip(fused.rel_pos, explicit.rel_pos, strict=True):
        grad_a, grad_b = a.relative_position_bias_table.grad, b.relative_position_bias_table.grad
        assert grad_a.abs().sum() > 0
        torch.testing.assert_close(grad_a, grad_b, atol=1e-5, rtol=1e-4)
    # without the bias (or with another one) the output differs: the bias is used
    with torch.no_grad():
        explicit.rel_pos[0].relative_position_bias_table.zero_()
    assert not torch.allclose(explicit(x), outputs[0], atol=1e-3)


def test_relative_position_bias_refuses_what_it_cannot_index():
    kwargs = dict(num_classes=2, image_size=16, patch_size=4, rel_pos_bias=True)
    with pytest.raises(ValueError, match="registers"):
        ViT(preset="micro", num_registers=1, **kwargs)
    with pytest.raises(ValueError, match="patch_dropout"):
        ViT(preset="micro", patch_dropout=0.5, **kwargs)
    model = ViT(preset="micro", **kwargs)
    assert model.no_weight_decay() >= {f"rel_pos.{i}.relative_position_bias_table" for i in range(2)}
    assert model.layer_of("rel_pos.1.relative_position_bias_table") == 2  # block 1's
    with pytest.raises(ValueError, match="keeps its image size"):
        model.set_image_size(24)


def test_attention_window_needs_mean_pooling():
    with pytest.raises(ValueError, match="pool='mean'"):
        ViT(preset="micro", num_classes=2, image_size=16, patch_size=4, attn_window=1)


def test_bf16_on_cpu_trains_through_the_explicit_path_and_infers_through_sdpa(monkeypatch):
    """In bf16 on CPU, a fused Attention trains through the explicit path (SDPA's flash backward is
    slow there) and infers through SDPA's kernel (faster without a backward); the explicit path
    must give SDPA's answer, forward and backward."""
    torch.manual_seed(0)
    attn = make_attention(32, 4)
    x = torch.randn(3, 10, 32, requires_grad=True)
    sdpa_kernel = F.scaled_dot_product_attention
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = rearrange(attn.qkv(x), "b n (three h d) -> three b h n d", three=3, h=4)
        sdpa = attn.proj(rearrange(sdpa_kernel(q, k, v), "b h n d -> b n (h d)"))
        monkeypatch.setattr(F, "scaled_dot_product_attention", None)  # calling it would fail
        ours = attn(x)
    torch.testing.assert_close(ours, sdpa, atol=3e-2, rtol=3e-2)
    (grad_ours,) = torch.autograd.grad(ours.float().sum(), x)
    (grad_sdpa,) = torch.autograd.grad(sdpa.float().sum(), x)
    torch.testing.assert_close(grad_ours, grad_sdpa, atol=3e-2, rtol=3e-2)
    calls = []
    monkeypatch.setattr(
        F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa_kernel(*a, **k)
    )
    for no_backward in (torch.no_grad, torch.inference_mode):
        with no_backward(), torch.autocast("cpu", dtype=torch.bfloat16):
            torch.testing.assert_close(attn(x), sdpa.detach(), atol=3e-2, rtol=3e-2)
    assert calls == [1, 1]


def test_bf16_attention_weights_are_the_fp32_softmax_rounded_once():
    """On CPU in bf16 the explicit path takes bf16's softmax kernel, which must compute in fp32 and
    round once: the same weights as the fp32 softmax rounded to bf16, bar the last bit of a few
    (867 of 107 million entries measured), and rows that sum to 1 as closely."""
    torch.manual_seed(0)
    attn = make_attention(192, 3)
    x = torch.randn(8, 65, 192) * 3  # sharp and flat rows
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        _, weights = explicit_attention(attn, x)
        q, k, _ = rearrange(attn.qkv(x), "b n (three h d) -> three b h n d", three=3, h=3)
        scores = (q @ k.transpose(-2, -1)) * attn.scale
    assert weights.dtype == scores.dtype == torch.bfloat16
    rounded = scores.softmax(dim=-1, dtype=torch.float32).to(torch.bfloat16)
    step = torch.finfo(torch.bfloat16).eps * rounded.float().abs()  # one bf16 step, relative
    assert ((weights.float() - rounded.float()).abs() <= step).all()
    assert (weights == rounded).float().mean() > 0.999
    sums = weights.float().sum(-1)
    assert (sums - 1).abs().max() <= (rounded.float().sum(-1) - 1).abs().max() + 1e-2
