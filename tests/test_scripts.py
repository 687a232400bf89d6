"""Every script of the checkout (benchmarks/, studies/, tools/, lab/, train.py) starts as a file:
`python SCRIPT --help` prints its usage and exits 0. The other tests run most scripts in their own
process (`run_in_process`), which calls their `main` and skips the `if __name__ == "__main__"` line
and the script's own way to its imports; this covers those, with one Python start for them all."""

import subprocess
import sys

import pytest
from helpers import ROOT

FOLDERS = ("benchmarks", "studies", "tools", "lab")
NO_HELP = {"benchmarks/bf16_inference.py"}  # no options: run as a file, it runs the benchmark


def scripts() -> list[str]:
    files = [ROOT / "train.py", *(f for folder in FOLDERS for f in sorted((ROOT / folder).rglob("*.py")))]
    found = [f.relative_to(ROOT).as_posix() for f in files if 'if __name__ == "__main__":' in f.read_text()]
    return [f for f in found if f not in NO_HELP]


def test_the_scripts_are_found():
    found = scripts()
    assert {"train.py", "benchmarks/gpu_check.py", "studies/two_circles/two_circles.py",
            "tools/demo_seeds.py", "lab/cifar10_pack.py"} <= set(found)  # fmt: skip


@pytest.mark.slow
def test_every_script_answers_help_as_a_file(tmp_path):
    """Each script as `python SCRIPT --help` runs it: its folder first on the path, `__main__` its
    name, from another folder; one Python for all (the modules one imports stay for the next)."""
    code = """
import contextlib, io, runpy, sys
from pathlib import Path
failed = []
for script in sys.argv[1:]:
    sys.argv, sys.path[0] = [script, "--help"], str(Path(script).parent)
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            runpy.run_path(script, run_name="__main__")
            status = 0
        except SystemExit as exit:
            status = exit.code
        except BaseException as error:
            status = repr(error)
    if status != 0 or "usage:" not in out.getvalue():
        failed.append(f"{script}: {status} {err.getvalue()[-500:]}")
print("\\n".join(failed))
"""
    paths = [str(ROOT / script) for script in scripts()]
    result = subprocess.run(
        [sys.executable, "-c", code, *paths], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "", result.stdout
