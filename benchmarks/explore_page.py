"""The page of `vit-attention --html` (`vit.explore`): its weight, the time to write it, to open and
draw it in headless Chromium, and to redraw every small multiple when the query changes.

    python benchmarks/explore_page.py --ckpt runs/demo/train/checkpoints/best.ckpt   # after make demo
    python benchmarks/explore_page.py --ckpt best.ckpt --timm vit_small_patch16_224 --timm-images 8

Two models: a vit-train checkpoint's over --num-images test images (spread over the test split,
as vit-attention takes them), and a timm model built with random weights (nothing downloaded)
over random images. Targets, on 2 cores: the demo model's page with 16 images under
about 1 MB; vit_small_patch16_224 (12 layers, 6 heads, 197 tokens) with 8 images under about
30 MB, written in at most about 30 s, open and drawn in at most 3 s, a change of query redrawing
every small multiple in at most 50 ms.

The page times itself with performance.now(): `open` from navigation to the first map drawn,
`redraw` the script's drawing of one query (every small multiple, the large map, the image and
its tokens), `frame` from the start of that drawing to the next animation frame. Each query
change is an arrow key, as a user moves the query. Needs Playwright (pip install playwright)
and a Chromium (Debian: apt-get install chromium).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from vit.checkpoint import load_checkpoint, load_network
from vit.datamodules import spread_test_images
from vit.interpret.explore import explore

# the page's timings once the query's drawing is on screen (two animation frames later)
TIMINGS = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => done(window.explore.timings))))"  # noqa: E501


def checkpoint_case(path: Path, n: int):
    """A vit-train checkpoint's model and `n` of its test images, as vit-attention --html takes them."""
    classifier, datamodule = load_checkpoint(path)
    images, labels, indices = spread_test_images(datamodule, n)
    names = [str(c) for c in datamodule.classes]
    captions = [f"test {i}, true {names[y]}" for i, y in zip(indices, labels.tolist(), strict=True)]
    return classifier.model, images, captions, names


def timm_case(name: str, n: int):
    """timm's `name` with random weights (given as a file: nothing downloaded) and `n` random images."""
    import timm
    from safetensors.torch import save_file

    source = timm.create_model(name, pretrained=False)
    with tempfile.TemporaryDirectory() as folder:
        weights = Path(folder) / "weights.safetensors"
        save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(weights))
        model, preparation = load_network(model=f"timm:{name}", weights=weights)
    images = torch.rand(n, 3, *model.image_size, generator=torch.Generator().manual_seed(0))
    return model, images, [f"random {i}" for i in range(n)], list(preparation.classes)


def measure(browser, case, path: Path, queries: int) -> dict:
    """Write the page of `case`, open it, move the query `queries` times; sizes and times."""
    model, images, captions, names = case
    started = time.perf_counter()
    explore(model, images, captions=captions, class_names=names).save(path)
    written = time.perf_counter() - started
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    problems = []
    context.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
    page = context.new_page()
    page.on("request", lambda r: None if r.url.startswith(("file:", "data:")) else problems.append(r.url))
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.goto(path.resolve().as_uri())
    page.wait_for_selector("body[data-ready=true]", timeout=60_000)
    opened = page.evaluate("window.explore.timings.open")
    redraws, frames = [], []
    for i in range(queries):  # right along the first row, then down: a new patch each time
        page.keyboard.press("ArrowRight" if i % 4 else "ArrowDown")
        timings = page.evaluate(TIMINGS)
        redraws.append(timings["redraw"])
        frames.append(timings["frame"])
    context.close()
    if problems:
        raise SystemExit(f"error: the page of {path} asked the network or logged errors: {problems[:3]}")
    return {
        "images": len(images),
        "tokens": model.num_prefix_tokens + model.grid_size[0] * model.grid_size[1],
        "megabytes": path.stat().st_size / 1e6,
        "write_s": written,
        "open_ms": opened,
        "redraw_ms": (statistics.median(redraws), max(redraws)),
        "frame_ms": (statistics.median(frames), max(frames)),
    }


def machine(browser) -> str:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        cpu = next(
            line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")
        )
    except (OSError, StopIteration):
        cpu = "CPU unknown"
    return (
        f"{cpu}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}; Chromium {browser.version}"
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ckpt", type=Path, default=None, help="a vit-train checkpoint (the demo's best.ckpt)"
    )
    parser.add_argument("--num-images", type=int, default=16, help="its test images")
    parser.add_argument(
        "--timm", default="vit_small_patch16_224", help="a timm ViT, random weights; '' for none"
    )
    parser.add_argument("--timm-images", type=int, default=8)
    parser.add_argument("--queries", type=int, default=20, help="query changes timed per page")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--out", type=Path, default=Path("runs/explore_page"), help="where the pages go")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cases = {}
    if args.ckpt is not None:
        cases[f"checkpoint {args.ckpt.name}"] = lambda: checkpoint_case(args.ckpt, args.num_images)
    if args.timm:
        cases[f"timm {args.timm}"] = lambda: timm_case(args.timm, args.timm_images)
    if not cases:
        raise SystemExit("error: nothing to measure: give --ckpt or --timm")
    from playwright.sync_api import sync_playwright

    results = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=args.chromium)
        print(f"machine: {machine(browser)}")
        header = "images tokens page MB write s open ms  redraw ms (median, max)  frame ms (median, max)"
        print(f"{'model':34} {header}")
        for name, case in cases.items():
            path = args.out / f"{name.split()[-1].replace('.', '_')}.html"
            r = results[name] = measure(browser, case(), path, args.queries)
            redraw, frame = (f"{median:.1f}, {most:.1f}" for median, most in (r["redraw_ms"], r["frame_ms"]))
            print(
                f"{name:34} {r['images']:6d} {r['tokens']:6d} {r['megabytes']:7.2f} {r['write_s']:7.1f} "
                f"{r['open_ms']:7.0f}  {redraw:>23}  {frame:>22}"
            )
        browser.close()
    print(f"pages in {args.out}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
