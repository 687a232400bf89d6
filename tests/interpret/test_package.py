"""The layering of vit/interpret/ that its __init__ states: each module imports from vit.interpret
only the modules its line there names (`explore ... <- maps`), so head_analysis and
activation_patching never reach score, and hooks, stats and figures stand on nothing of the package."""

import ast
import re
from pathlib import Path

import vit.interpret

PACKAGE = Path(vit.interpret.__file__).parent


def stated() -> dict[str, set[str]]:
    """Module -> the modules it may import, from the docstring's lines `name  text  <- a, b`."""
    found = {}
    for line in (vit.interpret.__doc__ or "").splitlines():
        match = re.match(r"^    (\w+)\s.*?(?:<-\s*(.*))?$", line)
        if match:
            found[match[1]] = {name.strip() for name in (match[2] or "").split(",") if name.strip()}
    return found


def imported(module: str) -> set[str]:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vit.interpret."):
            names.add(node.module.split(".")[2])
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[2] for a in node.names if a.name.startswith("vit.interpret.")}
    return names


def test_every_module_imports_only_what_the_package_says():
    allowed = stated()
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert sorted(allowed) == modules  # the docstring has a line for every module, and only them
    for module in modules:
        assert imported(module) <= allowed[module], module
    assert "score" not in allowed["head_analysis"] | allowed["activation_patching"]
    assert not allowed["hooks"] and not allowed["stats"] and not allowed["figures"]
