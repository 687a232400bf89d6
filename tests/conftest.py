from pathlib import Path

import pytest
import torch
from helpers import save_as_vit_train
from s3_fixtures import own_s3_server, refusing_s3, restartable_s3, s3, s3_server  # noqa: F401

from vit import TwoCircles, ViTClassifier, ViTConfig


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Where a test's training runs go; the tests check it stays absent after bad input."""
    return tmp_path / "runs"


@pytest.fixture(scope="session")
def trained() -> tuple[ViTClassifier, TwoCircles]:
    """A micro ViT trained for a second or two on two circles (4x4 patches of 8 pixels), in eval
    mode, and its data module with the train and test splits made."""
    torch.manual_seed(0)
    data = TwoCircles(num_train=512, num_val=64, num_test=64, batch_size=64)
    data.setup("fit")
    data.setup("test")
    model = ViTClassifier(
        num_classes=4, image_size=32, in_channels=1, vit=ViTConfig(preset="micro", patch_size=8)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    images, labels = data.splits["train"].images, data.splits["train"].labels
    losses = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: thread hand-offs cost more than they save
    for _ in range(4):
        for x, y in zip(images.split(64), labels.split(64), strict=True):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    torch.set_num_threads(threads)
    assert sum(losses[-8:]) < sum(losses[:8]), "the tiny model did not learn"
    return model.eval(), data


@pytest.fixture(scope="session")
def trained_checkpoint(trained, tmp_path_factory) -> Path:
    """The trained model saved as vit-train saves it today: weights, its hyperparameters and its
    data module's (with the class paths LightningCLI records), the preparation of its images and
    the format version (tests/test_compat.py reads the files of older versions)."""
    model, data = trained
    path = tmp_path_factory.mktemp("trained") / "tiny.ckpt"
    save_as_vit_train(model, data, path)
    return path


@pytest.fixture(scope="session")
def chromium() -> str:
    """The path of a Chromium that Playwright can drive (Debian's: `apt-get install chromium`;
    Playwright's own browser download is not needed). Without one, the tests that use it skip
    with one line naming what to install; on CI (CI set) they fail instead."""
    import importlib.util
    import os
    import shutil

    path = shutil.which("chromium") or "/usr/bin/chromium"
    missing = [
        *([] if importlib.util.find_spec("playwright") else ["playwright (pip install playwright)"]),
        *([] if Path(path).is_file() else ["chromium (apt-get install chromium)"]),
    ]
    if missing:
        message = f"no browser for the page tests: install {' and '.join(missing)}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def browser(chromium):
    """A headless Chromium, driven by Playwright, for the whole session."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        yield browser
        browser.close()
