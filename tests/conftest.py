from pathlib import Path

import pytest


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Where a test's training runs go; the tests check it stays absent after bad input."""
    return tmp_path / "runs"
