"""The two-circles data: two identical circles whose relative placement is the label.

Like every data module here, `TwoCircles` exposes `num_classes`, `image_size`, `in_channels` and
`classes` (the CLI links the first three into the model, so a config names them once), `split(name)`
(the one way to read a split) and `preparation` (how an image file becomes model input). Its
setup and loaders are those of every data module (`vit.datamodules.InMemoryDataModule`); this
module only generates the images."""

from __future__ import annotations

import math
from typing import Literal

import torch

from vit.datamodules import InMemory, InMemoryDataModule
from vit.errors import UsageError, require
from vit.preparation import Preparation

# Orientation (degrees) of the line joining the two centres, per class; y points up as in maths.
ORIENTATIONS = {4: (0, 45, 90, 135), 2: (45, 135)}
SPLITS = ("train", "val", "test", "far", "held_out")  # in the order of their generators' seeds
ORIENTATION_NAMES = {0: "horizontal -", 45: "diagonal /", 90: "vertical |", 135: "diagonal \\"}


def torus_delta(a: torch.Tensor, b: torch.Tensor, period: float | None) -> torch.Tensor:
    """b - a, the shortest way round a wrap-around canvas of side `period` (in
    [-period/2, period/2)); plain b - a when `period` is None."""
    if period is None:
        return b - a
    return torch.remainder(b - a + period / 2, period) - period / 2


def pixel_offsets(
    points: torch.Tensor, image_size: int, period: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets from `points` (..., 2) as (x, y) pixels to every pixel centre of the image:
    dx (..., 1, W) and dy (..., H, 1), the shortest way round when `period` is given."""
    coords = torch.arange(image_size, dtype=torch.float32) + 0.5
    dx = torus_delta(points[..., 0, None, None], coords[None, :], period)
    dy = torus_delta(points[..., 1, None, None], coords[:, None], period)
    return dx, dy


def make_two_circles(
    n: int,
    image_size: int = 32,
    radius: float = 2.5,
    separation: tuple[float, float] = (7.0, 11.0),
    angle_jitter: float = 10.0,
    noise: float = 0.05,
    num_classes: int = 4,
    max_distractors: int = 0,
    midpoints: str = "all",
    wrap: bool = True,
    separation_metric: Literal["euclidean", "chebyshev"] = "euclidean",
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`n` images (n, 1, H, W) in [0, 1] with two identical anti-aliased filled circles; their
    labels; and the circle centres (n, 2, 2) as (x, y) pixels.

    The label is the orientation of the line joining the centres (`ORIENTATIONS`), +-`angle_jitter`
    degrees; the separation is drawn from the same range for every class, as the distance between
    the centres (`separation_metric` "euclidean") or as the larger of its x and y parts
    ("chebyshev", what square receptive fields see: then no class has closer circles along x or
    y than another, which the Euclidean distance would give the diagonals). With `wrap` the canvas
    wraps around (a torus): the midpoint is uniform, so each circle's position is uniform whatever
    the class, and a circle that crosses an edge comes back on the other side. Without it, the
    midpoint is uniform over the places that keep both circles inside the image, which makes
    positions near the edges slightly class-dependent (a horizontal pair cannot sit at the far
    left): a leak that a CNN with zero padding can use. `max_distractors` hollow squares
    (0 to that many per image, uniform, independent of the label) add clutter. `midpoints` is
    "all", or "outside"/"inside" the held-out square [0, size/4)^2 of midpoints.
    """
    labels, centres, clutter, grain = draw_two_circles(
        n, image_size, radius, separation, angle_jitter, noise, num_classes, max_distractors, midpoints,
        wrap, separation_metric, generator,
    )  # fmt: skip
    return render(centres, clutter, grain, radius, wrap), labels, centres


def draw_two_circles(
    n: int,
    image_size: int = 32,
    radius: float = 2.5,
    separation: tuple[float, float] = (7.0, 11.0),
    angle_jitter: float = 10.0,
    noise: float = 0.05,
    num_classes: int = 4,
    max_distractors: int = 0,
    midpoints: str = "all",
    wrap: bool = True,
    separation_metric: Literal["euclidean", "chebyshev"] = "euclidean",
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What `make_two_circles` draws from its generator, before it renders the images: labels (n,),
    circle centres (n, 2, 2), the distractors' ink (n, 1, H, W) and the noise (n, 1, H, W). The
    same generator state gives the same draws, so an image can be rendered again with its circles
    moved and everything else as it was (`TwoCircles.counterfactuals`)."""
    g = generator
    size = float(image_size)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    degrees = torch.tensor(ORIENTATIONS[num_classes], dtype=torch.float32)[labels]
    angle = torch.deg2rad(degrees + (torch.rand(n, generator=g) * 2 - 1) * angle_jitter)
    dist = separation[0] + torch.rand(n, generator=g) * (separation[1] - separation[0])
    if separation_metric == "chebyshev":
        dist = dist / torch.maximum(angle.cos().abs(), angle.sin().abs())
    elif separation_metric != "euclidean":
        raise UsageError(f"separation_metric must be 'euclidean' or 'chebyshev', got {separation_metric!r}")
    # Image rows grow downwards, so "/" (45 deg) goes right and up: the y offset is -sin.
    offset = torch.stack((dist * torch.cos(angle), -dist * torch.sin(angle)), dim=1)  # (n, 2) x, y
    mid = torch.rand(n, 2, generator=g) * size
    if not wrap:
        require(midpoints == "all", "held-out midpoints need the wrap-around canvas")
        lo, hi = radius + 0.5, size - radius - 0.5
        half = offset.abs() / 2
        mid = lo + half + mid / size * (hi - lo - 2 * half)
    elif midpoints == "inside":
        mid = mid / 4
    elif midpoints == "outside":
        while (held := (mid < size / 4).all(dim=1)).any():
            mid[held] = torch.rand(int(held.sum()), 2, generator=g) * size
    elif midpoints != "all":
        raise UsageError(f"midpoints must be 'all', 'inside' or 'outside', got {midpoints!r}")
    centres = torch.remainder(torch.stack((mid - offset / 2, mid + offset / 2), dim=1), size)

    period = size if wrap else None
    clutter = torch.zeros(n, 1, image_size, image_size)
    if max_distractors:
        count = torch.randint(0, max_distractors + 1, (n, 1), generator=g)
        where = torch.rand(n, max_distractors, 2, generator=g) * size
        dx, dy = pixel_offsets(where, image_size, period)
        box = torch.maximum(dx.abs(), dy.abs())  # Chebyshev distance: squares
        outline = (radius + 0.5 - box).clamp(0, 1) - (radius - 0.5 - box).clamp(0, 1)
        active = (torch.arange(max_distractors) < count)[..., None, None]  # (n, k, 1, 1)
        clutter = (outline * active).amax(dim=1, keepdim=True)
    return labels, centres, clutter, noise * torch.randn(clutter.shape, generator=g)


def render(
    centres: torch.Tensor, clutter: torch.Tensor, grain: torch.Tensor, radius: float, wrap: bool = True
) -> torch.Tensor:
    """Images (n, 1, H, W) in [0, 1]: the two circles at `centres` (n, 2, 2), anti-aliased (each
    pixel's coverage linear over one pixel at the edge), over the distractors' ink `clutter`,
    plus the noise `grain`, clipped."""
    image_size = clutter.shape[-1]
    dx, dy = pixel_offsets(centres, image_size, float(image_size) if wrap else None)
    ink = (radius + 0.5 - (dx**2 + dy**2).sqrt()).clamp(0, 1).amax(dim=1, keepdim=True)
    return (torch.maximum(ink, clutter) + grain).clamp(0, 1)


class TwoCircles(InMemoryDataModule):
    """Two identical circles whose relative placement is the label; generated, no files needed.

    Deterministic from `seed`: each split has its own generator, so the validation and test sets
    do not change when the training set size does. `test_split` picks what `test` measures:
    "iid" (same distribution as training), "far" (separations in `far_separation`, beyond the
    training range) or "held_out" (midpoints in the square that `holdout_midpoints` kept out of
    training and validation).
    """

    in_channels = 1

    def __init__(
        self,
        image_size: int = 32,
        radius: float = 2.5,
        separation: tuple[float, float] = (7.0, 11.0),
        far_separation: tuple[float, float] = (11.0, 15.0),
        angle_jitter: float = 10.0,  # degrees; bins are 45 apart, so 25 degrees separate classes
        noise: float = 0.05,
        num_classes: Literal[2, 4] = 4,
        max_distractors: int = 0,
        wrap: bool = True,  # a wrap-around canvas: circle positions independent of the class
        separation_metric: Literal["euclidean", "chebyshev"] = "euclidean",  # how separations are measured
        holdout_midpoints: bool = False,
        test_split: Literal["iid", "far", "held_out"] = "iid",
        num_train: int = 20000,
        num_val: int = 2000,
        num_test: int = 2000,
        batch_size: int = 128,
        num_workers: int = 0,
        seed: int = 0,
    ):
        for name, value in (("num_train", num_train), ("num_val", num_val), ("num_test", num_test)):
            require(value >= 1, f"{name}={value} must be at least 1")
        super().__init__(batch_size, num_workers)
        require(radius > 0 and noise >= 0, f"radius={radius} must be > 0 and noise={noise} >= 0")
        require(num_classes in ORIENTATIONS, f"num_classes={num_classes} must be 2 or 4")
        require(max_distractors >= 0, f"max_distractors={max_distractors} must be >= 0")
        require(test_split in ("iid", "far", "held_out"), f"unknown test_split {test_split!r}")
        require(
            separation_metric in ("euclidean", "chebyshev"),
            f"separation_metric must be 'euclidean' or 'chebyshev', got {separation_metric!r}",
        )
        require(
            test_split != "held_out" or holdout_midpoints,
            "test_split=held_out needs holdout_midpoints=true (else nothing was held out)",
        )
        for name, (lo, hi) in (("separation", separation), ("far_separation", far_separation)):
            require(lo <= hi, f"{name}={(lo, hi)} must be (low, high) with low <= high")
            require(
                lo >= 2 * radius + 1,
                f"{name}={(lo, hi)} lets circles of radius {radius} touch; use at least {2 * radius + 1}",
            )
            if wrap:  # beyond half the canvas, the shortest way round would flip the orientation
                require(hi < image_size / 2, f"{name}={(lo, hi)} must stay below image_size/2 on a torus")
            else:
                require(hi + 2 * radius + 1 <= image_size, f"{name}={(lo, hi)} does not fit in the image")
        require(wrap or not holdout_midpoints, "holdout_midpoints needs wrap=true")
        require(0 <= angle_jitter < 22.5, f"angle_jitter={angle_jitter} must be in [0, 22.5) degrees")
        self.save_hyperparameters()
        self.image_size = image_size
        self.num_classes = num_classes
        self.preparation = self.preparation_for(self.hparams)
        self.classes = self.preparation.classes
        self.centres: dict[str, torch.Tensor] = {}  # (n, 2, 2) circle centres, for analysis
        self.moved: dict[str, tuple] = {}  # the counterfactuals of a split: images, labels, centres

    @classmethod
    def preparation_for(cls, hparams: dict) -> Preparation:
        """Image files become what the generator draws: grayscale, resized to `image_size`."""
        names = tuple(ORIENTATION_NAMES[d] for d in ORIENTATIONS[hparams.get("num_classes", 4)])
        return Preparation(channels=1, size=hparams.get("image_size", 32), classes=names)

    def split(self, name: str) -> InMemory:
        """Split "train", "val", "test" (the test set `test_split` picks) or, by name, "iid" (the
        in-distribution test set), "far" or "held_out": float32 images (N, 1, H, W) in [0, 1] and
        labels, generated on first use. `splits` holds them by their own names ("test" for the
        iid one); `circle_centres(name)` gives the circles' centres of the same split."""
        name = self._own_name(name)
        if name not in self.splits:
            labels, centres, clutter, grain = self._draws(name)
            self.splits[name] = InMemory(
                render(centres, clutter, grain, self.hparams.radius, self.hparams.wrap), labels
            )
            self.centres[name] = centres
        return self.splits[name]

    def _draws(self, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`draw_two_circles` for the split of its own name `name`, from that split's generator."""
        hp = self.hparams
        require(name in SPLITS, f"no split {name!r}; choose one of train, val, test, iid, far, held_out")
        g = torch.Generator().manual_seed(hp.seed * 5 + SPLITS.index(name))
        n = {"train": hp.num_train, "val": hp.num_val}.get(name, hp.num_test)
        midpoints = "all"
        if hp.holdout_midpoints:
            midpoints = "inside" if name == "held_out" else "outside"
        return draw_two_circles(
            n, hp.image_size, hp.radius, hp.far_separation if name == "far" else hp.separation,
            hp.angle_jitter, hp.noise, hp.num_classes, hp.max_distractors, midpoints, hp.wrap,
            hp.separation_metric, generator=g,
        )  # fmt: skip

    def counterfactuals(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """For each image of `split(name)`, the same image with one circle moved so that the class
        changes: (images, labels) in the order of the split. The moved circle turns about the other
        by 180 / num_classes degrees (to the next orientation: the separation and the angle's
        jitter kept, the separation as `separation_metric` measures it); the other circle, the
        distractors and the noise stay exactly as they were. On a canvas without wrap-around, the
        first of (the second circle, +turn), (the first, +turn), (the second, -turn), (the first,
        -turn) that stays inside the image (the one that leaves it least if none does).
        `counterfactual_centres(name)` gives the circles' centres."""
        name = self._own_name(name)
        hp = self.hparams
        if name not in self.moved:
            labels, centres, clutter, grain = self._draws(name)
            moved, new_labels = turned_circles(centres, labels, hp.num_classes, hp.image_size, hp.radius,
                                               hp.wrap, hp.separation_metric)  # fmt: skip
            self.moved[name] = (render(moved, clutter, grain, hp.radius, hp.wrap), new_labels, moved)
        images, labels, _ = self.moved[name]
        return images, labels

    def counterfactual_centres(self, name: str) -> torch.Tensor:
        """The circle centres (n, 2, 2) of `counterfactuals(name)`'s images."""
        self.counterfactuals(name)
        return self.moved[self._own_name(name)][2]

    def counterfactual_evidence(self, name: str) -> torch.Tensor:
        """The pixels the two circles ink in `counterfactuals(name)`'s images: (N, H, W) bool."""
        return self._inked(self.counterfactual_centres(name))

    def _own_name(self, name: str) -> str:
        return {"test": self.test_name, "iid": "test"}.get(name, name)

    def evidence(self, name: str) -> torch.Tensor:
        """The pixels the two circles ink in `split(name)`: (N, H, W) bool (any coverage at all,
        as `circle_patch_masks` counts them): all that carries the label."""
        return self._inked(self.circle_centres(name))

    def _inked(self, centres: torch.Tensor) -> torch.Tensor:
        """The pixels (N, H, W) bool that circles at `centres` (N, 2, 2) ink, any coverage at all."""
        hp = self.hparams
        return circle_pixels(centres, hp.image_size, hp.radius, hp.wrap).any(dim=1)

    def circle_centres(self, name: str) -> torch.Tensor:
        """The circle centres (n, 2, 2) as (x, y) pixels of the images of `split(name)`."""
        self.split(name)
        return self.centres[self._own_name(name)]

    @property
    def test_name(self) -> str:
        return "test" if self.hparams.test_split == "iid" else self.hparams.test_split


def turned_circles(
    centres: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    image_size: int,
    radius: float,
    wrap: bool = True,
    separation_metric: str = "euclidean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Circle centres (n, 2, 2) with one circle turned about the other by 180 / num_classes
    degrees, so that the line joining them has the next (or previous) class's orientation, and
    those labels (`TwoCircles.counterfactuals` says which circle turns)."""
    size = float(image_size)
    period = size if wrap else None
    turn = math.pi / num_classes
    candidates = []
    for sign in (1, -1):
        for moving in (1, 0):
            fixed = centres[:, 1 - moving]
            offset = torus_delta(fixed, centres[:, moving], period)  # (n, 2) x, y; y down
            length = offset.norm(dim=-1)
            angle = torch.atan2(-offset[:, 1], offset[:, 0]) + sign * turn  # y up, as the classes are
            if separation_metric == "chebyshev":  # the same Chebyshev separation at the new angle
                length = offset.abs().amax(-1) / torch.maximum(angle.cos().abs(), angle.sin().abs())
            new = fixed + length[:, None] * torch.stack((angle.cos(), -angle.sin()), dim=-1)
            moved = centres.clone()
            moved[:, moving] = torch.remainder(new, size) if wrap else new
            outside = (radius + 0.5 - moved).clamp_min(0) + (moved - size + radius + 0.5).clamp_min(0)
            # turning either circle about the other turns the line between them the same way
            candidates.append((moved, (labels + sign) % num_classes, outside.sum((1, 2))))
    if wrap:
        return candidates[0][:2]
    overshoot = torch.stack([c[2] for c in candidates])  # (4, n)
    best = overshoot.argmin(0)  # the first that stays inside (overshoot 0), or the least outside
    moved = torch.stack([c[0] for c in candidates])[best, torch.arange(len(labels))]
    new_labels = torch.stack([c[1] for c in candidates])[best, torch.arange(len(labels))]
    return moved, new_labels


def circle_pixels(centres: torch.Tensor, image_size: int, radius: float, wrap: bool = True) -> torch.Tensor:
    """The pixels each circle inks at all: (n, 2 circles, H, W) boolean, for centres (n, 2, 2)."""
    dx, dy = pixel_offsets(centres, image_size, float(image_size) if wrap else None)
    return (dx**2 + dy**2).sqrt() < radius + 0.5


def circle_patch_masks(
    centres: torch.Tensor, image_size: int, radius: float, patch_size: int, wrap: bool = True
) -> torch.Tensor:
    """Which patches each circle inks: (n, 2 circles, patches) boolean, patches in row-major order.

    `centres` is (n, 2, 2) as returned by `make_two_circles` (x, y pixels).
    """
    inked = circle_pixels(centres, image_size, radius, wrap)
    grid = image_size // patch_size
    patches = inked.reshape(*inked.shape[:2], grid, patch_size, grid, patch_size).any(dim=(3, 5))
    return patches.flatten(2)
