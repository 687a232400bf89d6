"""Modules renamed for what they hold keep their old import paths: `vit.explanations` (now
`vit.faithfulness`) and `vit.explorer` (now `vit.page`) give the same objects."""

import importlib
import inspect

import pytest


def own_names(module) -> set[str]:
    """The public names a module defines (not those it imports)."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not inspect.ismodule(value)
        and getattr(value, "__module__", module.__name__) == module.__name__
    }


@pytest.mark.parametrize(
    "old, new, used",
    [
        ("vit.explanations", "vit.faithfulness", {"score", "METHODS", "headline", "evidence_mass"}),
        ("vit.explorer", "vit.page", {"explore", "Explorer", "quantise"}),
    ],
)
def test_an_old_module_path_gives_the_objects_of_the_new_one(old, new, used):
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    offered = {name for name in vars(old_module) if not name.startswith("_")}
    # the statistics and device_of left vit.faithfulness; the old path still offers them
    moved = own_names(importlib.import_module("vit.stats")) | {"device_of"}
    assert used <= offered <= own_names(new_module) | moved
    for name in offered:
        assert getattr(old_module, name) is getattr(new_module, name), name


def test_vit_explore_is_the_function_of_the_page_module():
    import vit
    import vit.page

    assert vit.explore is vit.page.explore and callable(vit.explore)
