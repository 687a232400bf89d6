"""Screenshots of TensorBoard showing a run's attention pictures and its evidence curve: the pictures
at the run's first step and at its last, beside val/acc and val/evidence_mass_rollout.

    vit-train fit --config configs/two_circles.yaml --trainer.logger TensorBoardLogger \\
        --trainer.logger.init_args.name demo --trainer.logger.init_args.version train
    python tools/tensorboard_screenshots.py runs/demo --out docs/watching

Starts `tensorboard --logdir LOGDIR` on a free port of 127.0.0.1, opens its time-series page in
Debian's Chromium driven by Playwright (`apt-get install chromium`), shows the cards of `--tags`
with the pictures at their actual size (TensorBoard's curves: the faint line is the values, the
dark one their smoothed mean), and writes
OUT/tensorboard_step0.png and OUT/tensorboard_end.png (the pictures' slider at its two ends).
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TAGS = "attention|evidence_mass_rollout|val/acc"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(logdir: Path, port: int) -> subprocess.Popen:
    """TensorBoard on 127.0.0.1:`port`, once it answers."""
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", str(port),
               "--host", "127.0.0.1"]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(240):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            return server
        except OSError:
            if server.poll() is not None:
                raise SystemExit(f"error: tensorboard --logdir {logdir} stopped") from None
            time.sleep(0.25)
    server.terminate()
    raise SystemExit("error: TensorBoard did not answer in 60 s")


def screenshots(url: str, out: Path, tags: str, chromium: str) -> list[Path]:
    from playwright.sync_api import sync_playwright

    written = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": 1400, "height": 960})
        page.goto(f"{url}/?darkMode=false#timeseries", wait_until="networkidle")
        page.get_by_label("Ignore outliers in chart scaling").uncheck()  # the first point counts
        page.get_by_role("button", name="Settings").first.click()  # hides the settings pane
        page.get_by_role("combobox", name="Filter tags (regex)").fill(tags)
        page.keyboard.press("Escape")
        page.wait_for_timeout(2000)
        page.get_by_label("Toggle actual image size").first.click()
        slider = page.locator("input[type=range]").first
        for key, name in (("Home", "tensorboard_step0.png"), ("End", "tensorboard_end.png")):
            slider.focus()
            page.keyboard.press(key)
            page.wait_for_timeout(2000)
            out.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=out / name)
            written.append(out / name)
        browser.close()
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logdir", type=Path, help="TensorBoard's --logdir: a run, or a folder of runs")
    parser.add_argument("--out", type=Path, required=True, help="the folder for the two PNGs")
    parser.add_argument("--tags", default=TAGS, help=f"the cards shown, a regex (default {TAGS})")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args(argv)
    if not list(args.logdir.rglob("events.out.tfevents.*")):
        raise SystemExit(f"error: no TensorBoard events under {args.logdir}")
    port = free_port()
    server = serve(args.logdir, port)
    try:
        for path in screenshots(f"http://127.0.0.1:{port}", args.out, args.tags, args.chromium):
            print(f"wrote {path}")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
