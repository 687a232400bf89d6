"""`vit-export` writes a checkpoint's ViT as model.safetensors + config.json (no pickle), and
`vit.load_pretrained` reads the folder back into the same model."""

import json

import pytest
import torch
from helpers import command_error

from vit import CNNClassifier, ViT, load_pretrained
from vit.commands.export import main
from vit.export import read_folder


@pytest.mark.slow
def test_export_and_load_back(trained, trained_checkpoint, tmp_path, capsys):
    model, data = trained
    out = tmp_path / "exported"
    main(["--ckpt", str(trained_checkpoint), "--out", str(out), "--onnx"])
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.onnx", "model.safetensors"]
    assert "wrote config.json, model.safetensors, model.onnx" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["format"] == "vit.ViT" and config["model"]["depth"] == 2
    assert config["preparation"]["classes"] == list(data.classes)  # from the checkpoint's data module
    loaded = load_pretrained(str(out))
    assert isinstance(loaded, ViT) and not loaded.training
    images = data.split("test")[:8][0]
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), model.model(images), atol=1e-6, rtol=0)
    _, preparation = read_folder(out)
    assert preparation == data.preparation


def test_a_model_with_registers_and_normalisation_round_trips(tmp_path):
    """Every option in config.json: a ViT of another layout, non-square, no head, comes back equal."""
    from vit.export import save_folder
    from vit.preparation import Preparation

    torch.manual_seed(0)
    options = dict(num_registers=2, no_embed_class=True, layer_scale=0.5, mean=(0.5,) * 3, std=(0.25,) * 3)
    options |= dict(conv_stem=(4, 8))
    model = ViT(num_classes=0, image_size=(16, 24), patch_size=8, dim=32, depth=1, heads=2, **options).eval()
    for norm in (model.stem[1], model.stem[4]):  # BatchNorm's running statistics are weights too
        norm.running_mean.uniform_(-1, 1), norm.running_var.uniform_(0.5, 2)
    save_folder(model, Preparation(3, (16, 24), classes=()), tmp_path)
    images = torch.rand(2, 3, 16, 24)
    with torch.no_grad():
        torch.testing.assert_close(load_pretrained(str(tmp_path))(images), model(images), atol=0, rtol=0)


def test_bad_input_is_one_line(trained_checkpoint, tmp_path, capsys):
    (tmp_path / "file.txt").write_text("the user's")
    cnn = CNNClassifier(num_classes=4, in_channels=1, receptive_field=3, width=4)
    torch.save(
        {
            "state_dict": cnn.state_dict(),
            "hyper_parameters": {**cnn.hparams, "_class_path": "vit.CNNClassifier"},
        },
        tmp_path / "cnn.ckpt",
    )
    for args, status, message in (
        (["--ckpt", trained_checkpoint, "--out", tmp_path / "file.txt"], 2, "is a file, not a folder"),
        (["--ckpt", tmp_path / "cnn.ckpt", "--out", tmp_path / "out"], 1, "holds a BagCNN, not a ViT"),
        (["--ckpt", tmp_path / "missing.ckpt", "--out", tmp_path / "out"], 1, "checkpoint not found"),
        (["--out", tmp_path / "out"], 2, "the following arguments are required: ckpt"),
    ):
        code, error = command_error(main, args, capsys)
        assert code == status and message in error
    assert not (tmp_path / "out").exists() and (tmp_path / "file.txt").read_text() == "the user's"


@pytest.mark.parametrize(
    "options",
    [
        {},  # plain
        dict(num_registers=2, no_embed_class=True),  # registers
        # shaped like configs/cifar10_cpu.yaml: shifted patches pad by negative amounts, locality
        # attention masks the diagonal
        dict(shifted_patches=True, locality_attention=True, patch_norm=True, pool="mean", mlp_ratio=2.0),
        dict(conv_stem=(16, 32), locality_attention=True, patch_norm=True, pool="mean"),  # a conv stem
    ],
)
@pytest.mark.slow
def test_onnx_export_runs_in_onnxruntime_as_in_pytorch(tmp_path, options):
    import onnxruntime

    from vit.export import save_onnx

    torch.manual_seed(0)
    model = ViT(num_classes=10, image_size=32, patch_size=4, dim=64, depth=2, heads=4, **options).eval()
    save_onnx(model, tmp_path / "model.onnx")
    images = torch.rand(5, 3, 32, 32)  # another batch size than the export's
    [got] = onnxruntime.InferenceSession(str(tmp_path / "model.onnx")).run(None, {"images": images.numpy()})
    with torch.no_grad():
        expected = model(images).numpy()
    assert got.shape == (5, 10) and abs(got - expected).max() <= 1e-4
