"""vit: a Vision Transformer written from scratch, trained with Lightning.

The names below are imported on first use (PEP 562), not when `vit` is: importing Lightning and
torchmetrics takes seconds, and the commands import `vit.commands.*`, which imports this package,
so an eager import here would make every `--help` that slow. `from vit import ViT` works as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# name -> the module that defines it
_EXPORTS = {
    "CIFAR10": "vit.datamodules",
    "PRESETS": "vit.config",
    "Classifier": "vit.classifier",
    "CNNClassifier": "vit.classifier",
    "FashionMNIST": "vit.datamodules",
    "ImageFolders": "vit.datamodules",
    "Preparation": "vit.preparation",
    "TwoCircles": "vit.two_circles",
    "ViT": "vit.model",
    "ViTClassifier": "vit.classifier",
    "ViTConfig": "vit.config",
    "explore": "vit.interpret.explore",
    "load_pretrained": "vit.pretrained",
}

__all__ = [
    "CIFAR10",
    "PRESETS",
    "Classifier",
    "CNNClassifier",
    "FashionMNIST",
    "ImageFolders",
    "Preparation",
    "TwoCircles",
    "ViT",
    "ViTClassifier",
    "ViTConfig",
    "explore",
    "load_pretrained",
]

if TYPE_CHECKING:  # what linters and editors see; at run time `__getattr__` imports on demand
    from vit.classifier import Classifier, CNNClassifier, ViTClassifier
    from vit.config import PRESETS, ViTConfig
    from vit.datamodules import CIFAR10, FashionMNIST, ImageFolders
    from vit.interpret.explore import explore
    from vit.model import ViT
    from vit.preparation import Preparation
    from vit.pretrained import load_pretrained
    from vit.two_circles import TwoCircles


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vit' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # the next lookup finds it without calling this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
