"""vit: a Vision Transformer written from scratch, trained with Lightning."""

from vit.classifier import Classifier, CNNClassifier, ViTClassifier
from vit.data import TwoCircles
from vit.model import PRESETS, ViT, build_vit

__all__ = ["PRESETS", "Classifier", "CNNClassifier", "TwoCircles", "ViT", "ViTClassifier", "build_vit"]
