"""The hook points every looking-inside tool reads and writes (`vit.interpret.hooks`), against what
the model computes without them: what a point records is what the next step reads, writing a point
changes what follows and nothing before, and every switch is put back, also after an error."""

import pytest
import torch

from vit.interpret.hooks import (
    device_of,
    explicit_attention,
    hooks,
    model_outputs,
    on_heads,
    on_mlp,
    on_residual,
    record_attention,
    recorders,
)
from vit.model import ViT


def tiny(**options) -> ViT:
    torch.manual_seed(0)
    return ViT(num_classes=3, image_size=(8, 12), patch_size=4, dim=16, depth=2, heads=2, **options).eval()


def test_each_point_records_what_the_model_computes_there():
    """The residual stream is the embeddings plus every block's attention and MLP branches: the
    recorded points add up to it, block by block, and the last one read by the head gives the logits."""
    model, images = tiny(layer_scale=0.5), torch.rand(3, 3, 8, 12)  # ls2 scales the MLP branch
    pairs, found = recorders(model, "embeddings", "heads", "mlp", "residual")
    with torch.no_grad(), hooks(*pairs):
        logits = model(images)
    assert [len(x) for x in found.values()] == [1, 2, 2, 2]
    stream, residual = found["embeddings"][0], found["residual"]
    for block, z, m, out in zip(model.blocks, found["heads"], found["mlp"], residual, strict=True):
        attention = block.ls1(block.attn.proj(z))  # the heads' outputs, projected: the attention branch
        torch.testing.assert_close(stream + attention + m, out)
        stream = out
    torch.testing.assert_close(model.forward_head(model.norm(residual[-1])), logits)
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())


def test_writing_a_point_changes_what_follows_it():
    """A function that returns a tensor replaces the point: the identity changes nothing, zeroing
    block 1's heads changes the logits but not block 0's output; the hooks are gone afterwards."""
    model, images = tiny(), torch.rand(2, 3, 8, 12)
    with torch.no_grad():
        intact = model(images)
        with hooks(on_heads(model.blocks[1], lambda z: z.clone())):
            torch.testing.assert_close(model(images), intact)
        before = []
        with hooks(on_heads(model.blocks[1], torch.zeros_like), on_residual(model.blocks[0], before.append)):
            zeroed = model(images)
        assert not torch.allclose(zeroed, intact)
        with hooks(on_residual(model.blocks[0], lambda x: torch.zeros_like(x))):
            assert not torch.allclose(model(images), intact)
        unhooked = []
        with hooks(on_residual(model.blocks[0], unhooked.append)):
            model(images)
        torch.testing.assert_close(before[0], unhooked[0])  # writing block 1 left block 0 as it was
        torch.testing.assert_close(model(images), intact)


def test_an_unknown_point_is_one_line():
    with pytest.raises(ValueError, match="^no hook point 'attn'; choose embeddings, heads, mlp, residual$"):
        recorders(tiny(), "heads", "attn")


def test_hooks_are_removed_when_the_block_raises():
    model = tiny()
    with pytest.raises(RuntimeError, match="stop"), hooks(on_mlp(model.blocks[0], lambda x: None)):
        raise RuntimeError("stop")
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())


def test_explicit_attention_switches_only_inside_and_puts_everything_back():
    """Inside: the chosen layers' explicit path, eval mode, the eager call; outside, whatever was
    there before, even when the block raises; the weights it records are softmax rows."""
    model = tiny()
    model.train()
    model._compiled_call_impl = compiled = object()  # what nn.Module.compile() sets
    with pytest.raises(RuntimeError, match="stop"), explicit_attention(model, [1]):
        assert not model.training and model._compiled_call_impl is None
        assert [block.attn.fused for block in model.blocks] == [True, False]
        raise RuntimeError("stop")
    assert model.training and model._compiled_call_impl is compiled
    assert all(block.attn.fused for block in model.blocks)
    model._compiled_call_impl = None
    with torch.no_grad(), record_attention(model, [0, 1], keep=lambda w: w) as captured:
        logits = model(torch.rand(2, 3, 8, 12))
    assert model.training and all(block.attn.fused for block in model.blocks)
    for layer in (0, 1):
        (weights,) = captured[layer]
        assert weights.shape == (2, 2, 7, 7)  # batch, heads, tokens (class token and 6 patches)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 7))
    assert logits.shape == (2, 3)


def test_model_outputs_are_the_logits_in_chunks_on_the_cpu():
    model, images = tiny(), torch.rand(5, 3, 8, 12)
    with torch.no_grad():
        whole = model(images)
    torch.testing.assert_close(model_outputs(model, images, batch_size=2), whole)
    assert device_of(model) == torch.device("cpu") and device_of(torch.nn.ReLU()) == torch.device("cpu")
