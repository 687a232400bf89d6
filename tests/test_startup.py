"""Starting a command is quick: `import vit` and vit-eval, vit-attention, vit-export and vit-chunks
up to their --help import none of torch, Lightning, torchmetrics, transformers or matplotlib, which
take seconds to import. Checked by what a fresh interpreter imported, not by a clock."""

import importlib
import os
import subprocess
import sys

import pytest
from helpers import ROOT
from lightning.fabric.utilities.exceptions import MisconfigurationException

import vit
from vit.commands.base import run_command

HEAVY = ("torch", "lightning", "torchmetrics", "transformers", "matplotlib")


def heavy_modules_imported_by(code: str) -> list[str]:
    """Run `code` in a fresh Python that imports this checkout's vit; the HEAVY modules it imported."""
    check = f"import sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", f"{code}\n{check}"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\n")[-2].split()


@pytest.mark.slow
def test_import_vit_imports_its_names_on_first_use():
    assert heavy_modules_imported_by("import vit") == []
    imported = heavy_modules_imported_by("from vit import Preparation")  # its module only
    assert "torch" in imported and "lightning" not in imported


def test_the_commands_answer_help_without_torch_or_lightning():
    code = """
import contextlib, io
from vit.commands import attention, chunks, eval, export
for main, args in ((eval.main, []), (eval.main, ["predict"]), (eval.main, ["curves"]), (attention.main, []),
                   (export.main, []), (chunks.main, [])):
    with contextlib.redirect_stdout(io.StringIO()) as help, contextlib.suppress(SystemExit):
        main([*args, "--help"])
    assert "usage:" in help.getvalue(), help.getvalue()
"""
    assert heavy_modules_imported_by(code) == []


def test_every_lazy_name_is_the_object_of_its_module():
    assert set(vit.__all__) == set(vit._EXPORTS)
    for name, module in vit._EXPORTS.items():
        if name != "ViTConfig":  # vit.config is being written
            assert getattr(vit, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        vit.nothing  # noqa: B018


def test_the_head_fusions_of_the_help_are_those_of_vit_attention():
    from vit.commands.attention import HEAD_FUSION_NAMES
    from vit.interpret.maps import HEAD_FUSIONS

    assert HEAD_FUSION_NAMES == tuple(HEAD_FUSIONS)


def test_lightning_misconfiguration_is_bad_usage_and_a_bug_propagates(capsys):
    """run_command, which no longer imports Lightning, still makes its MisconfigurationException
    exit status 2; any other exception is not the user's and propagates."""

    def raise_(error: Exception):
        raise error

    with pytest.raises(SystemExit) as exit:
        run_command(raise_, MisconfigurationException("bad option"))
    assert exit.value.code == 2 and capsys.readouterr().err == "error: bad option\n"
    with pytest.raises(RuntimeError, match="a bug"):
        run_command(raise_, RuntimeError("a bug"))
