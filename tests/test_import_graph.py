"""The modules of vit import one another without a cycle. Read from their source with `ast`, imports
inside functions (and under TYPE_CHECKING) included: an import deferred to a function closes a
cycle all the same, only later and further from where it was written. A package's `__init__` runs
before its modules, but vit's imports none of them when it runs (its names are imported on first
use), so that is no edge. Imports made at run time from data (`importlib`: an old class path
through `vit.compat.moved_class`, a data module a user names) are not read."""

import ast
from pathlib import Path

from helpers import ROOT


def module_name(path: Path, folder: Path, package: str) -> str:
    """The name of the module at `path` in `folder`, the package named `package`."""
    parts = [package, *path.relative_to(folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_among(folder: Path, package: str) -> dict[str, set[str]]:
    """Each module of `folder`, the package named `package`, and of its subpackages -> the modules
    of that package it imports, wherever the import stands (absolute or relative)."""
    paths = {module_name(p, folder, package): p for p in folder.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        found = set()
        # a relative import counts from the module's package: itself for an __init__
        parts = name.split(".") if path.stem == "__init__" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
                base = ".".join(filter(None, [base, node.module]))
                # `from P import m` takes the module P.m where there is one, else a name of P
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names}
        graph[name] = (found & set(paths)) - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as the modules along it, the first again at the end; None if none."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for imported in sorted(graph[module]):
            if (cycle := visit(imported, [*path, module])) is not None:
                return cycle
        done.add(module)
        return None

    for module in sorted(graph):
        if (cycle := visit(module, [])) is not None:
            return cycle
    return None


def test_the_vit_modules_import_one_another_without_a_cycle():
    folder = ROOT / "vit"
    graph = imports_among(folder, "vit")
    assert len(graph) == len(list(folder.rglob("*.py")))
    assert {"vit.optim", "vit.captured_step", "vit.teacher"} <= graph["vit.classifier"]  # edges are read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_a_cycle_closed_inside_a_function_or_by_a_relative_import_is_found(tmp_path):
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("from pkg.b import f\n")
    (tmp_path / "b.py").write_text("def f():\n    from . import a\n")
    (tmp_path / "c.py").write_text("import pkg.a\n")
    graph = imports_among(tmp_path, "pkg")
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    (tmp_path / "b.py").write_text("def f():\n    from pkg import NAME\n")  # a name of pkg: no cycle
    assert find_cycle(imports_among(tmp_path, "pkg")) is None


def test_a_cycle_through_a_subpackage_is_found(tmp_path):
    """A subpackage's modules are read too, their relative imports from the subpackage."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("from pkg.sub import c\n")
    (tmp_path / "sub" / "__init__.py").write_text("from . import c\n")
    (tmp_path / "sub" / "c.py").write_text("def f():\n    from .. import a\n    from . import d\n")
    (tmp_path / "sub" / "d.py").write_text("")
    graph = imports_among(tmp_path, "pkg")
    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.sub.c"},
        "pkg.sub": {"pkg.sub.c"},
        "pkg.sub.c": {"pkg.a", "pkg.sub.d"},
        "pkg.sub.d": set(),
    }
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.c", "pkg.a"]
