"""vit: a Vision Transformer written from scratch, trained with Lightning."""

from vit.classifier import Classifier, CNNClassifier, ViTClassifier
from vit.config import PRESETS, ViTConfig
from vit.datamodules import CIFAR10, FashionMNIST, ImageFolders
from vit.model import ViT
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
    "ViTConfig",
    "load_pretrained",
]
