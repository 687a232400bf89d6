"""The figures of vit-eval (`vit.metrics`): calibration error by hand and by torchmetrics, top-5,
flip averaging, and a split of bytes measured as the model sees it."""

import numpy as np
import pytest
import torch
from torchmetrics.functional.classification import multiclass_calibration_error

from vit import TwoCircles
from vit.datamodules import InMemory
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
