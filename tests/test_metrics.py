"""The figures of vit-eval (`vit.metrics`): calibration error by hand and by torchmetrics, top-5,
flip and translation averaging, and a split of bytes measured as the model sees it."""

import numpy as np
import pytest
import torch
from torchmetrics.functional.classification import multiclass_calibration_error

from vit import TwoCircles
from vit.datamodules import InMemory
from vit.errors import UsageError
from vit.metrics import (
    classification_metrics,
    collect_probabilities,
    expected_calibration_error,
    predict_probabilities,
    reliability_bins,
    restrict_to,
)


def test_ece_of_the_reliability_bins_by_hand_and_by_torchmetrics():
    probabilities = torch.tensor(
        [
            [0.90, 0.05, 0.05],  # bin 13 of 15 ([0.867, 0.933)), right
            [0.92, 0.04, 0.04],  # bin 13, wrong
            [0.10, 0.60, 0.30],  # bin 9 ([0.6, 0.667)), right
            [0.20, 0.20, 0.60],  # bin 9, wrong
            [0.30, 0.30, 0.40],  # bin 6 ([0.4, 0.467)), right
        ]
    )
    labels = torch.tensor([0, 1, 1, 0, 2])
    count, confidence, accuracy = reliability_bins(probabilities, labels, n_bins=15)
    assert count.nonzero().flatten().tolist() == [6, 9, 13] and count.sum() == 5
    by_hand = (2 * abs(0.5 - 0.91) + 2 * abs(0.5 - 0.60) + 1 * abs(1.0 - 0.40)) / 5
    assert expected_calibration_error(count, confidence, accuracy) == pytest.approx(by_hand)
    ours = multiclass_calibration_error(probabilities, labels, 3, n_bins=15, norm="l1")
    assert ours.item() == pytest.approx(by_hand, abs=1e-6)
    # the figures vit-eval reports use the same bins
    metrics = classification_metrics(probabilities, labels, ["a", "b", "c"])
    assert metrics["ece"] == pytest.approx(by_hand, abs=1e-6) and metrics["reliability"]["count"][13] == 2
    assert metrics["nll"] == pytest.approx(-np.log([0.90, 0.04, 0.60, 0.20, 0.40]).mean(), abs=1e-6)


def test_top5_is_reported_beyond_five_classes():
    probabilities = torch.eye(7)[[0, 1, 2, 3, 4, 5, 6, 6]] * 0.3 + torch.linspace(0.1, 0.01, 7)
    probabilities = probabilities / probabilities.sum(-1, keepdim=True)
    labels = torch.tensor([0, 1, 2, 3, 4, 5, 6, 1])  # the last is right only within the top 5
    metrics = classification_metrics(probabilities, labels, list("abcdefg"))
    assert metrics["top1"] == pytest.approx(7 / 8) and metrics["top5"] == pytest.approx(1.0)


def test_flip_averaging_leaves_a_mirror_symmetric_image_alone(trained):
    model, data = trained
    images = data.splits["test"].images[:8]
    symmetric = (images + images.flip(-1)) / 2
    torch.testing.assert_close(
        predict_probabilities(model, symmetric, tta=True), predict_probabilities(model, symmetric)
    )
    flipped = predict_probabilities(model, images.flip(-1))
    torch.testing.assert_close(
        predict_probabilities(model, images, tta=True), (predict_probabilities(model, images) + flipped) / 2
    )


class OnePixel(torch.nn.Module):
    """Two classes, the first with probability the pixel at (row, column): what each view of an
    image (mirrored, moved) gives is known."""

    def __init__(self, row: int, column: int):
        super().__init__()
        self.row, self.column = row, column

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = x[:, 0, self.row, self.column]
        return torch.stack([p.log(), (1 - p).log()], dim=-1)


@pytest.mark.parametrize(
    "pixel, views",
    [
        # the image and its mirror 1/4 each; moved down-right and up-left, each and its mirror, 1/8
        ((1, 1), {(1, 1): 1 / 4, (1, 2): 1 / 4, (0, 0): 1 / 8, (0, 1): 1 / 8, (2, 2): 1 / 8, (2, 3): 1 / 8}),
        # in the corner the moved images reflect the border: row -1 is row 1, column 4 column 2
        ((0, 0), {(0, 0): 1 / 4, (0, 3): 1 / 4, (1, 1): 2 / 8, (1, 2): 2 / 8}),
    ],
)
def test_translation_tta_weighs_six_views_as_airbench(pixel, views):
    images = torch.rand(3, 1, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model = OnePixel(*pixel)
    expected = sum(weight * images[:, 0, r, c] for (r, c), weight in views.items())
    got = predict_probabilities(model, images, tta="flip-translate")
    torch.testing.assert_close(got[:, 0], expected.float())
    torch.testing.assert_close(got.sum(1), torch.ones(3))
    flip = (images[:, 0, pixel[0], pixel[1]] + images[:, 0, pixel[0], 3 - pixel[1]]) / 2
    for level in (True, "flip"):
        torch.testing.assert_close(predict_probabilities(model, images, tta=level)[:, 0], flip.float())
    for level in (False, "none"):
        torch.testing.assert_close(
            predict_probabilities(model, images, tta=level)[:, 0], images[:, 0, pixel[0], pixel[1]].float()
        )
    with pytest.raises(UsageError, match="tta='rotate' must be one of none, flip, flip-translate"):
        predict_probabilities(model, images, tta="rotate")


class Uint8TwoCircles(TwoCircles):
    """Holds its test split as bytes, as image data modules do; `split` gives floats."""

    def split(self, name):
        split = super().split(name)
        return InMemory((split.images * 255).round().to(torch.uint8), split.labels)


def test_a_split_of_bytes_is_measured_as_the_model_sees_it(trained):
    model, _ = trained
    data = Uint8TwoCircles(num_train=8, num_val=8, num_test=40, batch_size=16)
    probabilities, labels = collect_probabilities(model, data.split("test"), progress=False)
    images, expected_labels = data.splits["test"].images, data.splits["test"].labels
    expected = predict_probabilities(model, (images * 255).round() / 255)
    torch.testing.assert_close(probabilities, expected)
    assert torch.equal(labels, expected_labels)


def test_restricted_to_the_classes_present_other_predictions_count_as_other():
    probabilities = torch.eye(3)[[0, 1, 2, 2]]  # predicts a, b, c, c
    labels = torch.tensor([0, 0, 2, 2])  # the data holds no b
    metrics = restrict_to(
        classification_metrics(probabilities, labels, ["a", "b", "c"]), [0, 2], ["a", "b", "c"]
    )
    assert metrics["confusion_columns"] == ["a", "c", "other"] and list(metrics["per_class"]) == ["a", "c"]
    assert metrics["confusion_matrix"] == [[1, 0, 1], [0, 2, 0]]  # the a predicted as b is "other"
    assert metrics["top1"] == pytest.approx(3 / 4)


def test_every_view_reaches_the_model_channels_last_with_the_same_probabilities():
    """oneDNN's and cuDNN's convolutions run faster on NHWC memory: each of flip-translate TTA's
    six views is handed to the model channels-last, and the probabilities are those of NCHW views."""
    torch.manual_seed(0)
    conv, seen, nhwc = torch.nn.Conv2d(3, 4, 3), [], torch.channels_last
    conv.register_forward_pre_hook(lambda m, args: seen.append(args[0].is_contiguous(memory_format=nhwc)))
    model = torch.nn.Sequential(conv, torch.nn.AdaptiveMaxPool2d(1), torch.nn.Flatten())
    images = torch.rand(2, 3, 8, 8)
    with torch.no_grad():
        got = predict_probabilities(model, images, tta="flip-translate")
        assert seen == [True] * 6
        nchw = predict_probabilities(lambda x: model(x.contiguous()), images, "flip-translate")
    assert seen[6:] == [False] * 6  # a callable that is not a module: its views as they are
    torch.testing.assert_close(got, nchw)
