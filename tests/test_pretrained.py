"""`vit.load_pretrained` builds, from timm's and transformers' models, a `ViT` whose outputs equal
the source's.

No network: the source models are timm's own, built with random weights and then perturbed away
from timm's initialisation (which zeroes biases and starts tokens near zero, and would hide a
wrong mapping), saved to a file and loaded from it."""

import json

import pytest
import timm
import torch
from helpers import UnsafePayload, command_error, write_image
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed

from vit import load_pretrained
from vit.errors import UsageError
from vit.model import resample_pos_embed
from vit.preparation import Preparation
from vit.pretrained import load_source

MEAN, STD = [0.4, 0.5, 0.6], [0.2, 0.3, 0.25]


def perturbed_weights(model: torch.nn.Module, path, seed: int = 0):
    """Every parameter of `model` plus noise, saved to `path` (safetensors); the model keeps them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def source_output(model, images):
    """What timm computes for images in [0, 1]: its model on the normalised images."""
    cfg = model.pretrained_cfg
    mean, std = (torch.tensor(cfg[k])[:, None, None] for k in ("mean", "std"))
    with torch.no_grad():
        return model.eval()((images - mean) / std)


@pytest.mark.parametrize(
    "name",
    [
        "vit_tiny_patch16_224",  # a class token and an ImageNet head
        "vit_small_patch16_224.dino",  # no head: the normed class token
        "deit_tiny_distilled_patch16_224",  # a distillation token and its head, averaged
        "vit_small_patch14_dinov2",  # LayerScale, 518 px, no head
        "vit_small_patch14_reg4_dinov2",  # 4 registers, positions on the patches only
        "vit_little_patch16_reg4_gap_256",  # no class token, registers, average pooling, fc_norm
        "vit_medium_patch16_gap_256",  # no class token, average pooling, final norm before it
    ],
)
@pytest.mark.slow
def test_timm_models_give_the_same_outputs(tmp_path, name):
    source = timm.create_model(name, pretrained=False)
    weights = perturbed_weights(source, tmp_path / "weights.safetensors")
    ours = load_pretrained(f"timm:{name}", weights=weights)
    size = source.patch_embed.img_size
    images = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(1))
    expected = source_output(source, images)
    with torch.no_grad():
        got = ours(images)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= 1e-4


def test_a_pth_state_dict_loads_too_and_the_head_is_read_from_the_file(tmp_path):
    source = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=7)
    perturbed_weights(source, tmp_path / "unused.safetensors")
    torch.save({"model": source.state_dict()}, tmp_path / "weights.pth")
    ours = load_pretrained("timm:vit_tiny_patch16_224", weights=tmp_path / "weights.pth")
    images = torch.rand(3, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = ours(images)
    assert got.shape == (3, 7) and (got - source_output(source, images)).abs().max() <= 1e-4
    # images come in [0, 1]: the normalisation is the model's, in buffers outside the state dict
    assert ours.mean.flatten().tolist() == [0.5] * 3 and "mean" not in ours.state_dict()


@pytest.mark.parametrize(
    "name, feature",
    [
        ("vit_base_patch16_siglip_224", "has attention pooling"),
        ("vit_base_patch16_rope_224", "is a Eva, not a VisionTransformer"),
    ],
)
@pytest.mark.slow
def test_features_vit_cannot_express_are_refused_by_name(tmp_path, name, feature):
    weights = tmp_path / "w.safetensors"
    save_file(
        {k: v.contiguous() for k, v in timm.create_model(name, pretrained=False).state_dict().items()},
        str(weights),
    )
    with pytest.raises(UsageError, match=f"timm:{name} {feature}"):
        load_pretrained(f"timm:{name}", weights=weights)


@pytest.mark.parametrize("prefix", [0, 1, 5])
@pytest.mark.parametrize("new_grid", [(20, 20), (12, 18)])
def test_position_embeddings_are_resampled_as_timm_does(prefix, new_grid):
    table = torch.randn(1, prefix + 14 * 14, 32, generator=torch.Generator().manual_seed(0))
    expected = resample_abs_pos_embed(table, list(new_grid), (14, 14), num_prefix_tokens=prefix)
    got = resample_pos_embed(table, new_grid, (14, 14), prefix)
    assert got.shape == (1, prefix + new_grid[0] * new_grid[1], 32)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_a_model_takes_another_image_size(tmp_path):
    """set_image_size resamples the positions: the model then equals timm's built for that size
    with the same weights (timm resamples them when it loads them into another size)."""
    source = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False)
    weights = perturbed_weights(source, tmp_path / "w.safetensors")
    ours = load_pretrained("timm:vit_small_patch14_reg4_dinov2", weights=weights)
    ours.set_image_size((224, 280))
    other = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, img_size=(224, 280))
    state = dict(source.state_dict())
    state["pos_embed"] = resample_abs_pos_embed(state["pos_embed"], [16, 20], (37, 37), num_prefix_tokens=0)
    other.load_state_dict(state)
    images = torch.rand(2, 3, 224, 280, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (ours(images) - source_output(other, images)).abs().max() <= 1e-4


def test_bad_input_is_one_line(tmp_path):
    torch.save({"head.weight": UnsafePayload(tmp_path / "marker")}, tmp_path / "evil.pth")
    (tmp_path / "notes.safetensors").write_text("not weights")
    small = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3)
    save_file(
        {k: v for k, v in small.state_dict().items() if "blocks.11" not in k},
        str(tmp_path / "cut.safetensors"),
    )
    for source, weights, error, message in (
        ("timm:no_such_vit", None, UsageError, "timm has no model 'no_such_vit'"),
        ("hub:vit", None, UsageError, "unknown model source 'hub:vit'"),
        ("timm:vit_tiny_patch16_224", tmp_path / "evil.pth", ValueError, "refusing"),
        ("timm:vit_tiny_patch16_224", tmp_path / "notes.safetensors", ValueError, "is not a weights file"),
        ("timm:vit_tiny_patch16_224", tmp_path / "cut.safetensors", ValueError, "Missing key.*blocks.11"),
        ("timm:vit_tiny_patch16_224", tmp_path / "missing.pth", FileNotFoundError, "weights not found"),
    ):
        with pytest.raises(error, match=message) as caught:
            load_pretrained(source, weights=weights)
        assert "\n" not in str(caught.value)
    assert not (tmp_path / "marker").exists()


@pytest.mark.slow
def test_timm_imagenet_heads_come_with_imagenet_class_names(tmp_path):
    source = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    weights = perturbed_weights(source, tmp_path / "w.safetensors")
    _, preparation = load_source("timm:vit_tiny_patch16_224", weights=weights)
    assert len(preparation.classes) == 1000 and preparation.classes[0] == "tench"
    assert preparation.class_ids[:2] == ("n01440764", "n01443537")
    # "crane" names a bird and a machine: each says its synset
    assert [name for name in preparation.classes if name.startswith("crane")] == [
        "crane (n02012849)", "crane (n03126707)"
    ]  # fmt: skip
    assert preparation.size == (224, 224) and preparation.resize == "center_crop"
    headless = timm.create_model("vit_small_patch16_224.dino", pretrained=False)
    weights = perturbed_weights(headless, tmp_path / "dino.safetensors")
    assert load_source("timm:vit_small_patch16_224.dino", weights=weights)[1].classes == ()


def hf_source(tmp_path, architecture: str, crop: bool = False):
    """A small random transformers model of `architecture`, perturbed, saved with an image
    processor (mean/std) by save_pretrained into a folder."""
    import transformers

    if architecture.startswith("Dinov2"):
        config = transformers.Dinov2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    else:
        config = transformers.ViTConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
            layer_norm_eps=1e-12, num_labels=5, id2label={i: f"kind {i}" for i in range(5)},
        )  # fmt: skip
    config.image_size, config.patch_size = 48, 8
    model = getattr(transformers, architecture)(config).eval()
    perturbed_weights(model, tmp_path / "unused.safetensors")
    folder = tmp_path / architecture
    model.save_pretrained(folder)
    size = {"height": 48, "width": 48}
    processor = transformers.ViTImageProcessor(image_mean=MEAN, image_std=STD, size=size)
    if crop:
        processor = transformers.BitImageProcessor(image_mean=MEAN, image_std=STD, crop_size=48)
    processor.save_pretrained(folder)
    return model, folder


def hf_output(model, images):
    """What transformers computes for images in [0, 1]: logits, or (no head) the normed class token."""
    mean, std = (torch.tensor(v)[:, None, None] for v in (MEAN, STD))
    with torch.no_grad():
        output = model(pixel_values=(images - mean) / std)
    return output.logits if hasattr(output, "logits") else output.last_hidden_state[:, 0]


@pytest.mark.parametrize("architecture", ["ViTForImageClassification", "ViTModel", "Dinov2Model"])
def test_transformers_models_give_the_same_outputs(tmp_path, architecture):
    model, folder = hf_source(tmp_path, architecture, crop=architecture == "Dinov2Model")
    ours, preparation = load_source(f"hf:{folder}")
    images = torch.rand(2, 3, 48, 48, generator=torch.Generator().manual_seed(4))
    expected = hf_output(model, images)
    with torch.no_grad():
        got = ours(images)
    assert got.shape == expected.shape and (got - expected).abs().max() <= 1e-4
    assert preparation.size == (48, 48)
    if architecture == "ViTForImageClassification":
        assert preparation.classes == tuple(f"kind {i}" for i in range(5))
        assert preparation.resize == "stretch" and ours.norm.eps == 1e-12
    else:
        assert preparation.classes == ()
    if architecture == "Dinov2Model":
        assert preparation.resize == "center_crop"  # DINOv2's processor crops
        assert torch.equal(ours.blocks[1].ls2.gamma, model.encoder.layer[1].layer_scale2.lambda1)


def test_transformers_weights_from_a_file_and_bad_input(tmp_path):
    import transformers

    model, folder = hf_source(tmp_path, "Dinov2Model")
    # the weights without Dinov2's mask_token (used only in masked training): not missing
    state = {k: v.contiguous() for k, v in model.state_dict().items() if "mask_token" not in k}
    save_file(state, str(tmp_path / "dinov2.safetensors"))
    ours = load_pretrained(f"hf:{folder}", weights=tmp_path / "dinov2.safetensors")
    images = torch.rand(1, 3, 48, 48, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert (ours(images) - hf_output(model, images)).abs().max() <= 1e-4
    del state["layernorm.weight"]
    save_file(state, str(tmp_path / "cut.safetensors"))
    other = transformers.Dinov2ForImageClassification(model.config)
    other.config.architectures = ["Dinov2ForImageClassification"]
    other.save_pretrained(tmp_path / "other")
    transformers.ViTImageProcessor().save_pretrained(tmp_path / "other")
    for source, weights, error, message in (
        (f"hf:{folder}", tmp_path / "cut.safetensors", ValueError, "does not fit .*missing layernorm.weight"),
        (f"hf:{tmp_path / 'other'}", None, UsageError, "is a Dinov2ForImageClassification; vit.ViT reads"),
        (f"hf:{tmp_path / 'nothing'}", None, ValueError, "cannot read the config and image processor"),
    ):
        with pytest.raises(error, match=message) as caught:
            load_pretrained(source, weights=weights)
        assert "\n" not in str(caught.value)


# Using imported models: vit-eval and vit-attention with --model


@pytest.fixture(scope="module")
def tiny_timm(tmp_path_factory):
    """timm's vit_tiny_patch16_224 (an ImageNet head), perturbed, as a weights file."""
    folder = tmp_path_factory.mktemp("timm")
    source = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    return source.eval(), perturbed_weights(source, folder / "vit_tiny.safetensors")


@pytest.mark.slow
def test_vit_eval_measures_an_imported_model_on_a_subset_of_its_classes(tiny_timm, tmp_path, capsys):
    """Class folders named by ImageNet synsets or class names, a few of the model's 1000 classes;
    a prediction of any other class is wrong."""
    from vit.commands import eval as vit_eval
    from vit.preparation import read_images

    source, weights = tiny_timm
    _, preparation = load_source("timm:vit_tiny_patch16_224", weights=weights)
    pictures = []
    for j in range(6):
        pictures.append(tmp_path / "pictures" / f"{j}.png")
        write_image(pictures[-1], 40 * j, "RGB", (300, 240))
    predicted = source_output(source, read_images(pictures, preparation)).argmax(-1).tolist()
    # the first two pictures in the folder of the first one's predicted class (by its synset):
    # at least one right; the others in folders named "tench" and "goldfish"
    names = [preparation.class_ids[predicted[0]]] * 2 + ["tench"] * 2 + ["goldfish"] * 2
    for picture, name in zip(pictures, names, strict=True):
        (tmp_path / "val" / name).mkdir(parents=True, exist_ok=True)
        picture.rename(tmp_path / "val" / name / picture.name)
    labels = [predicted[0]] * 2 + [0, 0, 1, 1]
    model = ["--model", "timm:vit_tiny_patch16_224", "--weights", weights]
    vit_eval.main([*model, "--data", f"root={tmp_path / 'val'}", "--out", tmp_path / "eval"])
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    right = [p == label for p, label in zip(predicted, labels, strict=True)]
    assert metrics["num_images"] == 6 and metrics["num_classes"] == 1000
    assert metrics["top1"] == pytest.approx(sum(right) / 6) and metrics["top1"] >= 1 / 6
    present = sorted({0, 1, predicted[0]})
    assert list(metrics["per_class"]) == [preparation.classes[i] for i in present]
    confusion = torch.tensor(metrics["confusion_matrix"])  # a row per class present, + "other"
    assert confusion.shape == (len(present), len(present) + 1)
    assert metrics["confusion_columns"][-1] == "other"
    assert int(confusion[:, -1].sum()) == sum(p not in present for p in predicted)
    assert (tmp_path / "eval" / "confusion.png").is_file()
    assert "model           timm:vit_tiny_patch16_224" in capsys.readouterr().out

    write_image(tmp_path / "val" / "n99999999" / "0.png", 10, "RGB", (32, 32))
    status, line = command_error(vit_eval.main, [*model, "--data", f"root={tmp_path / 'val'}"], capsys)
    assert status == 2 and "the model has no class 'n99999999'" in line

    files = [tmp_path / "val" / "tench" / "2.png", tmp_path / "val" / "goldfish" / "4.png"]
    out = vit_eval.predict(
        vit_eval.PredictOptions(images=files, top_k=2, model="timm:vit_tiny_patch16_224", weights=weights)
    )
    assert [r["top_k"][0]["class"] for r in out] == [preparation.classes[predicted[i]] for i in (2, 4)]
    for args, message in (
        ([*model, "--ckpt", weights], "give a checkpoint (--ckpt) or a model (--model), one of them"),
        (["--ckpt", weights, "--weights", weights], "--weights goes with --model"),
        ([*model, "--split", "val", "--data", "root=x"], "with --model, give the images as --data root="),
    ):
        status, line = command_error(vit_eval.main, args, capsys)
        assert status == 2 and message in line


@pytest.mark.parametrize("method", ["cls", "query", "rollout", "grad-rollout"])
def test_vit_attention_draws_an_imported_model_with_registers(tmp_path, capsys, method):
    """DINOv2 with registers, made small through timm's own overrides and exported: every method
    draws maps over the patches only, and cls and query report the registers' share."""
    from vit.commands import attention as vit_attention
    from vit.export import save_folder
    from vit.pretrained import _from_timm

    source = timm.create_model(
        "vit_small_patch14_reg4_dinov2", pretrained=False, img_size=(56, 70), depth=2, num_classes=3
    )
    perturbed_weights(source, tmp_path / "unused.safetensors")
    ours = _from_timm(source, "small vit_small_patch14_reg4_dinov2")
    save_folder(ours, Preparation(3, (56, 70), classes=("a", "b", "c")), tmp_path / "reg4")
    write_image(tmp_path / "photos" / "a.png", 90, "RGB", (100, 80))
    args = ["--model", tmp_path / "reg4", "--images", tmp_path / "photos", "--method", method]
    if method == "query":
        args += ["--query-patch", "2,3"]
    vit_attention.main([*args, "--out", tmp_path / "out"])
    printed = capsys.readouterr().out
    name = "query_2_3" if method == "query" else method.replace("-", "_")
    assert (tmp_path / "out" / f"{name}.png").is_file()
    assert ("of its attention in layer 1 to the 4 register tokens" in printed) == (method in ("cls", "query"))


def test_vit_attention_reads_timm_weights(tiny_timm, tmp_path, capsys):
    from vit.commands import attention as vit_attention

    _, weights = tiny_timm
    write_image(tmp_path / "photos" / "a.png", 90, "RGB", (300, 200))
    model = ["--model", "timm:vit_tiny_patch16_224", "--weights", weights]
    vit_attention.main([*model, "--images", tmp_path / "photos", "--layer", "-1", "--out", tmp_path / "out"])
    assert "wrote" in capsys.readouterr().out and (tmp_path / "out" / "cls.png").is_file()
    status, line = command_error(vit_attention.main, model, capsys)
    assert status == 2 and "--model has no test set: give image files with --images" in line


def test_without_network_or_weights_the_error_says_how_to_give_a_file(monkeypatch):
    """On a machine without network, timm cannot fetch weights: one line that names weights=FILE
    (timm's own download is replaced by its failure here, so the test needs no network)."""
    real = timm.create_model

    def offline(name, pretrained=False, **kwargs):
        if pretrained:
            raise OSError("We couldn't connect to 'https://huggingface.co' to load the files\nretry later")
        return real(name, pretrained=False, **kwargs)

    monkeypatch.setattr(timm, "create_model", offline)
    with pytest.raises(ValueError, match="cannot fetch the weights of timm:vit_tiny_patch16_224") as caught:
        load_pretrained("timm:vit_tiny_patch16_224")
    assert "give a file with weights=FILE" in str(caught.value) and "\n" not in str(caught.value)
