"""`vit.explore` and `vit-attention --html`: one self-contained page, tested in a real browser.

The browser tests open the page from a file URL in headless Chromium (Playwright) with every
network request blocked, click as a user does and read back what the page drew: each map canvas
keeps the values it painted (`canvas.values`, the patches row by row), and in gray the pixels say
the same. Those are held against `vit.interpret.maps` within the error the page states.
"""

import base64
import json
import re
import zlib
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT, command_error

import vit
from vit.commands.attention import main
from vit.datamodules import spread_test_images
from vit.errors import UsageError
from vit.interpret.explore import Explorer, explore, quantise
from vit.interpret.maps import MapSpec, attention_rollout, attention_weights, gradient_rollout, pooled_maps
from vit.model import ViT

SCREENSHOT = ROOT / "docs" / "explore.png"  # the README shows it


def page_json(html: str) -> dict:
    """The data a page holds, read back out of its HTML."""
    start = html.index('id="explore-data">') + len('id="explore-data">')
    return json.loads(html[start : html.index("</script>", start)])


def decoded(data: dict, b: int) -> dict[str, np.ndarray]:
    """Image b's matrices as the page decodes them: codes times each row's scale."""
    m = data["model"]
    L, H, T = m["layers"], m["heads"], m["tokens"]
    shapes = {"attention": (L, H), "rollout": (L,), "grad-rollout": (len(data["images"][b]["top"]),)}
    raw = zlib.decompress(base64.b85decode(data["images"][b]["data"]))
    sizes = {kind: int(np.prod(shape)) * T for kind, shape in shapes.items()}
    floats, offset = {}, 0
    for part in ("scales", "diagonals"):
        for kind, size in sizes.items():
            floats[part, kind] = np.frombuffer(raw, "<f4", size, offset).reshape(*shapes[kind], T)
            offset += 4 * size
    out = {}
    for kind, size in sizes.items():
        codes = np.frombuffer(raw, np.uint8, size * T, offset).reshape(*shapes[kind], T, T)
        out[kind] = (
            codes * floats["scales", kind][..., None] + np.eye(T) * floats["diagonals", kind][..., None]
        )
        offset += size * T
    assert offset == len(raw)
    return out


def test_the_page_holds_every_layer_and_head_within_the_error_it_states(trained):
    model, data = trained[0].model, trained[1]
    images = data.split("test")[:3][0]
    page = explore(model, images, captions=["a", "b", "c"], class_names=data.classes)
    held = page_json(page.html)
    assert held == page.data  # what the page reads is what Python made
    weights = attention_weights(model, images)
    errors = held["quantisation"]["max_error"]
    assert 0 < errors["attention"] <= 1 / 510 + 1e-7  # half a step of the largest row's 255
    for b in range(3):
        rows = decoded(held, b)
        assert np.abs(rows["attention"] - weights[:, b].numpy()).max() <= errors["attention"] + 1e-7
        last = attention_rollout(weights[:, b : b + 1])[0].numpy()
        assert np.abs(rows["rollout"][-1] - last).max() <= errors["rollout"] + 1e-7
    # self-contained: no address anywhere, images inline, no external script or style
    assert not re.search(r"https?:|<link|src=\"(?!data:)", page.html)
    assert all(image["src"].startswith("data:image/png;base64,") for image in held["images"])  # gray: PNG
    assert [image["caption"] for image in held["images"]] == ["a", "b", "c"]
    assert held["model"] == {
        "layers": 2, "heads": 2, "grid": [4, 4], "patch": 8, "tokens": 17, "prefix": ["class token"],
        "pool": "cls",
    }  # fmt: skip


def test_rows_quantised_to_8_bits_are_off_by_at_most_half_a_step():
    matrices = torch.rand(5, 7, 33, 33).softmax(-1) * torch.rand(5, 7, 1, 1) * 3
    matrices = matrices + 100 * torch.eye(33)  # a rollout's identity: it must not swamp the rest
    codes, scales, diagonals, error = quantise(matrices)
    restored = codes * scales[..., None] + np.eye(33) * diagonals[..., None]
    assert codes.dtype == np.uint8 and codes.max() == 255 and scales.dtype == diagonals.dtype == np.float32
    assert np.abs(restored - matrices.numpy()).max() == pytest.approx(error, abs=1e-5)
    rest = matrices.numpy() * (1 - np.eye(33))  # off the diagonal: within half a step of their own
    assert (np.abs(restored - matrices.numpy()) <= scales[..., None] / 2 + 1e-6).all()
    assert np.allclose(scales, rest.max(-1) / 255) and np.allclose(
        diagonals, np.diagonal(matrices, 0, -2, -1)
    )


def test_save_and_jupyter(trained, tmp_path):
    model, data = trained[0].model, trained[1]
    page = vit.explore(model, data.split("test")[:2][0])  # the package exports it
    assert isinstance(page, Explorer)
    path = page.save(tmp_path / "deep" / "page.html")
    assert path.read_text(encoding="utf-8") == page.html
    shown = page._repr_html_()
    assert shown.startswith("<iframe srcdoc=") and "<script" not in shown  # escaped inside srcdoc
    with pytest.raises(UsageError, match="is a folder"):
        page.save(tmp_path)


def test_bad_input_to_explore(trained):
    model, data = trained[0].model, trained[1]
    images = data.split("test")[:2][0]
    with pytest.raises(UsageError, match="explore takes a vit.ViT, not a ViTClassifier"):
        explore(trained[0], images)
    with pytest.raises(
        UsageError, match=re.escape("a batch of images (B, C, H, W), got shape (0, 1, 32, 32)")
    ):
        explore(model, images[:0])
    with pytest.raises(UsageError, match="1 captions for 2 images"):
        explore(model, images, captions=["only one"])
    with pytest.raises(UsageError, match="unknown method 'gradcam'"):
        explore(model, images, MapSpec("gradcam"))
    with pytest.raises(
        UsageError, match="the page shows the methods cls, query, rollout, grad-rollout, not input"
    ):
        explore(model, images, MapSpec("input-gradient"))


def test_the_command_writes_one_page(trained_checkpoint, tmp_path, capsys):
    main(["--ckpt", str(trained_checkpoint), "--out", str(tmp_path / "out"), "--num_images", "3", "--html"])
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["attention.html"]  # no PNG files
    out = capsys.readouterr().out
    assert re.search(r"wrote .*attention\.html \(0\.\d MB\) for 3 images in [\d.]+ s", out), out
    held = page_json((tmp_path / "out" / "attention.html").read_text(encoding="utf-8"))
    assert [i["caption"] for i in held["images"]][0].startswith("test 0, true ")
    named = tmp_path / "pages" / "mine.html"
    args = ["--method", "query", "--query-patch", "1,2", "--layer", "0", "--head", "1", "--html", named]
    main(["--ckpt", str(trained_checkpoint), "--num_images", "1", *map(str, args)])
    assert page_json(named.read_text(encoding="utf-8"))["start"] == {
        "view": "attention", "query": 1 + 1 * 4 + 2, "layer": 0, "head": 1,
    }  # fmt: skip


@pytest.mark.parametrize(
    "options, message, status",
    [
        (["--html", "{tmp}"], "--html {tmp} is a folder; name the page's file", 2),
        (["--html", "--out", "{tmp}"], "--html {tmp}/attention.html is a folder", 2),
        (["--html", "--method", "gradcam"], "unknown method 'gradcam'", 2),
        (["--html", "--images", "{tmp}/empty"], "no image files", 1),
        (["--html", "--num_images", "0"], "num_images=0 and batch_size=64 must be at least 1", 2),
        (["--html", "--plots"], "--html writes one page with every method", 2),
        (["--html", "--layer", "5"], "layer=5 is out of range for a model with 2 layers", 2),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    trained_checkpoint, tmp_path, capsys, options, message, status
):
    (tmp_path / "empty").mkdir()
    (tmp_path / "attention.html").mkdir()  # a folder where the page would go
    options = [o.replace("{tmp}", str(tmp_path)) for o in options]
    out = [] if "--out" in options else ["--out", str(tmp_path / "out")]
    code, error = command_error(main, ["--ckpt", trained_checkpoint, *out, *options], capsys)
    assert code == status and message.replace("{tmp}", str(tmp_path)) in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attention.html", "empty"]
    assert not any((tmp_path / "attention.html").iterdir()) and not any((tmp_path / "empty").iterdir())


# ------------------------------------------------------------------------------ in a real browser


@contextmanager
def opened(browser, path: Path, size=(1280, 900), inline: bool = False):
    """The page at `path` from a file URL, ready (`inline`: the page in its iframe, as Jupyter
    shows it); every request off this machine is blocked and fails the test, as does any console
    error."""
    context = browser.new_context(viewport={"width": size[0], "height": size[1]})
    blocked, errors = [], []

    def route(route):
        if route.request.url.startswith(("file:", "data:")):
            return route.continue_()
        blocked.append(route.request.url)
        return route.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("request", lambda r: None if r.url.startswith(("file:", "data:")) else blocked.append(r.url))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.resolve().as_uri())
    if inline:
        page.frame_locator("iframe").locator("body[data-ready=true]").wait_for(timeout=10_000)
    else:
        page.wait_for_selector("body[data-ready=true]", timeout=10_000)
    try:
        yield page
    finally:
        context.close()
    assert not blocked, f"the page asked the network for {blocked}"
    assert not errors, errors


def click_patch(page, row: int, col: int, grid=(4, 4)) -> None:
    box = page.locator("#query-canvas").bounding_box()
    page.mouse.click(
        box["x"] + (col + 0.5) * box["width"] / grid[1], box["y"] + (row + 0.5) * box["height"] / grid[0]
    )
    page.mouse.move(0, 0)  # off the image: no hover left over


def shown(page, selector: str) -> np.ndarray:
    """The values a map canvas drew (its patches, row by row)."""
    return np.array(page.locator(selector).evaluate("c => Array.from(c.values)"))


def show_image(page, i: int) -> None:
    page.locator("#images button").nth(i).click()
    page.wait_for_selector(f"body[data-image='{i}']")


@pytest.fixture(scope="module")
def command_page(trained_checkpoint, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("page")
    main(["--ckpt", str(trained_checkpoint), "--out", str(out), "--num_images", "3", "--html"])
    return out / "attention.html"


@pytest.mark.slow
def test_a_clicked_patch_shows_its_attention_in_every_layer_and_head(browser, trained, command_page):
    model, data = trained[0].model, trained[1]
    images, _, _ = spread_test_images(data, 3)  # the command's images
    weights = attention_weights(model, images)
    error = page_json(command_page.read_text(encoding="utf-8"))["quantisation"]["max_error"]["attention"]
    with opened(browser, command_page) as page:
        show_image(page, 2)
        click_patch(page, 1, 2)
        token = 1 + 1 * 4 + 2
        assert page.evaluate("document.body.dataset.query") == str(token)
        for layer in range(2):
            for head in range(2):
                drawn = shown(page, f"#grid canvas[data-layer='{layer}'][data-head='{head}']")
                expected = weights[layer, 2, head, token, 1:].numpy()
                assert drawn.shape == (16,) and np.abs(drawn - expected).max() <= error + 1e-6
            mean = shown(page, f"#grid canvas[data-layer='{layer}'][data-head='-1']")
            assert np.abs(mean - weights[layer, 2, :, token, 1:].mean(0).numpy()).max() <= error + 1e-6
        # the large view: the last layer's mean of heads; in gray, plain, its pixels say the same
        page.select_option("#cmap", "gray")
        page.select_option("#mode", "plain")
        large = page.locator("#large")
        assert large.get_attribute("data-layer") == "1" and large.get_attribute("data-head") == "-1"
        red = (
            "c => Array.from(c.getContext('2d').getImageData(0, 0, 360, 360).data.filter((_, i) => !(i % 4)))"
        )
        centres = np.array(large.evaluate(red)).reshape(360, 360)[45::90, 45::90].flatten()  # one per patch
        expected = weights[1, 2, :, token, 1:].mean(0).numpy()
        assert np.abs(centres - 255 * expected / expected.max()).max() <= 1 + 2 * 255 * error / expected.max()
        page.select_option("#scale", "all")  # one colour scale for every map
        tops = [float(m) for m in page.locator("canvas.map").evaluate_all("cs => cs.map(c => c.dataset.max)")]
        assert len(set(tops)) == 1 and tops[0] == pytest.approx(
            weights[:, 2, :, token, 1:].max().item(), abs=error
        )
        # a small multiple clicked becomes the large view
        page.locator("#grid canvas[data-layer='0'][data-head='1']").click()
        assert np.abs(shown(page, "#large") - weights[0, 2, 1, token, 1:].numpy()).max() <= error + 1e-6


@pytest.mark.slow
def test_rollout_and_gradient_rollout_are_the_library_s(browser, trained, command_page):
    model, data = trained[0].model, trained[1]
    images, _, _ = spread_test_images(data, 3)
    weights = attention_weights(model, images)
    held = page_json(command_page.read_text(encoding="utf-8"))
    error = held["quantisation"]["max_error"]
    with opened(browser, command_page) as page:
        show_image(page, 1)
        page.locator("#tokens button", has_text="class token").click()
        page.check("input[name=view][value=rollout]")
        for layer in range(2):
            rollout = attention_rollout(weights[: layer + 1, 1:2])[0, 0, 1:].numpy()  # the class token's row
            drawn = shown(page, f"#grid canvas[data-layer='{layer}']")
            assert np.abs(drawn - rollout).max() <= error["rollout"] + 1e-6
        click_patch(page, 3, 0)
        last = attention_rollout(weights[:, 1:2])[0, 1 + 12, 1:].numpy()
        drawn = shown(page, "#large")
        assert np.abs(drawn - last).max() <= error["rollout"] + 1e-6
        # the top of its colour scale: the largest value but the query's own (the identity's)
        assert float(page.locator("#large").get_attribute("data-max")) == pytest.approx(
            np.delete(drawn, 12).max()
        )
        # the second of the top classes, with its probability
        top = held["images"][1]["top"]
        label = page.locator("#classes label").nth(1)
        assert label.inner_text().strip() == f"{data.classes[top[1][0]]}: {100 * top[1][1]:.1f}%"
        label.locator("input").check()
        assert page.evaluate("document.body.dataset.view") == "grad-rollout"
        relevance = gradient_rollout(model, images[1:2], torch.tensor([top[1][0]]))[0, 1 + 12, 1:].numpy()
        assert np.abs(shown(page, "#large") - relevance).max() <= error["grad-rollout"] + 1e-6


def test_registers_are_tokens_beside_the_grid_not_patches(browser, tmp_path):
    torch.manual_seed(0)
    model = ViT(
        preset="micro", num_classes=3, image_size=(16, 24), patch_size=4, num_registers=2, distilled=True
    )
    images = torch.rand(2, 3, 16, 24)
    path = explore(model.eval(), images).save(tmp_path / "registers.html")
    weights = attention_weights(model, images)
    error = page_json(path.read_text(encoding="utf-8"))["quantisation"]["max_error"]["attention"]
    with opened(browser, path) as page:
        names = page.locator("#tokens button").all_inner_texts()
        assert names == ["class token", "distillation token", "register 0", "register 1"]
        page.locator("#tokens button", has_text="register 1").click()
        assert page.evaluate("document.body.dataset.query") == "3"
        drawn = shown(page, "#grid canvas[data-layer='1'][data-head='0']")
        assert drawn.shape == (4 * 6,)  # the patches only: no register drawn as a patch
        assert np.abs(drawn - weights[1, 0, 0, 3, 4:].numpy()).max() <= error + 1e-6
        share = float(page.locator("#grid canvas[data-layer='1'][data-head='0']").get_attribute("data-share"))
        assert share == pytest.approx(float(weights[1, 0, 0, 3, :4].sum()), abs=4 * error + 1e-6)
        assert "to prefix tokens (not drawn)" in page.inner_text("#large-prefix")


def test_the_keyboard_and_the_mouse_move_the_query(browser, command_page):
    with opened(browser, command_page) as page:
        query = lambda: int(page.evaluate("document.body.dataset.query"))  # noqa: E731
        assert query() == 0  # the class token first
        click_patch(page, 0, 0)
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowDown")
        assert query() == 1 + 1 * 4 + 1
        for _ in range(5):
            page.keyboard.press("ArrowLeft")  # stops at the edge
        assert query() == 1 + 1 * 4
        box = page.locator("#query-canvas").bounding_box()
        page.mouse.move(box["x"] + 3.5 * box["width"] / 4, box["y"] + 2.5 * box["height"] / 4)
        assert query() == 1 + 2 * 4 + 3  # hovering previews ...
        page.mouse.move(0, 0)
        assert query() == 1 + 1 * 4  # ... and leaving goes back to the clicked patch


def test_the_page_reads_base85_as_python_writes_it(browser):
    """Every length of the last group (0 to 3 bytes), and the largest values."""
    template = (Path(vit.__file__).parent / "interpret" / "page.html").read_text(encoding="utf-8")
    decoder = template[template.index("  const B85 =") : template.index("  const LUT = {};")]
    page = browser.new_page()
    page.evaluate(f"() => {{ window.bytes85 = (() => {{ {decoder} return bytes85; }})(); }}")
    for data in [bytes(range(n)) for n in range(9)] + [b"\xff" * 11, bytes(range(256))]:
        text = base64.b85encode(data).decode("ascii")
        assert bytes(page.evaluate("text => Array.from(window.bytes85(text))", text)) == data
    page.close()


def test_jupyter_shows_the_page_inline(browser, trained, tmp_path):
    model, data = trained[0].model, trained[1]
    cell = tmp_path / "cell.html"  # a notebook's output cell holds what _repr_html_ returns
    cell.write_text(f"<html><body>{explore(model, data.split('test')[:2][0])._repr_html_()}</body></html>")
    with opened(browser, cell, inline=True) as page:
        frame = page.frame_locator("iframe")
        assert frame.locator("#grid canvas.map").count() == 2 * (1 + 2)  # layers x (mean + heads)
        assert frame.locator("#title").inner_text() == "Where a ViT looks"


def test_a_model_without_class_token_or_head(browser, tmp_path):
    """timm's `*_reg4_gap_*` models: registers, no class token, the head reads the patches' mean;
    here without a head, as DINO-style backbones come: no class to explain."""
    torch.manual_seed(0)
    model = ViT(preset="micro", num_classes=0, image_size=16, patch_size=4, class_token=False, pool="mean",
                num_registers=2, fc_norm=True)  # fmt: skip
    images = torch.rand(2, 3, 16, 16)
    path = explore(model.eval(), images).save(tmp_path / "gap.html")
    with opened(browser, path) as page:
        names = page.locator("#tokens button").all_inner_texts()
        assert names == ["register 0", "register 1", "mean of the patches (what the head reads)"]
        assert page.evaluate("document.body.dataset.query") == "-1"  # it opens on what the head reads
        assert page.evaluate("document.body.dataset.view") == "rollout"
        assert page.locator("input[name=view][value=grad-rollout]").is_disabled()
        rollout = attention_rollout(attention_weights(model, images)[:, :1], num_prefix_tokens=2)
        error = page_json(path.read_text(encoding="utf-8"))["quantisation"]["max_error"]["rollout"]
        expected = pooled_maps(model, rollout)[0].flatten().numpy()  # the rows the head reads: their mean
        assert np.abs(shown(page, "#large") - expected).max() <= error + 1e-6


def test_scores_are_shown_when_given(browser, trained, tmp_path):
    model, data = trained[0].model, trained[1]
    images = data.split("test")[:1][0]
    caption = "</script><!-- <script> a & b"  # neither ends the page's data early
    plain = explore(model, images, captions=[caption]).save(tmp_path / "plain.html")
    scored = explore(model, images, scores={"rollout": {"deletion AUC": 0.21}}).save(tmp_path / "scored.html")
    with opened(browser, plain) as page:
        assert page.locator("#scores").is_hidden()
        assert page.locator("#images button").inner_text() == caption
    with opened(browser, scored) as page:
        assert (
            page.locator("#scores table").inner_text().split() == "method deletion AUC rollout 0.21".split()
        )


def test_a_screenshot_for_the_readme(browser, command_page):
    with opened(browser, command_page, size=(1180, 640)) as page:
        show_image(page, 1)
        click_patch(page, 2, 2)  # a circle's patch
        page.screenshot(path=SCREENSHOT)
    assert SCREENSHOT.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_the_heads_grid_is_shown_when_given_and_a_click_opens_a_head(browser, trained, tmp_path):
    model = trained[0].model
    images = trained[1].split("test")[:1][0]
    layers, heads = len(model.blocks), model.config.heads
    values = [[-0.1 * (layer + h) for h in range(heads)] for layer in range(layers)]
    intervals = [[[v - 0.02, v + 0.01] for v in row] for row in values]
    effects = {"title": "mean ablation", "values": values, "intervals": intervals}
    plain = explore(model, images, MapSpec("rollout")).save(tmp_path / "plain.html")
    with_heads = explore(model, images, MapSpec("rollout"), head_effects=effects).save(
        tmp_path / "heads.html"
    )
    with opened(browser, plain) as page:
        assert page.locator("#heads").is_hidden()
    with opened(browser, with_heads) as page:
        assert page.locator("#heads td").count() == layers * heads
        assert page.locator("#heads-title").inner_text().startswith("mean ablation")
        cell = page.locator(f"#heads td[data-layer='{layers - 1}'][data-head='{heads - 1}']")
        value = values[-1][-1]
        expected = f"{value:.3f}, 95% interval [{value - 0.02:.3f}, {value + 0.01:.3f}]"
        assert cell.get_attribute("title") == expected
        cell.click()
        assert page.evaluate("document.body.dataset.view") == "attention"
        large = page.locator("#large")
        assert (large.get_attribute("data-layer"), large.get_attribute("data-head")) == (
            str(layers - 1),
            str(heads - 1),
        )
    with pytest.raises(UsageError, match="not of this model's"):
        explore(model, images, head_effects={"title": "x", "values": values[:-1]})
    with pytest.raises(UsageError, match="not of this model's"):
        explore(model, images, head_effects={"title": "x", "values": values, "intervals": intervals[:-1]})
