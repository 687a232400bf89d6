"""The statistics behind every looking-inside figure (`vit.stats`), against answers computed
another way: exact permutation distributions, hand-counted ranks, degenerate resamples."""

import itertools
import math

import pytest
import torch

from vit.stats import interval, spearman, spearman_over_images, spearman_test


def test_spearman_test_gives_rho_and_a_p_value_near_the_exact_permutation_one():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    b = torch.tensor([2.0, 1.0, 4.0, 3.0, 6.0, 5.0])
    found = spearman_test(a, b, permutations=20000)
    rho = spearman(a, b).item()
    assert found["rho"] == pytest.approx(rho) and found["n"] == 6
    every = torch.tensor([spearman(a, b[list(order)]).item() for order in itertools.permutations(range(6))])
    exact = (every.abs() >= abs(rho) - 1e-9).double().mean().item()  # 720 pairings, the observed among them
    assert found["p"] == pytest.approx(exact, abs=0.01)
    assert -1 <= found["low"] <= rho <= found["high"] <= 1


def test_a_perfect_ranking_is_significant_and_its_intervals_are_one():
    a = torch.arange(16.0)
    found = spearman_test(a, a**3, permutations=999)
    assert found["rho"] == pytest.approx(1.0) and found["p"] == pytest.approx(1 / 1000)
    assert found["low"] == pytest.approx(1.0) and found["high"] == pytest.approx(1.0)
    reversed_ = spearman_test(a, -a, permutations=999)
    assert reversed_["rho"] == pytest.approx(-1.0) and reversed_["p"] == pytest.approx(1 / 1000)


def test_unrelated_figures_have_a_large_p_and_an_interval_across_zero():
    g = torch.Generator().manual_seed(1)
    found = spearman_test(torch.rand(16, generator=g), torch.rand(16, generator=g))
    assert found["p"] > 0.05 and found["low"] < 0 < found["high"]


def test_pairs_with_a_nan_are_left_out_and_a_constant_side_has_no_correlation():
    a = torch.tensor([1.0, 2.0, float("nan"), 4.0, 5.0])
    b = torch.tensor([1.0, 2.0, 3.0, float("nan"), 5.0])
    assert spearman_test(a, b)["n"] == 3 and spearman_test(a, b)["rho"] == pytest.approx(1.0)
    flat = spearman_test(torch.ones(5), torch.arange(5.0))
    assert all(math.isnan(flat[k]) for k in ("rho", "p", "low", "high"))


def test_the_interval_over_images_is_the_rho_itself_when_the_images_agree():
    units = torch.tensor([3.0, 1.0, 2.0, 5.0])
    same = units[:, None].expand(4, 50)  # every image gives each unit the same figure
    found = spearman_over_images(same, -same)
    assert found == {"low": pytest.approx(-1.0), "high": pytest.approx(-1.0)}
    g = torch.Generator().manual_seed(0)
    noisy = units[:, None] + 3 * torch.randn(4, 50, generator=g)
    found = spearman_over_images(noisy, units[:, None].expand(4, 50))
    assert found["low"] < found["high"] and found["high"] == pytest.approx(1.0)


def test_interval_is_the_mean_with_nan_left_out_and_a_bootstrap_around_it():
    values = torch.tensor([1.0, 2.0, float("nan"), 3.0, 6.0])
    found = interval(values)
    assert found["mean"] == 3.0 and 1.0 <= found["low"] < 3.0 < found["high"] <= 6.0
    assert interval(torch.full((7,), 2.5)) == {"mean": 2.5, "low": 2.5, "high": 2.5}
    assert all(math.isnan(v) for v in interval(torch.tensor([float("nan")])).values())
