"""Old name of `vit.two_circles`, kept so that configs and checkpoints naming
`vit.data.TwoCircles` still load."""

from vit.two_circles import TwoCircles

__all__ = ["TwoCircles"]
