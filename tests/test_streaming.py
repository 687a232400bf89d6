"""Image folders as streaming chunks: `vit.streaming.write_chunks` and `vit-chunks`. The chunks
hold each file's bytes as they are and its label; bad input is one line and leaves no folder."""

import json
from pathlib import Path

import pytest
import torch
from helpers import command_error, make_folders, tiny_args

pytest.importorskip("litdata")

from vit.commands.chunks import main  # noqa: E402
from vit.streaming import FORMAT, read_manifest, write_chunks  # noqa: E402


def streamed(folder: Path) -> list[tuple[bytes, int]]:
    """Every item of a split's chunks, as litdata streams them: (file bytes, label)."""
    from litdata import StreamingDataset

    dataset = StreamingDataset(str(folder))
    return [(bytes(item["image"]), int(item["label"])) for item in (dataset[i] for i in range(len(dataset)))]


def files_of(split: Path, classes: list[str]) -> list[tuple[bytes, int]]:
    return [
        (path.read_bytes(), c) for c, name in enumerate(classes) for path in sorted((split / name).iterdir())
    ]


def test_the_chunks_hold_every_file_as_it_is_with_its_label(tmp_path, capsys):
    root = make_folders(tmp_path / "data", per_class={"train": 4, "val": 2, "test": 3})
    manifest = write_chunks(root, tmp_path / "chunks", chunk_bytes=256)  # several chunks a split
    out = tmp_path / "chunks"
    assert manifest == read_manifest(out) == json.loads((out / "vit.json").read_text())
    assert manifest["format"] == FORMAT and manifest["classes"] == ["ant", "bee", "cat"]
    assert manifest["images"] == {"train": 12, "val": 6, "test": 9} and manifest["skipped"]["train"] == []
    for split in ("train", "val", "test"):
        assert sorted(streamed(out / split)) == sorted(files_of(root / split, manifest["classes"]))
    assert len(list((out / "train").glob("*.bin"))) > 1
    assert "wrote the chunks of train 12, val 6, test 9 images into" in capsys.readouterr().out
    assert {p.name for p in tmp_path.iterdir()} == {"data", "chunks"}  # no partial folder left beside it


def test_classes_given_set_the_labels(tmp_path):
    root = make_folders(tmp_path / "data", per_class={"train": 2})
    manifest = write_chunks(root, tmp_path / "chunks", classes=["cat", "ant", "bee"])
    assert manifest["classes"] == ["cat", "ant", "bee"] and list(manifest["images"]) == ["train", "val"]
    found = streamed(tmp_path / "chunks" / "train") + streamed(tmp_path / "chunks" / "val")
    assert sorted(found) == sorted(files_of(root / "train", ["cat", "ant", "bee"]))


def test_a_bad_image_is_named_or_skipped(tmp_path, capsys):
    root = make_folders(tmp_path / "data", per_class={"train": 3})
    bad = root / "train" / "bee" / "01.png"
    bad.write_bytes(bad.read_bytes()[:40])  # truncated: it opens, and fails to decode
    status, error = command_error(main, ["--root", root, "--out", tmp_path / "chunks"], capsys)
    assert status == 1 and f"cannot read image {bad}" in error and "--on_bad_file skip" in error
    assert not (tmp_path / "chunks").exists()
    manifest = write_chunks(root, tmp_path / "chunks", on_bad_file="skip")
    assert manifest["images"]["train"] + manifest["images"]["val"] == 8
    assert manifest["skipped"]["train"][0].startswith(str(bad))
    assert "warning: skipped 1 unreadable files" in capsys.readouterr().out
    kept = streamed(tmp_path / "chunks" / "train") + streamed(tmp_path / "chunks" / "val")
    assert bad.read_bytes() not in {image for image, _ in kept}


@pytest.mark.parametrize(
    "layout, options, message, status",
    [
        ({}, [], "image folder not found: {root}/train", 1),
        ({"train": ["ant", "bee"], "test": ["ant"]}, [], "{root}/test must have the class folders of", 1),
        ({"train": ["ant"], "empty": True}, [], "no files in the class folders of {root}/train", 1),
        ({"train": ["ant"]}, ["--on_bad_file", "ignore"], "invalid choice", 2),
        ({"train": ["ant"], "out exists": True}, [], "{out} already exists", 2),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, layout, options, message, status):
    root, out = tmp_path / "data", tmp_path / "chunks"
    root.mkdir()
    for split in ("train", "test"):
        for name in layout.get(split, []):
            make_folders(root, classes=(name,), per_class={split: 0 if layout.get("empty") else 1})
            (root / split / name).mkdir(parents=True, exist_ok=True)
    if layout.get("out exists"):
        out.mkdir()
    found, error = command_error(main, ["--root", root, "--out", out, *options], capsys)
    assert found == status and message.format(root=root, out=out) in error, error
    assert out.exists() == bool(layout.get("out exists")) and not list(tmp_path.glob(".chunks.partial*"))


def test_a_chunk_folder_of_another_format_or_none_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="chunk folder .*missing: no such folder"):
        read_manifest(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no vit.json: not written by vit-chunks"):
        read_manifest(tmp_path)
    (tmp_path / "vit.json").write_text(json.dumps({"format": "vit-chunks-0"}))
    with pytest.raises(ValueError, match="holds chunks of format 'vit-chunks-0', not 'vit-chunks-1'"):
        read_manifest(tmp_path)


def test_a_run_stopped_while_writing_leaves_no_folder(tmp_path, monkeypatch):
    """The chunks go to a hidden folder first: a failure in the middle (here: the second split)
    removes it, and `out` never appears."""
    import vit.streaming

    root = make_folders(tmp_path / "data", per_class={"train": 4, "test": 1})
    real, calls = vit.streaming.write_split, []

    def fail_third(folder, *args):
        calls.append(folder)
        if len(calls) == 3:  # train, val (held out), then test
            raise OSError("disk full")
        return real(folder, *args)

    monkeypatch.setattr(vit.streaming, "write_split", fail_third)
    with pytest.raises(OSError, match="disk full"):
        write_chunks(root, tmp_path / "chunks")
    assert [folder.name for folder in calls] == ["train", "val", "test"]
    assert calls[0].parent.name.startswith(".chunks.partial") and calls[0].parent.parent == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_without_a_val_folder_the_val_chunks_are_held_out_of_train(tmp_path):
    root = make_folders(tmp_path / "data", per_class={"train": 10})
    manifest = write_chunks(root, tmp_path / "chunks", val_size=0.2, seed=3)
    assert manifest["images"] == {"train": 24, "val": 6} and "val_size 0.2, seed 3" in manifest["val"]
    train, val = (set(streamed(tmp_path / "chunks" / s)) for s in ("train", "val"))
    assert not train & val and train | val == set(files_of(root / "train", manifest["classes"]))


def test_streamed_splits_are_the_folders_prepared_as_image_folders_prepares_them(tmp_path):
    """The same pixels and labels as `ImageFolders` reads from the files (compared as sorted
    pairs: the chunks keep their own order), and uint8 batches out of the training loader."""
    from vit.datamodules import ImageFolders
    from vit.streaming import StreamingImages

    root = make_folders(tmp_path / "data", per_class={"train": 4, "val": 2, "test": 3})
    write_chunks(root, tmp_path / "chunks")
    options = dict(image_size=12, channels=1, resize="center_crop", batch_size=4)
    folders, chunks = ImageFolders(str(root), **options), StreamingImages(str(tmp_path / "chunks"), **options)
    assert chunks.classes == folders.classes and chunks.preparation == folders.preparation

    def pairs(split):
        return sorted(zip(split.labels.tolist(), split.images.flatten(1).tolist(), strict=True))

    for name in ("val", "test"):
        assert pairs(chunks.split(name)) == pairs(folders.split(name))
    batches = list(chunks.train_dataloader())
    assert [len(labels) for _, labels in batches] == [4, 4, 4]  # 12 images, full batches
    images = torch.cat([images for images, _ in batches])
    labels = torch.cat([labels for _, labels in batches])
    assert images.dtype == torch.uint8 and images.shape == (12, 1, 12, 12)
    train = folders.split("train")
    assert sorted(zip(labels.tolist(), images.flatten(1).tolist(), strict=True)) == sorted(
        zip(train.labels.tolist(), train.images.flatten(1).tolist(), strict=True)
    )


def test_vit_train_fits_on_streamed_chunks_and_vit_eval_reads_them(tmp_path):
    from vit.commands import eval, train

    root = make_folders(tmp_path / "data", per_class={"train": 8, "test": 2})
    write_chunks(root, tmp_path / "chunks")
    runs = tmp_path / "runs"
    data = ["--data", "vit.streaming.StreamingImages", "--data.root", str(tmp_path / "chunks")]
    train.main(["fit", *tiny_args(runs, *data, "--data.image_size", "16", "--data.batch_size", "8")])
    ckpt = runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    recorded = torch.load(ckpt, weights_only=True)["datamodule_hyper_parameters"]
    assert recorded["_class_path"] == "vit.streaming.StreamingImages"
    assert recorded["classes"] == ["ant", "bee", "cat"]
    eval.main(["--ckpt", ckpt, "--datamodule", "vit.streaming.StreamingImages", "--out", tmp_path / "eval"])
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["num_images"] == 6 and metrics["data_module"] == "StreamingImages"
    from vit.streaming import StreamingImages

    with pytest.raises(
        ValueError, match=r"have the classes \['ant', 'bee', 'cat'\], not \['bee', 'ant', 'cat'\]"
    ):
        StreamingImages(str(tmp_path / "chunks"), classes=["bee", "ant", "cat"])  # another checkpoint's
    root = make_folders(tmp_path / "train only", per_class={"train": 2})
    write_chunks(root, tmp_path / "train only chunks")
    with pytest.raises(FileNotFoundError, match="train only chunks have no test split"):
        StreamingImages(str(tmp_path / "train only chunks")).test_dataloader()
