import pytest
import torch

from vit.two_circles import ORIENTATIONS, TwoCircles, make_two_circles, torus_delta


def homogeneity_p_value(counts: torch.Tensor) -> float:
    """Chi-square test that every row (class) of a (classes, bins) table has the same distribution."""
    counts = counts.double()
    expected = counts.sum(1, keepdim=True) * counts.sum(0, keepdim=True) / counts.sum()
    statistic = ((counts - expected) ** 2 / expected).sum()
    dof = (counts.shape[0] - 1) * (counts.shape[1] - 1)
    return torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2).item()


def per_class_histogram(values: torch.Tensor, labels: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    bins = torch.bucketize(values, edges[1:-1])
    table = torch.zeros(int(labels.max()) + 1, len(edges) - 1)
    table.index_put_((labels, bins), torch.ones(len(values)), accumulate=True)
    return table


def circle_positions(wrap: bool, n: int = 20000):
    g = torch.Generator().manual_seed(123)
    kwargs = {} if wrap else dict(radius=3.0, separation=(10.0, 16.0))
    _, labels, centres = make_two_circles(n, noise=0.0, wrap=wrap, generator=g, **kwargs)
    # one circle picked at random per image, so "first" and "second" play no role
    pick = torch.randint(0, 2, (n,), generator=g)
    return centres[torch.arange(n), pick].contiguous(), labels, centres


def test_circle_positions_and_separations_do_not_depend_on_the_class():
    position, labels, centres = circle_positions(wrap=True)
    edges = torch.linspace(0, 32, 9)
    cell = torch.bucketize(position[:, 0], edges[1:-1]) * 8 + torch.bucketize(position[:, 1], edges[1:-1])
    assert homogeneity_p_value(per_class_histogram(cell.float(), labels, torch.arange(65.0) - 0.5)) > 0.01
    delta = torus_delta(centres[:, 0], centres[:, 1], 32.0)
    distance = delta.norm(dim=1)
    assert homogeneity_p_value(per_class_histogram(distance, labels, torch.linspace(7, 11, 9))) > 0.01


@pytest.mark.parametrize("metric", ["euclidean", "chebyshev"])
def test_the_separation_metric_decides_which_distance_is_the_same_for_every_class(metric):
    """With `separation_metric="chebyshev"` the larger of the x and y distances (the gap square
    receptive fields see) lies in `separation` and does not depend on the class; measured along
    the line instead, the diagonals' pairs are closer along x and y, and the test sees it."""
    g = torch.Generator().manual_seed(7)
    _, labels, centres = make_two_circles(20000, noise=0.0, separation=(8.0, 15.0), separation_metric=metric,
                                          generator=g)  # fmt: skip
    delta = torus_delta(centres[:, 0], centres[:, 1], 32.0)
    measured = delta.abs().amax(dim=1) if metric == "chebyshev" else delta.norm(dim=1)
    assert measured.min() >= 8.0 - 1e-4 and measured.max() <= 15.0 + 1e-4
    chebyshev = per_class_histogram(delta.abs().amax(dim=1), labels, torch.linspace(8, 15, 8))
    p_value = homogeneity_p_value(chebyshev)
    assert p_value > 0.01 if metric == "chebyshev" else p_value < 1e-6


def test_the_leak_test_catches_the_bounded_canvas():
    """The same test has the power to see the leak that the wrap-around canvas removes."""
    position, labels, _ = circle_positions(wrap=False)
    edges = torch.linspace(0, 32, 9)
    cell = torch.bucketize(position[:, 0], edges[1:-1]) * 8 + torch.bucketize(position[:, 1], edges[1:-1])
    assert homogeneity_p_value(per_class_histogram(cell.float(), labels, torch.arange(65.0) - 0.5)) < 1e-6


@pytest.mark.parametrize("num_classes", [2, 4])
@pytest.mark.parametrize("wrap", [True, False])
def test_two_circles_on_the_labelled_line(num_classes, wrap):
    g = torch.Generator().manual_seed(0)
    images, labels, centres = make_two_circles(
        512, noise=0.0, num_classes=num_classes, wrap=wrap, generator=g
    )
    assert images.shape == (512, 1, 32, 32) and images.min() >= 0 and images.max() <= 1
    assert set(labels.tolist()) == set(range(num_classes))
    # the same amount of ink in every image: two whole circles of one radius, wrapped or not
    ink = images.sum((1, 2, 3))
    torch.testing.assert_close(ink, torch.full_like(ink, ink.median().item()), atol=1.0, rtol=0.0)
    # both centres are inked, and the line between them points the way the label says
    for i in range(2):
        x, y = centres[:, i].floor().long().unbind(1)
        assert (images[torch.arange(512), 0, y % 32, x % 32] > 0.99).all()
    delta = torus_delta(centres[:, 0], centres[:, 1], 32.0 if wrap else None)
    angle = torch.rad2deg(torch.atan2(-delta[:, 1], delta[:, 0])) % 180
    expected = torch.tensor(ORIENTATIONS[num_classes], dtype=torch.float32)[labels]
    error = (angle - expected).abs()
    assert torch.minimum(error, 180 - error).max() <= 10.0 + 1e-3
    if not wrap:  # inside the image
        assert (centres >= 3.0 - 1e-4).all() and (centres <= 29.0 + 1e-4).all()


def test_distractors_do_not_depend_on_the_class():
    g = torch.Generator().manual_seed(1)
    images, labels, _ = make_two_circles(8000, noise=0.0, max_distractors=3, generator=g)
    ink = images.sum((1, 2, 3))
    assert ink.max() - ink.min() > 20  # distractors are there, in varying numbers
    assert (
        homogeneity_p_value(per_class_histogram(ink, labels, torch.quantile(ink, torch.linspace(0, 1, 7))))
        > 0.01
    )


def test_out_of_distribution_splits():
    dm = TwoCircles(num_train=2000, num_test=500, holdout_midpoints=True)
    for name in ("train", "far", "held_out"):
        dm.split(name)
    distance = {k: torus_delta(c[:, 0], c[:, 1], 32.0).norm(dim=1) for k, c in dm.centres.items()}
    assert distance["train"].min() >= 7 and distance["train"].max() <= 11
    assert distance["far"].min() >= 11 and distance["far"].max() <= 15
    midpoint = {
        k: torch.remainder(c[:, 0] + torus_delta(c[:, 0], c[:, 1], 32.0) / 2, 32)
        for k, c in dm.centres.items()
    }
    assert ((midpoint["held_out"] < 8).all(dim=1)).all()
    assert not ((midpoint["train"] < 8).all(dim=1)).any()


def test_deterministic_by_seed_and_splits_differ():
    a, b, c = (TwoCircles(num_train=64, num_val=32, num_test=32, seed=seed) for seed in (1, 1, 2))
    for dm in (a, b, c):
        dm.setup("fit")
        dm.setup("test")
    for split in ("train", "val", "test"):
        assert torch.equal(a.splits[split].images, b.splits[split].images)
        assert not torch.equal(a.splits[split].images, c.splits[split].images)
    assert not torch.equal(a.splits["val"].images, a.splits["test"].images)


def test_test_split_does_not_depend_on_train_size():
    small, large = TwoCircles(num_train=64, num_test=32), TwoCircles(num_train=128, num_test=32)
    small.setup("test")
    large.setup("test")
    assert torch.equal(small.splits["test"].images, large.splits["test"].images)


def test_test_split_choice():
    dm = TwoCircles(num_train=64, num_test=32, test_split="far")
    dm.setup("test")
    assert dm.test_dataloader().dataset is dm.splits["far"] is dm.split("test")
    assert dm.split("iid") is dm.splits["test"] and dm.split("far") is dm.splits["far"]
    # the centres of a split are those of its images, whatever name it was asked by
    assert dm.circle_centres("test") is dm.centres["far"] and dm.circle_centres("iid") is dm.centres["test"]
    with pytest.raises(ValueError, match="no split 'tset'"):
        dm.split("tset")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(radius=5.0, separation=(8.0, 12.0)), "touch"),
        (dict(separation=(8.0, 16.0)), "below image_size/2"),
        (dict(wrap=False, separation=(8.0, 30.0)), "does not fit"),
        (dict(separation=(10.0, 8.0)), "low <= high"),
        (dict(angle_jitter=30.0), "angle_jitter"),
        (dict(num_classes=3), "must be 2 or 4"),
        (dict(test_split="held_out"), "needs holdout_midpoints"),
        (dict(wrap=False, holdout_midpoints=True, separation=(8.0, 12.0)), "needs wrap"),
    ],
)
def test_bad_settings_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TwoCircles(**kwargs)
