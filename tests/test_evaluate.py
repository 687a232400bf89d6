"""`vit-eval` on a tiny trained checkpoint: the figures, the files, the data overrides, predict on
image files, and the refusal of an unsafe checkpoint."""

import json

import lightning as L
import numpy as np
import pytest
import torch
from helpers import UnsafePayload, command_error
from PIL import Image

from vit import CNNClassifier, TwoCircles
from vit.checkpoint import load_checkpoint
from vit.commands.base import parse_data_options
from vit.commands.eval import EvalOptions, evaluate, main
from vit.preparation import prepare

PNG = b"\x89PNG"


def run(*args) -> None:
    main([str(a) for a in args])


def test_eval_writes_its_files_and_measures_what_lightning_test_measures(
    trained_checkpoint, tmp_path, capsys
):
    out = tmp_path / "eval"
    run("--ckpt", trained_checkpoint, "--out", out)
    assert {p.name for p in out.iterdir()} == {"metrics.json", "confusion.png", "reliability.png"}
    assert (out / "confusion.png").read_bytes()[:4] == PNG and (out / "reliability.png").read_bytes()[
        :4
    ] == PNG
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["checkpoint"] == str(trained_checkpoint) and metrics["split"] == "test"
    assert metrics["tta"] is False and metrics["data_overrides"] == {} and metrics["num_images"] == 64
    assert "top5" not in metrics  # 4 classes
    assert 0.0 <= metrics["top1"] <= 1.0 and 0.0 <= metrics["ece"] <= 1.0 and metrics["nll"] > 0

    # the same checkpoint through the Lightning test loop that `vit-train test` runs
    classifier, datamodule = load_checkpoint(trained_checkpoint)
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    [logged] = trainer.test(classifier, datamodule=datamodule, verbose=False)
    assert metrics["top1"] == pytest.approx(logged["test/acc"], abs=1e-6)

    labels = datamodule.splits["test"].labels
    confusion = torch.tensor(metrics["confusion_matrix"])
    images = [row["images"] for row in metrics["per_class"].values()]
    assert confusion.sum(dim=1).tolist() == images == torch.bincount(labels, minlength=4).tolist()
    assert list(metrics["per_class"]) == list(datamodule.classes)
    for i, row in enumerate(metrics["per_class"].values()):
        assert row["accuracy"] == pytest.approx(confusion[i, i].item() / images[i])
    assert metrics["top1"] == pytest.approx(confusion.trace().item() / 64)
    assert sum(metrics["reliability"]["count"]) == 64

    table = capsys.readouterr().out
    assert f"top-1 accuracy  {metrics['top1']:.4f}" in table and "top-5" not in table
    assert all(name in table for name in datamodule.classes) and "wrote metrics.json" in table


def test_data_options_choose_another_test_set(trained_checkpoint, tmp_path):
    out = tmp_path / "far"
    run(
        "--ckpt",
        trained_checkpoint,
        "--data",
        "test_split=far",
        "--data",
        "num_test=40",
        "--tta",
        "--out",
        out,
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["data_overrides"] == {"test_split": "far", "num_test": 40} and metrics["tta"] is True
    assert metrics["tta_level"] == "flip"
    assert metrics["data"]["test_split"] == "far" and metrics["num_images"] == 40
    assert parse_data_options(["separation=[12, 15]", "wrap=false", "root=/a b"]) == {
        "separation": [12, 15],
        "wrap": False,
        "root": "/a b",
    }


def test_translation_tta_is_its_own_option_beside_the_flip(trained_checkpoint, trained, tmp_path, capsys):
    """--tta_translate (or --tta-translate) measures with airbench's six views: what
    `predict_probabilities(tta="flip-translate")` gives; the table and metrics.json say so."""
    from vit.metrics import predict_probabilities

    model, data = trained
    metrics = evaluate(EvalOptions(ckpt=trained_checkpoint, tta_translate=True), progress=False)
    assert metrics["tta"] is True and metrics["tta_level"] == "flip-translate"
    assert "flip and translate TTA" in capsys.readouterr().out
    images, labels = data.splits["test"].images, data.splits["test"].labels
    top1 = (predict_probabilities(model, images, tta="flip-translate").argmax(1) == labels).float().mean()
    assert metrics["top1"] == pytest.approx(float(top1), abs=1e-6)
    run("--ckpt", trained_checkpoint, "--tta-translate", "--out", tmp_path / "eval")
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["tta_level"] == "flip-translate"
    picture = tmp_path / "a.png"
    Image.fromarray((images[0, 0] * 255).round().to(torch.uint8).numpy()).save(picture)
    capsys.readouterr()
    run("predict", "--ckpt", trained_checkpoint, picture, "--tta_translate", "--top_k", "1")
    [result] = json.loads(capsys.readouterr().out)
    expected = predict_probabilities(model, images[:1], tta="flip-translate")[0].max()
    assert result["top_k"][0]["probability"] == pytest.approx(float(expected), abs=1e-3)


def test_validation_split_and_a_cnn_checkpoint(tmp_path, capsys):
    model = CNNClassifier(num_classes=4, in_channels=1, receptive_field=3, width=4)
    data = TwoCircles(num_train=8, num_val=24, num_test=8, batch_size=16)
    path = tmp_path / "cnn.ckpt"
    hparams = {**model.hparams, "_class_path": "vit.classifier.CNNClassifier"}
    datamodule = {**data.hparams, "_class_path": "vit.data.TwoCircles"}
    torch.save(
        {
            "state_dict": model.state_dict(),
            "hyper_parameters": hparams,
            "datamodule_hyper_parameters": datamodule,
        },
        path,
    )
    metrics = evaluate(EvalOptions(ckpt=path, split="val", batch_size=5), progress=False)
    assert metrics["num_images"] == 24 and metrics["split"] == "val"
    assert metrics["data"]["batch_size"] == 5


def test_predict_on_files_of_any_size_and_mode(trained_checkpoint, trained, tmp_path, capsys):
    rng = np.random.default_rng(0)
    files = []
    for name, shape in (("rgb", (40, 50, 3)), ("rgba", (32, 32, 4)), ("grey", (17, 23))):
        files.append(tmp_path / f"{name}.png")
        Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8)).save(files[-1])
    files.append(tmp_path / "palette.png")
    Image.fromarray(rng.integers(0, 255, (64, 48, 3), dtype=np.uint8)).convert("P").save(files[-1])
    assert [Image.open(f).mode for f in files] == ["RGB", "RGBA", "L", "P"]

    run("predict", "--ckpt", trained_checkpoint, *files, "--top-k", "3")
    results = json.loads(capsys.readouterr().out)
    assert [r["file"] for r in results] == [str(f) for f in files]
    classes = list(trained[1].classes)
    for result in results:
        ranked = [c["probability"] for c in result["top_k"]]
        assert len(ranked) == 3 and ranked == sorted(ranked, reverse=True) and sum(ranked) <= 1 + 1e-6
        assert all(classes[c["index"]] == c["class"] for c in result["top_k"])
    run("predict", "--ckpt", trained_checkpoint, files[0])  # top 5 of 4 classes: all of them
    [result] = json.loads(capsys.readouterr().out)
    assert sum(c["probability"] for c in result["top_k"]) == pytest.approx(1.0, abs=1e-5)


def test_the_preparation_gives_what_the_model_sees(trained):
    _, data = trained
    images = data.splits["test"].images[:3]  # (3, 1, 32, 32) in [0, 1]
    pictures = [Image.fromarray((x[0] * 255).round().to(torch.uint8).numpy()) for x in images]
    prepared = prepare(pictures, data.preparation)
    assert prepared.dtype == torch.float32 and prepared.shape == (3, 1, 32, 32)
    assert (prepared - images).abs().max() <= 0.5 / 255 + 1e-6
    big = prepare([pictures[0].resize((96, 96)).convert("RGB")], data.preparation)
    assert big.shape == (1, 1, 32, 32) and 0 <= big.min() and big.max() <= 1


def test_an_unsafe_checkpoint_is_refused_and_its_code_never_runs(tmp_path, capsys):
    marker = tmp_path / "marker"
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {}, "payload": UnsafePayload(marker)}, evil)
    picture = tmp_path / "a.png"
    Image.new("L", (8, 8)).save(picture)
    for args in (["--ckpt", evil, "--out", tmp_path / "out"], ["predict", "--ckpt", evil, picture]):
        status, message = command_error(main, args, capsys)
        assert status == 1 and message == (
            f"error: refusing {evil}: it is not a plain-tensor checkpoint "
            f"(Unsupported global: GLOBAL {open.__module__}.open)"
        )
    assert not marker.exists() and not (tmp_path / "out").exists()
    torch.load(evil, weights_only=False)  # the payload is real: a plain load runs it
    assert marker.exists()


@pytest.mark.parametrize(
    "options, message, status",
    [
        (["--ckpt", "{tmp}/nope.ckpt"], "error: checkpoint not found: {tmp}/nope.ckpt", 1),
        (["--data", "colour=red"], "error: TwoCircles has no option colour; it has image_size, radius,", 2),
        (["--data", "test_split"], "error: --data 'test_split' is not KEY=VALUE", 2),
        (["--data", "test_split=sideways"], "error: unknown test_split 'sideways'", 2),
        (["--data", "separation=5"], "with {'separation': 5}: cannot unpack", 2),
        (["--split", "train"], "error: argument --split: invalid choice: 'train'", 2),
        (["--batch-size", "0"], "error: batch_size=0 must be at least 1", 2),
        (["--out", "{tmp}/file.txt"], "error: --out {tmp}/file.txt is a file, not a folder", 2),
        (["predict", "{tmp}/missing.png"], "error: image not found: {tmp}/missing.png", 1),
        (
            ["predict", "{tmp}/file.txt"],
            "error: cannot read image {tmp}/file.txt: cannot identify image file",
            1,
        ),
        (
            ["predict", "{tmp}/file.txt", "--top-k", "0"],
            "error: top_k=0 and batch_size=64 must be at least 1",
            2,
        ),
        (["predict"], "error: the following arguments are required: images", 2),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    trained_checkpoint, tmp_path, capsys, options, message, status
):
    (tmp_path / "file.txt").write_text("not an image")
    options = [o.replace("{tmp}", str(tmp_path)) for o in options]
    predicting = options[0] == "predict"
    args = (
        ["predict", "--ckpt", trained_checkpoint, *options[1:]]
        if predicting
        else ["--ckpt", trained_checkpoint]
    )
    args += [] if predicting else [*options, *([] if "--out" in options else ["--out", tmp_path / "out"])]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit:
        run(*args)
    output = capsys.readouterr()
    assert exit.value.code == status and output.out == "" and output.err.count("\n") == 1
    assert message.replace("{tmp}", str(tmp_path)) in output.err
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_without_a_data_module(trained, tmp_path, capsys):
    model, _ = trained
    path = tmp_path / "bare.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, path)
    assert "names no data module to evaluate on" in command_error(main, ["--ckpt", path], capsys)[1]
    _, message = command_error(main, ["--ckpt", path, "--data", "seed=1"], capsys)
    assert "names no data module, so there is none to change" in message


def test_a_checkpoint_from_another_version_is_one_line(trained, tmp_path, capsys):
    """A model option or weight this version does not know is named in one line, by vit-eval and
    by vit-attention, and nothing is written."""
    from vit.commands.attention import main as attention_main

    model, _ = trained
    hparams, weights = dict(model.hparams), model.state_dict()
    for name, checkpoint, message in (
        ("option", {"state_dict": weights, "hyper_parameters": {**hparams, "stem": "conv"}},
         "no option stem"),
        ("weight", {"state_dict": {**weights, "model.extra": torch.zeros(1)}, "hyper_parameters": hparams},
         'Unexpected key(s) in state_dict: "model.extra"'),
    ):  # fmt: skip
        path = tmp_path / f"{name}.ckpt"
        torch.save(checkpoint, path)
        for command in (main, attention_main):
            status, error = command_error(command, ["--ckpt", path, "--out", tmp_path / "out"], capsys)
            assert status == 1 and "written by another version of vit?" in error and message in error
            assert not (tmp_path / "out").exists()
