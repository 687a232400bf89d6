"""vit: a Vision Transformer written from scratch, trained with Lightning."""

from vit.classifier import Classifier, CNNClassifier, ViTClassifier
from vit.datamodules import CIFAR10, FashionMNIST, ImageFolders
from vit.model import PRESETS, ViT, build_vit
from vit.preparation import Preparation
from vit.pretrained import load_pretrained
from vit.two_circles import TwoCircles

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
    "build_vit",
    "load_pretrained",
]
