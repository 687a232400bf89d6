"""Every notebook runs top to bottom, with its `parameters` cell made small (as papermill does)."""

import json
from pathlib import Path

import matplotlib
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
SMALL = {"num_train": 512, "max_epochs": 1, "preset": "micro"}

pytestmark = pytest.mark.slow  # each notebook trains a model


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    assert any("parameters" in c["metadata"].get("tags", []) for c in cells), "no parameters cell"
    namespace: dict = {}
    for cell in cells:
        exec(compile("".join(cell["source"]), f"{path.name}", "exec"), namespace)
        if "parameters" in cell["metadata"].get("tags", []):
            namespace.update({k: v for k, v in SMALL.items() if k in namespace})
