"""Old name of `vit.datamodules`, kept so that configs and checkpoints naming
`vit.images.CIFAR10`, `vit.images.ImageFolders` or `vit.images.FashionMNIST` still load."""

from vit.datamodules import CIFAR10, FashionMNIST, ImageFolders

__all__ = ["CIFAR10", "FashionMNIST", "ImageFolders"]
