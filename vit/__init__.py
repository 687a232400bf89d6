"""vit: a Vision Transformer written from scratch, trained with Lightning."""

from vit.classifier import ViTClassifier
from vit.data import TwoCircles
from vit.model import PRESETS, ViT, build_vit

__all__ = ["PRESETS", "TwoCircles", "ViT", "ViTClassifier", "build_vit"]
