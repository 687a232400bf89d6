"""Image folders as streaming chunks: `vit.chunk_writer.write_chunks` and `vit-chunks`. The chunks
hold each file's bytes as they are and its label; bad input is one line and leaves no folder."""

import io
import json
import shutil
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import (
    SeedEachProcess,
    command_error,
    fit,
    fit_in_two_processes,
    make_folders,
    noise_folders,
    tiny_args,
)
from PIL import Image
from seen import SeenImages, digest

pytest.importorskip("litdata")

from vit.chunk_reader import read_manifest  # noqa: E402
from vit.chunk_writer import FORMAT, write_chunks  # noqa: E402
from vit.commands.chunks import main  # noqa: E402
from vit.preparation import Preparation, to_float  # noqa: E402


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
    assert manifest["val"] == "folder"
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


def test_a_file_that_opens_and_fails_to_decode_is_found_and_all_bad_is_one_line(tmp_path):
    """A JPEG cut in half: its header reads, its pixels do not. Every file bad: nothing to write."""
    root = jpeg_folders(tmp_path / "data")
    cut = root / "train" / "bee" / "3.jpg"
    cut.write_bytes(cut.read_bytes()[: len(cut.read_bytes()) // 2])
    with pytest.raises(ValueError, match=f"cannot read image {cut}"):
        write_chunks(root, tmp_path / "chunks")
    for path in (root / "val").rglob("*.jpg"):
        path.write_bytes(b"not an image")
    with pytest.raises(ValueError, match=f"no readable images in {root / 'val'}"):
        write_chunks(root, tmp_path / "chunks", on_bad_file="skip")
    with pytest.raises(ValueError, match="on_bad_file='ignore' must be 'error' or 'skip'"):
        write_chunks(root, tmp_path / "chunks", on_bad_file="ignore")
    assert not (tmp_path / "chunks").exists()


@pytest.mark.parametrize(
    "layout, options, message, status",
    [
        ({}, [], "image folder not found: {root}/train", 1),
        (
            {"train": ["ant", "bee"], "test": ["ant"]},
            [],
            "{root}/test must have the class folders of {root}/train",
            1,
        ),
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
    (tmp_path / "vit.json").write_text("{format")
    with pytest.raises(ValueError, match=r"vit.json is not JSON \(Expecting property name"):
        read_manifest(tmp_path)
    (tmp_path / "vit.json").write_text(json.dumps({"format": "vit-chunks-0"}))
    with pytest.raises(ValueError, match="holds chunks of format 'vit-chunks-0', not 'vit-chunks-1'"):
        read_manifest(tmp_path)


def test_a_run_stopped_while_writing_leaves_no_folder(tmp_path, monkeypatch):
    """The chunks go to a hidden folder first: a failure in the middle (here: the second split)
    removes it, and `out` never appears."""
    import vit.chunk_writer

    root = make_folders(tmp_path / "data", per_class={"train": 4, "test": 1})
    real, calls = vit.chunk_writer.write_split, []

    def fail_third(folder, *args):
        calls.append(folder)
        if len(calls) == 3:  # train, val (held out), then test
            raise OSError("disk full")
        return real(folder, *args)

    monkeypatch.setattr(vit.chunk_writer, "write_split", fail_third)
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


def test_the_held_out_val_chunks_are_the_images_image_folders_holds_out(tmp_path):
    """The same defaults (a tenth, seed 0) draw the same images, so a run on the folders and one
    on their chunks validate on the same images."""
    from vit.datamodules import ImageFolders

    root = jpeg_folders(tmp_path / "data")
    shutil.rmtree(root / "val")
    write_chunks(root, tmp_path / "chunks")
    val = sorted(streamed(tmp_path / "chunks" / "val"))
    images, labels = ImageFolders(str(root), image_size=32, val_size=0.1).split("val")[:]
    prepared = Preparation(channels=3, size=32)
    files = {
        tuple(prepared.pixels(Image.open(io.BytesIO(data))).flatten().tolist()): (data, label)
        for data, label in files_of(root / "train", ["ant", "bee"])
    }
    held_out = sorted(files[tuple((image * 255).round().byte().flatten().tolist())] for image in images)
    assert len(val) == 2 and val == held_out


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
        images, labels = split[: len(split)]
        return sorted(zip(labels.tolist(), images.flatten(1).tolist(), strict=True))

    for name in ("val", "test"):
        streamed_split, folder_split = chunks.split(name), folders.split(name)
        assert pairs(streamed_split) == pairs(folder_split)
        image, label = streamed_split[2]  # one image, as InMemory gives it
        assert image.dtype == torch.float32 and image.shape == (1, 12, 12) and label.ndim == 0
        images, labels = streamed_split[[2, 0]]
        assert torch.equal(images[0], image) and labels[0] == label and images.shape == (2, 1, 12, 12)
    batches = list(chunks.train_dataloader())
    assert [len(labels) for _, labels in batches] == [4, 4, 4]  # 12 images, full batches
    images = torch.cat([images for images, _ in batches])
    labels = torch.cat([labels for _, labels in batches])
    assert images.dtype == torch.uint8 and images.shape == (12, 1, 12, 12)
    train = folders.split("train")
    assert sorted(zip(labels.tolist(), images.flatten(1).tolist(), strict=True)) == sorted(
        zip(train.labels.tolist(), train.images.flatten(1).tolist(), strict=True)
    )
    val = chunks.split("val")
    val_batches = list(chunks.val_dataloader())  # in the chunks' order, none dropped
    assert torch.equal(torch.cat([to_float(images) for images, _ in val_batches]), val[: len(val)][0])
    with pytest.raises(ValueError, match="no split 'dev'; choose one of train, val, test"):
        chunks.split("dev")
    assert StreamingImages(str(tmp_path / "chunks")).preparation.size == (32, 32)  # the default size
    chunks.batch_size = 5
    assert [len(labels) for _, labels in chunks.train_dataloader()] == [5, 5]  # the last 2 dropped
    chunks.batch_size = 13
    assert [len(labels) for _, labels in chunks.train_dataloader()] == [12]  # unless it is the only one


@pytest.mark.slow
def test_vit_train_fits_on_streamed_chunks_and_every_command_reads_them(tmp_path, capsys):
    """The checkpoint names `vit.streaming.StreamingImages`, which the commands rebuild without
    `--datamodule` (it is the package's own); each reads the streamed test split."""
    from vit.commands import attention, eval, train

    root = make_folders(tmp_path / "data", per_class={"train": 8, "test": 2})
    write_chunks(root, tmp_path / "chunks")
    runs = tmp_path / "runs"
    data = ["--data", "vit.streaming.StreamingImages", "--data.root", str(tmp_path / "chunks")]
    train.main(["fit", *tiny_args(runs, *data, "--data.image_size", "16", "--data.batch_size", "8")])
    ckpt = runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    recorded = torch.load(ckpt, weights_only=True)["datamodule_hyper_parameters"]
    assert recorded["_class_path"] == "vit.streaming.StreamingImages"
    assert recorded["classes"] == ["ant", "bee", "cat"]
    eval.main(["--ckpt", ckpt, "--out", tmp_path / "eval"])
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["num_images"] == 6 and metrics["data_module"] == "StreamingImages"
    attention.main(["--ckpt", ckpt, "--num_images", "3", "--out", tmp_path / "maps"])
    assert len(list((tmp_path / "maps").glob("cls_*_test*.png"))) == 3
    capsys.readouterr()
    attention.main(["score", "--ckpt", ckpt, "--num_images", "4", "--no-sanity", "--methods", "rollout"])
    assert "4 test images of StreamingImages" in capsys.readouterr().out
    attention.main(["heads", "--ckpt", ckpt, "--num_images", "4"])
    assert "on 4 test images of StreamingImages" in capsys.readouterr().out
    attention.main(["patch", "--ckpt", ckpt, "--num_images", "4", "--min_gap", "0.001"])
    assert "on 4 test images of StreamingImages" in capsys.readouterr().out


def test_chunks_of_other_classes_or_without_a_split_are_refused(tmp_path):
    from vit.streaming import StreamingImages

    root = make_folders(tmp_path / "data", per_class={"train": 2})
    write_chunks(root, tmp_path / "chunks")
    with pytest.raises(
        ValueError, match=r"have the classes \['ant', 'bee', 'cat'\], not \['bee', 'ant', 'cat'\]"
    ):
        StreamingImages(str(tmp_path / "chunks"), classes=["bee", "ant", "cat"])  # another checkpoint's
    with pytest.raises(FileNotFoundError, match="chunks have no test split"):
        StreamingImages(str(tmp_path / "chunks")).test_dataloader()
    with pytest.raises(FileNotFoundError, match="chunks have no test split"):
        StreamingImages(str(tmp_path / "chunks")).split("test")
    with pytest.raises(ValueError, match="image_size=0 must be at least 1"):
        StreamingImages(str(tmp_path / "chunks"), image_size=0)
    assert StreamingImages(str(tmp_path / "chunks"), image_size=1).preparation.size == (1, 1)


def streamed_run(chunks: Path, ckpt_path=None, callbacks=(), seen=None, augment=False, **trainer) -> dict:
    """Two epochs of a tiny ViT on the chunks, no augmentation (a batch's images are the files'
    pixels) unless `augment` (random crops and flips), recording the images of each training batch
    (`seen`): `fit`'s arguments."""
    from vit import ViTClassifier, ViTConfig
    from vit.streaming import StreamingImages

    data = StreamingImages(str(chunks), image_size=16, batch_size=4, crop_padding=2 * augment, flip=augment)
    model = ViTClassifier(
        num_classes=3, in_channels=3, image_size=16, vit=ViTConfig(preset="micro", patch_size=8)
    )
    callbacks = [seen or SeenImages(), *callbacks]
    return dict(data=data, model=model, ckpt_path=ckpt_path, callbacks=callbacks, max_epochs=2,
                limit_val_batches=0, default_root_dir=chunks.parent, **trainer)  # fmt: skip


def fit_streamed(chunks: Path, seen=None, **options) -> list[list[str]]:
    """`streamed_run` fitted; the images of each training batch."""
    seen = seen or SeenImages()
    fit(**streamed_run(chunks, seen=seen, **options))
    return seen.batches


def test_a_run_resumed_mid_epoch_goes_on_with_the_images_it_had_not_seen(tmp_path):
    """A checkpoint at step 5 of a 13-step epoch, the run stopped at step 7, then resumed from the
    checkpoint: it trains on the epoch's batches 6 to 13 and then the next epoch, the same batches
    in the same order as a run never stopped. A loader that started its epoch again would repeat
    the first five; one that never reset after the resumed epoch would give the next one nothing."""
    root = make_folders(tmp_path / "data", per_class={"train": 20})  # 54 train images: 13 batches of 4
    write_chunks(root, tmp_path / "chunks")
    never_stopped = fit_streamed(tmp_path / "chunks")
    assert len(never_stopped) == 26 and never_stopped[:13] != never_stopped[13:]  # reshuffled
    every_5 = L.pytorch.callbacks.ModelCheckpoint(tmp_path / "ckpts", every_n_train_steps=5, save_top_k=-1)
    stopped = fit_streamed(tmp_path / "chunks", max_steps=7, callbacks=[every_5])
    assert stopped == never_stopped[:7]
    resumed = fit_streamed(tmp_path / "chunks", ckpt_path=tmp_path / "ckpts" / "epoch=0-step=5.ckpt")
    assert resumed == never_stopped[5:]


def test_a_loader_given_the_state_of_a_finished_epoch_starts_the_next_afresh(tmp_path):
    """Where training is counted in steps (max_steps), Lightning hands back the loader's state at
    an epoch's end too (52 of the 54 images yielded: a last partial batch is dropped): the loader
    gives the next epoch whole, shuffled as a loader never stopped shuffles it, not the epoch it
    finished again nor the nothing left of it."""
    from vit.streaming import StreamingImages

    root = make_folders(tmp_path / "data", per_class={"train": 20})  # 54 train images: 13 batches of 4
    write_chunks(root, tmp_path / "chunks")
    data = StreamingImages(str(tmp_path / "chunks"), image_size=16, batch_size=4)
    never_stopped = data.train_dataloader()
    first = [[digest(image) for image in images] for images, _ in never_stopped]
    state = never_stopped.state_dict()
    following = [[digest(image) for image in images] for images, _ in never_stopped]
    resumed = data.train_dataloader()
    resumed.load_state_dict(state)
    assert [[digest(image) for image in images] for images, _ in resumed] == following
    assert len(following) == 13 and following != first


def assert_same_weights(got: dict, expected: dict) -> None:
    for name, weights in expected.items():
        torch.testing.assert_close(got[name], weights, rtol=0, atol=1e-6, msg=name)


@pytest.mark.slow
def test_a_run_resumed_mid_epoch_or_at_an_epoch_end_augments_as_one_never_stopped(tmp_path):
    """Random crops and flips, drawn from torch's random state: a run resumed from its checkpoint
    at step 5 of a 13-step epoch, or from the one written at the end of that epoch, trains on the
    images a run never stopped trained on after it, cropped and flipped alike, and ends with its
    weights (the loader's state holds the random state, and puts it back)."""
    root = make_folders(tmp_path / "data", per_class={"train": 20})  # 54 train images: 13 batches of 4
    write_chunks(root, tmp_path / "chunks")
    steps = L.pytorch.callbacks.ModelCheckpoint(tmp_path / "steps", every_n_train_steps=5, save_top_k=-1)
    epochs = L.pytorch.callbacks.ModelCheckpoint(tmp_path / "epochs", every_n_epochs=1, save_top_k=-1)
    never_stopped = SeenImages()
    fit_streamed(tmp_path / "chunks", callbacks=[steps, epochs], seen=never_stopped, augment=True)
    for ckpt, step in (
        (tmp_path / "steps" / "epoch=0-step=5.ckpt", 5),
        (tmp_path / "epochs" / "epoch=0-step=13.ckpt", 13),
    ):
        resumed = SeenImages()
        fit_streamed(tmp_path / "chunks", ckpt_path=ckpt, seen=resumed, augment=True)
        assert resumed.batches == never_stopped.batches[step:], f"resumed at step {step}"
        assert_same_weights(resumed.weights, never_stopped.weights)


@pytest.mark.slow
def test_two_processes_resumed_mid_epoch_augment_as_a_run_never_stopped(tmp_path):
    """DDP on the CPU (gloo, two processes), each seeded its own way, random crops and flips: 54
    images, 6 batches of 4 a process each epoch. Resumed from the checkpoint at step 4, each
    process goes on with the images it had not trained on (litdata restores its share from rank
    0's state), cropped and flipped alike (each process's random state is gathered into rank 0's
    checkpoint), then epoch 1, and the run ends with the weights of the run never stopped."""
    root = make_folders(tmp_path / "data", per_class={"train": 20})
    write_chunks(root, tmp_path / "chunks")
    steps = L.pytorch.callbacks.ModelCheckpoint(tmp_path / "steps", every_n_train_steps=4, save_top_k=-1)

    def run(name: str, **options) -> dict:
        (tmp_path / name).mkdir()
        return streamed_run(tmp_path / "chunks", seen=SeenImages(tmp_path / name), augment=True, **options)

    fit_in_two_processes(
        run("never_stopped", callbacks=[steps, SeedEachProcess()]),
        run("resumed", ckpt_path=tmp_path / "steps" / "epoch=0-step=4.ckpt", callbacks=[SeedEachProcess()]),
    )
    never_stopped, resumed = (
        SeenImages.of_processes(tmp_path / name, 2) for name in ("never_stopped", "resumed")
    )
    assert [len(process["batches"]) for process in never_stopped] == [12, 12]
    for rank in (0, 1):
        assert resumed[rank]["batches"] == never_stopped[rank]["batches"][4:], f"rank {rank}"
    assert_same_weights(resumed[0]["weights"], never_stopped[0]["weights"])


@pytest.mark.slow
def test_two_processes_see_disjoint_images_that_together_make_the_epoch(tmp_path):
    """DDP on the CPU (gloo, two processes): litdata gives each process its own share of the
    shuffled chunks. 48 distinct images, 24 a process in 6 batches of 4, each epoch: no image seen
    by both, none left out, and each epoch's shares drawn anew (chunks shuffled between the
    processes: with one chunk, each would see the same half every epoch)."""
    from vit.datamodules import ImageFolders

    root = noise_folders(tmp_path / "data")
    # 3 or 4 images a chunk (litdata counts an item's bytes otherwise where pyarrow is installed, as
    # the mlflow extra installs it): 12 to 16 chunks; litdata shuffles chunks, then images
    write_chunks(root, tmp_path / "chunks", chunk_bytes=4000)
    assert 12 <= len(list((tmp_path / "chunks" / "train").glob("*.bin"))) <= 16
    fit_streamed(tmp_path / "chunks", seen=SeenImages(tmp_path), strategy="ddp_spawn", devices=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text())["batches"] for r in (0, 1)]
    assert [len(batches) for batches in ranks] == [12, 12]  # 2 epochs of 6 batches
    train = {
        digest(image) for image in ImageFolders(str(root), image_size=16, val_size=1).split("train")[:][0]
    }
    assert len(train) == 48
    for epoch in (0, 1):
        first, second = (
            {d for batch in batches[6 * epoch : 6 * epoch + 6] for d in batch} for batches in ranks
        )
        assert len(first) == len(second) == 24 and not first & second and first | second == train
    assert {d for batch in ranks[0][:6] for d in batch} != {d for batch in ranks[0][6:] for d in batch}


def jpeg_folders(root: Path) -> Path:
    """`root/{train,val}/{ant,bee}/N.jpg`: smooth random colours at four sizes, larger and smaller
    than 32 px, square and not, so that preparing them resizes, crops or leaves them."""
    noise = torch.Generator().manual_seed(0)
    sizes = [(32, 32), (48, 40), (20, 28), (64, 50)]
    for split, count in (("train", 8), ("val", 2)):
        for name in ("ant", "bee"):
            (root / split / name).mkdir(parents=True)
            for j in range(count):
                coarse = torch.randint(0, 256, (4, 4, 3), dtype=torch.uint8, generator=noise).numpy()
                image = Image.fromarray(coarse).resize(sizes[j % 4], Image.BICUBIC)
                image.save(root / split / name / f"{j}.jpg", quality=92)
    return root


@pytest.mark.parametrize("resize", ["stretch", "center_crop"])
@pytest.mark.parametrize("channels", [3, 1])
def test_batches_decoded_on_the_device_are_the_workers_batches(tmp_path, resize, channels):
    """decode='device' hands the files' bytes on and decodes each batch where it goes (here the
    CPU: the same code as on a GPU but for nvJPEG): the same images in the same order as the
    workers' Pillow decoding, to within 1 level of 255 (`Preparation.tensor_pixels`)."""
    pytest.importorskip("torchcodec")
    from vit.streaming import StreamingImages

    write_chunks(jpeg_folders(tmp_path / "data"), tmp_path / "chunks")
    options = dict(image_size=32, batch_size=16, resize=resize, channels=channels)
    workers = StreamingImages(str(tmp_path / "chunks"), **options)
    device = StreamingImages(str(tmp_path / "chunks"), decode="device", **options)
    ((expected, labels),) = list(workers.train_dataloader())
    ((files, file_labels),) = list(device.train_dataloader())
    assert isinstance(files, list) and all(f.dtype == torch.uint8 and f.ndim == 1 for f in files)
    images, got_labels = device.on_before_batch_transfer((files, file_labels), 0)
    assert torch.equal(got_labels, labels) and images.dtype == torch.uint8
    assert images.shape == expected.shape == (16, channels, 32, 32)
    difference = (images.int() - expected.int()).abs()
    assert difference.max() <= 1 and difference.float().mean() < 0.1
    assert workers.on_before_batch_transfer((expected, labels), 0)[0] is expected  # workers': as it is


def test_a_device_decoded_batch_has_the_border_and_sizes_of_its_preparation(tmp_path, monkeypatch):
    pytest.importorskip("torchcodec")
    from vit.chunk_reader import decode_batch
    from vit.preparation import Preparation

    root = jpeg_folders(tmp_path)
    paths = sorted((root / "train" / "ant").iterdir())[:4]
    files = [torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8) for path in paths]
    wide, tall = (
        Preparation(channels=3, size=(20, 36), resize="center_crop"),
        Preparation(3, (36, 20), "center_crop"),
    )
    for preparation in (
        Preparation(channels=3, size=(36, 30), pad=2),
        wide,
        tall,
        Preparation(channels=1, size=20),
    ):
        batch = decode_batch(files, preparation, torch.device("cpu"))
        expected = []
        for path in paths:
            with Image.open(path) as image:
                expected.append(preparation.pixels(image))
        assert batch.shape == torch.stack(expected).shape
        assert (batch.int() - torch.stack(expected).int()).abs().max() <= 1
    assert batch.shape == (4, 1, 20, 20)
    import torchcodec.decoders

    asked = []
    real = torchcodec.decoders.decode_jpeg
    monkeypatch.setattr(
        torchcodec.decoders, "decode_jpeg", lambda *a, **k: asked.append(k["device"]) or real(*a, **k)
    )
    bordered = decode_batch(files, Preparation(channels=3, size=(36, 30), pad=2), torch.device("cpu"))
    assert asked == [torch.device("cpu")]  # decoded where the batch goes
    assert (
        bordered[:, :, :2].eq(0).all()
        and bordered[:, :, :, -2:].eq(0).all()
        and bordered[:, :, 2:-2, 2:-2].any()
    )


def test_decoding_on_the_device_refuses_files_that_are_not_jpeg(tmp_path):
    pytest.importorskip("torchcodec")
    from vit.streaming import StreamingImages

    write_chunks(make_folders(tmp_path / "data", per_class={"train": 4}), tmp_path / "chunks")  # PNG files
    data = StreamingImages(str(tmp_path / "chunks"), decode="device", batch_size=4)
    batch = next(iter(data.train_dataloader()))
    with pytest.raises(
        ValueError, match="decode='device' reads JPEG files only, and 4 of this batch are not"
    ):
        data.on_before_batch_transfer(batch, 0)
    with pytest.raises(ValueError, match="decode='gpu' must be 'workers' or 'device'"):
        StreamingImages(str(tmp_path / "chunks"), decode="gpu")


def test_vit_train_fits_with_batches_decoded_on_the_device(tmp_path):
    pytest.importorskip("torchcodec")
    from vit.commands import train

    write_chunks(jpeg_folders(tmp_path / "data"), tmp_path / "chunks")
    runs = tmp_path / "runs"
    data = [
        "--data",
        "vit.streaming.StreamingImages",
        "--data.root",
        str(tmp_path / "chunks"),
        "--data.decode",
        "device",
    ]
    train.main(["fit", *tiny_args(runs, *data, "--data.image_size", "16", "--data.batch_size", "8")])
    ckpt = torch.load(runs / "tiny" / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 4 and ckpt["datamodule_hyper_parameters"]["decode"] == "device"


def test_the_seed_draws_the_order_and_workers_decode_the_same_images(tmp_path):
    from vit.streaming import StreamingImages

    write_chunks(jpeg_folders(tmp_path / "data"), tmp_path / "chunks")

    def order(**options):
        data = StreamingImages(str(tmp_path / "chunks"), batch_size=4, **options)
        loader = data.train_dataloader()
        return loader, [digest(image) for images, _ in loader for image in images]

    _, first = order(seed=0)
    assert (
        order(seed=0)[1] == first and order(seed=1)[1] != first and sorted(order(seed=1)[1]) == sorted(first)
    )
    loader, with_workers = order(seed=0, num_workers=2)
    assert loader.num_workers == 2 and sorted(with_workers) == sorted(first)


def test_batches_are_augmented_in_training_only(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from vit.streaming import StreamingImages

    write_chunks(jpeg_folders(tmp_path / "data"), tmp_path / "chunks")
    data = StreamingImages(str(tmp_path / "chunks"), batch_size=4)
    monkeypatch.setattr(data, "augment", lambda images, labels: ("augmented", labels))
    images, labels = next(iter(data.val_dataloader()))
    assert torch.equal(data.on_after_batch_transfer((images, labels), 0)[0], to_float(images))  # no trainer
    data.trainer = SimpleNamespace(training=False)  # validating
    assert torch.equal(data.on_after_batch_transfer((images, labels), 0)[0], to_float(images))
    data.trainer = SimpleNamespace(training=True)
    assert data.on_after_batch_transfer((images, labels), 0)[0] == "augmented"
