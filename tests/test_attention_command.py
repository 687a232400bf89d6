"""`vit-attention` and the drawing functions, on a tiny trained model."""

import numpy as np
import pytest
import torch
from helpers import command_error
from PIL import Image

from vit import CNNClassifier
from vit.commands.attention import COMMAND, AttentionOptions, attention, main, patch
from vit.datamodules import spread_test_images
from vit.interpret.figures import batch_figure, layers_heads_figure, mosaic, overlay_rgb
from vit.plot import save_figure

PNG = b"\x89PNG"


def run(*args: str) -> None:
    main([str(a) for a in args])


def pngs(folder) -> set[str]:
    found = {p.name for p in folder.iterdir()}
    assert all((folder / name).read_bytes()[:4] == PNG for name in found)
    return found


def pngs_and_more(folder) -> set[str]:
    found = {p.name for p in folder.iterdir()}
    assert all((folder / name).read_bytes()[:4] == PNG for name in found if name.endswith(".png"))
    return found


def per_image(name: str, indices: list[int]) -> set[str]:
    """The per-image figures of test images: position, then index in the test split."""
    return {f"{name}_{n:03d}_test{i}.png" for n, i in enumerate(indices)}


@pytest.mark.parametrize(
    "options, expected",
    [
        ([], {"cls.png", "per image"}),
        (["--layer", "-1", "--head", "1"], {"cls.png"}),
        (
            ["--method", "query", "--query-patch", "1,2", "--layer", "0"],  # one layer, both heads
            {"query_1_2.png", "per image"},
        ),
        (["--method", "rollout", "--discard_ratio", "0.5", "--head_fusion", "max"], {"rollout.png"}),
        (["--method", "grad-rollout", "--target", "2"], {"grad_rollout.png"}),
        (["--method", "input-gradient"], {"input_gradient.png"}),
        (
            ["--method", "rollout", "--plots"],
            {
                "rollout.png",
                "mean_attention_distance.png",
                "pos_embed_similarity.png",
                "embedding_filters.png",
            },
        ),
    ],
)
def test_methods_write_their_figures(trained, trained_checkpoint, tmp_path, capsys, options, expected):
    run("--ckpt", trained_checkpoint, "--out", tmp_path / "out", "--num_images", "3", *options)
    if "per image" in expected:  # one figure per image, named by position and test index
        _, _, indices = spread_test_images(trained[1], 3)
        assert indices == [0, 32, 63]  # 3 of the 64 test images, spread from first to last
        summary = expected - {"per image"}
        expected = summary | per_image(next(iter(summary)).removesuffix(".png"), indices)
    assert pngs(tmp_path / "out") == expected
    files = "1 PNG file" if len(expected) == 1 else f"{len(expected)} PNG files"
    assert f"wrote {files} into" in capsys.readouterr().out


def test_images_from_files_and_folders_of_any_size(trained_checkpoint, tmp_path):
    folder = tmp_path / "pictures"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name, size in (("a.png", (32, 32)), ("b.jpg", (48, 64))):
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(folder / name)
    (folder / "notes.txt").write_text("not an image")
    extra = tmp_path / "c.png"
    Image.fromarray(rng.integers(0, 255, (20, 20), dtype=np.uint8)).save(extra)
    run("--ckpt", trained_checkpoint, "--images", folder, extra, "--out", tmp_path / "out", "--layer", "-1")
    # one figure per image, named by its position and its file (the folder's sorted, then c.png)
    assert pngs(tmp_path / "out") == {"cls.png", "cls_000_a.png", "cls_001_b.png", "cls_002_c.png"}
    (tmp_path / "out" / "notes.txt").write_text("the user's")
    run("--ckpt", trained_checkpoint, "--images", extra, "--out", tmp_path / "out", "--layer", "-1")
    # another run into the same folder replaces the per-image figures, and only those
    assert pngs_and_more(tmp_path / "out") == {"cls.png", "cls_000_c.png", "notes.txt"}


@pytest.mark.parametrize(
    "options, message",
    [
        (
            ["--method", "gradcam"],
            "unknown method 'gradcam'; choose one of cls, query, rollout, grad-rollout, input-gradient",
        ),
        (["--layer", "2"], "layer=2 is out of range for a model with 2 layers"),
        (["--head", "-3"], "head=-3 is out of range for a model with 2 heads"),
        (["--method", "query", "--query-patch", "4,0"], "patch (4, 0) is outside the 4x4 patch grid"),
        (["--method", "query"], "--method query needs --query_patch"),
        (["--query-patch", "1,1"], "--method query needs --query_patch"),
        (["--method", "query", "--query-patch", "1,x"], "--query_patch '1,x' is not ROW,COLUMN"),
        (["--images", "missing.png"], "image not found: missing.png"),
        (["--target", "7"], "target=7 is not a class of this model"),
        (["--discard_ratio", "1.5"], "discard_ratio=1.5 must lie in [0, 1)"),
        (["--layer", "last"], 'Parser key "layer"'),
        (["--out", "{tmp}/file.txt"], "--out {tmp}/file.txt is a file, not a folder"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(trained_checkpoint, tmp_path, capsys, options, message):
    (tmp_path / "file.txt").write_text("the user's")
    options = [str(o).replace("{tmp}", str(tmp_path)) for o in options]
    message = message.replace("{tmp}", str(tmp_path))
    status, error = command_error(
        main, ["--ckpt", trained_checkpoint, "--out", tmp_path / "out", *options], capsys
    )
    assert status == (1 if "not found" in message else 2) and message in error
    assert not (tmp_path / "out").exists() and (tmp_path / "file.txt").read_text() == "the user's"


def test_shell_spellings_of_the_options():
    """Dashes or underscores, a bare --plots, --images with several words, ROW,COLUMN."""
    options = COMMAND.parser().parse_args(
        ["--ckpt", "x", "--query-patch", "1,2", "--plots", "--images", "a.png", "b", "--layer", "-1",
         "--num_images", "3", "--discard-ratio", "0.5"]
    )  # fmt: skip
    assert patch(options.query_patch) == (1, 2) and options.plots is True and options.images == ["a.png", "b"]
    assert options.layer == -1 and options.num_images == 3 and options.discard_ratio == 0.5


def test_overlay_colours_the_hot_patch_and_keeps_the_image_size():
    image = torch.zeros(1, 8, 12)
    patch_map = torch.zeros(2, 3)
    patch_map[1, 2] = 5.0  # the bottom-right 4x4 block
    rgb = overlay_rgb(image, patch_map, cmap="gray", alpha=1.0)
    assert rgb.shape == (8, 12, 3)
    assert np.allclose(rgb[4:, 8:], 1.0) and np.allclose(rgb[:4], 0.0) and np.allclose(rgb[:, :8], 0.0)
    half = overlay_rgb(torch.ones(3, 8, 12), patch_map, cmap="gray", alpha=0.5)
    assert np.allclose(half[0, 0], 0.5) and np.allclose(half[7, 11], 1.0)


def test_mosaic_and_figures(tmp_path):
    tiles = np.zeros((2, 3, 4, 5, 3))
    assert mosaic(tiles).shape == (2 * (4 + 2), 3 * (5 + 2), 3)
    image, maps = torch.rand(3, 16, 24), torch.rand(2, 3, 4, 6)  # 2 layers, 3 heads, 4x6 grid
    fig = layers_heads_figure(image, maps, [0, 1], [0, 1, 2], title="t", box=(4, 8, 4, 4))
    path = save_figure(fig, tmp_path / "deep" / "one.png")
    width, height = Image.open(path).size
    assert width > height  # 5 columns (image, mean, 3 heads) by 2 rows
    path = save_figure(
        batch_figure(torch.rand(5, 1, 16, 24), torch.rand(5, 4, 6), ["a"] * 5, columns=2), tmp_path / "b.png"
    )
    width, height = Image.open(path).size
    assert height > width  # 3 rows of 2


def test_a_failure_while_saving_removes_what_was_written(trained_checkpoint, tmp_path, monkeypatch, capsys):
    import vit.plot

    saved = []

    def save_then_fail(fig, path):
        if saved:
            raise OSError("disk full")
        saved.append(save_figure(fig, path))
        return saved[-1]

    monkeypatch.setattr(vit.plot, "save_figure", save_then_fail)  # save_all writes through it
    args = ["--ckpt", trained_checkpoint, "--out", tmp_path / "out", "--num_images", "2"]
    assert command_error(main, args, capsys) == (1, "error: disk full")  # one line, not a traceback
    assert saved and not saved[0].exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("small_data", [False, True])
def test_a_non_square_model_without_a_data_module(tmp_path, small_data, capsys):
    """The grid comes from the model: 16x24 images in 4-pixel patches make a 4x6 grid. With
    shifted patches (15 input channels to the patch projection) the images are still RGB."""
    from vit import ViTClassifier, ViTConfig

    vit = ViTConfig(preset="micro", patch_size=4, shifted_patches=small_data, locality_attention=small_data)
    model = ViTClassifier(num_classes=3, image_size=(16, 24), in_channels=3, vit=vit)
    ckpt = tmp_path / "wide.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, ckpt)
    picture = tmp_path / "wide.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (30, 50, 3), dtype=np.uint8)).save(picture)
    out = tmp_path / "out"
    run(
        "--ckpt",
        ckpt,
        "--images",
        picture,
        "--out",
        out,
        "--method",
        "query",
        "--query-patch",
        "3,5",
        "--plots",
    )
    assert pngs(out) == {
        "query_3_5.png", f"query_3_5_000_{picture.stem}.png", "mean_attention_distance.png",
        "pos_embed_similarity.png", "embedding_filters.png",
    }  # fmt: skip
    for options, message in (
        (["--images", picture, "--method", "query", "--query-patch", "3,6"], "outside the 4x6 patch grid"),
        ([], "names no data module to take test images from; give --images"),
    ):
        assert (
            message in command_error(main, ["--ckpt", ckpt, "--out", tmp_path / "bad", *options], capsys)[1]
        )
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_rollouts_follow_the_tokens_the_head_reads(tmp_path, monkeypatch, capsys, pool):
    """Rollouts of a `pool: mean` model follow its patch tokens, and say so; `--method cls` notes
    that the class token does not feed its head. With `attn_window` the class token attends only
    to itself, so a class-token rollout would be blank there; the pooled one is not."""
    import vit.interpret.figures
    from vit import ViTClassifier, ViTConfig

    options = dict(pool="mean", attn_window=1) if pool == "mean" else {}
    model = ViTClassifier(
        num_classes=3, image_size=16, in_channels=3, vit=ViTConfig(preset="micro", **options)
    )
    ckpt = tmp_path / "model.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, ckpt)
    picture = tmp_path / "a.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(picture)
    drawn = []

    def batch_figure_spy(images, maps, *args, title, **kwargs):
        drawn.append((title, maps))
        return batch_figure(images, maps, *args, title=title, **kwargs)

    # the command imports it when it runs
    monkeypatch.setattr(vit.interpret.figures, "batch_figure", batch_figure_spy)
    for method in ("rollout", "grad-rollout", "cls"):
        run("--ckpt", ckpt, "--images", picture, "--out", tmp_path / method, "--method", method)
    token = {"mean": "mean-pooled-token", "cls": "class-token"}[pool]
    assert drawn[0][0].startswith(f"{token} attention rollout")
    assert drawn[1][0].startswith(f"{token} gradient-weighted rollout")
    note = "note: this model's head reads the mean of the patch tokens"
    assert (note in capsys.readouterr().out) == (pool == "mean")
    for _, maps in drawn[:2]:
        assert maps.flatten(1).std(dim=1).min() > 0


def test_test_images_are_spread_over_the_split(tmp_path, trained):
    """Folders list their test images class by class: the images drawn come from across the split
    (here one per class), with their indices, not the first few (all of the first class)."""
    from helpers import make_folders

    from vit.datamodules import ImageFolders, InMemory

    root = make_folders(tmp_path, per_class={"train": 2, "test": 3})
    data = ImageFolders(str(root), image_size=8, val_size=1)
    images, labels, indices = spread_test_images(data, 3)
    assert indices == [0, 4, 8] and labels.tolist() == [0, 1, 2] and images.shape == (3, 3, 8, 8)
    data.setup("test")
    everything, _ = next(iter(data.test_dataloader()))
    torch.testing.assert_close(images, everything[indices])
    _, two_circles = trained  # a split smaller than asked for: every image, once
    _, _, indices = spread_test_images(two_circles, 10_000)
    assert indices == list(range(len(two_circles.test_dataloader().dataset)))

    class Empty:  # a data module whose test split has no images
        def split(self, name):
            return InMemory(torch.zeros(0, 3, 8, 8), torch.zeros(0, dtype=torch.long))

    with pytest.raises(ValueError, match="test split is empty"):
        spread_test_images(Empty(), 3)


def test_a_cnn_checkpoint_is_refused(tmp_path):
    model = CNNClassifier(num_classes=4, in_channels=1, receptive_field=3, width=4)
    path = tmp_path / "cnn.ckpt"
    hparams = {**model.hparams, "_class_path": "vit.classifier.CNNClassifier"}
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": hparams}, path)
    with pytest.raises(ValueError, match="holds a BagCNN, not a ViT"):
        attention(AttentionOptions(ckpt=path, images=[tmp_path], out=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_image_files_are_prepared_as_the_data_module_prepares_its_test_images(tmp_path):
    """A Fashion-MNIST model of 32x32 images saw 28x28 pictures padded with black; a 28x28 file
    given to vit-attention must be padded the same way, not stretched to 32x32."""
    from helpers import write_idx

    from vit.datamodules import FashionMNIST
    from vit.preparation import read_images

    for prefix, n in (("train", 4), ("t10k", 2)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", np.zeros((n, 28, 28)))
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n))
    data = FashionMNIST(str(tmp_path), image_size=32, val_size=1)
    picture = np.random.default_rng(0).integers(1, 255, (28, 28), dtype=np.uint8)
    Image.fromarray(picture).save(tmp_path / "shirt.png")
    batch = read_images([tmp_path / "shirt.png"], data.preparation)
    assert batch.shape == (1, 1, 32, 32)
    assert torch.equal(batch[0, 0, 2:30, 2:30], torch.from_numpy(picture).float() / 255)
    assert batch[0, 0, :2].abs().sum() == 0  # the black border, as in training


def test_file_tags_are_safe_parts_of_file_names():
    from vit.commands.attention import file_tag

    assert file_tag("cat") == "cat"
    assert file_tag("my photo (1)/ü") == "my_photo__1___"
    assert file_tag("x" * 100) == "x" * 40


def test_figure_7_of_a_conv_stem_model_leaves_out_the_pixel_filters(capsys):
    """A conv stem stands between the pixels and the patch projection: the attention distances
    and position similarities are drawn, the embedding filters are not, and the command says so."""
    from vit.commands.attention import figure_7
    from vit.model import ViT

    model = ViT(preset="micro", num_classes=3, image_size=16, patch_size=4, conv_stem=(8,)).eval()
    figures = figure_7(model, torch.rand(3, 3, 16, 16), batch_size=2)
    assert sorted(figures) == ["mean_attention_distance.png", "pos_embed_similarity.png"]
    assert "no embedding_filters.png: the model's conv_stem lies" in capsys.readouterr().out


@pytest.mark.slow
def test_device_cpu_draws_what_the_default_draws(trained_checkpoint, tmp_path):
    """--device cpu computes the maps, the per-image figures and Figure 7 on the CPU: the same
    files as without it (on this machine the default, auto, is the CPU too unless it has a GPU)."""
    options = ["--ckpt", trained_checkpoint, "--num_images", "2", "--method", "query", "--query-patch", "1,2"]
    run(*options, "--plots", "--out", tmp_path / "default")
    run(*options, "--plots", "--out", tmp_path / "cpu", "--device", "cpu")
    names = pngs(tmp_path / "cpu")
    assert names == pngs(tmp_path / "default") and len(names) == 6  # all images, each image, 3 plots
    if not torch.cuda.is_available():  # the default ran on the CPU too: the same pixels
        for name in names:
            assert (tmp_path / "cpu" / name).read_bytes() == (tmp_path / "default" / name).read_bytes(), name


@pytest.mark.skipif(torch.cuda.is_available(), reason="PyTorch sees a CUDA device here")
def test_device_cuda_without_one_is_one_line_and_writes_nothing(trained_checkpoint, tmp_path, capsys):
    args = ["--ckpt", trained_checkpoint, "--device", "cuda", "--out", tmp_path / "out"]
    assert command_error(main, args, capsys) == (2, "error: --device cuda: PyTorch sees no CUDA device")
    assert not (tmp_path / "out").exists()
