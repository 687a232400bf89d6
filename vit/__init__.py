"""vit: a Vision Transformer written from scratch, trained with Lightning."""

from vit.classifier import Classifier, CNNClassifier, ViTClassifier
from vit.data import TwoCircles
from vit.images import CIFAR10, FashionMNIST, ImageFolders
from vit.model import PRESETS, ViT, build_vit

__all__ = [
    "CIFAR10",
    "PRESETS",
    "Classifier",
    "CNNClassifier",
    "FashionMNIST",
    "ImageFolders",
    "TwoCircles",
    "ViT",
    "ViTClassifier",
    "build_vit",
]
