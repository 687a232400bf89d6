"""The statistics behind every looking-inside figure (`vit.interpret.stats`), against answers computed
another way: exact permutation distributions, hand-counted ranks, degenerate resamples."""

import itertools
import math

import pytest
import torch

from vit.interpret.stats import interval, lh_interval, spearman, spearman_over_images, spearman_test


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
    one = spearman_test(torch.tensor([1.0]), torch.tensor([2.0]))  # one pair: no correlation
    assert all(math.isnan(one[k]) for k in ("rho", "p", "low", "high")) and one["n"] == 1
    flat = spearman_test(torch.ones(5), torch.arange(5.0))
    assert all(math.isnan(flat[k]) for k in ("rho", "p", "low", "high")) and flat["n"] == 5


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


def test_ties_take_their_average_rank_and_rows_are_ranked_apart():
    from vit.interpret.stats import _ranks

    assert _ranks(torch.tensor([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]
    assert _ranks(torch.tensor([2, 2, 2])).tolist() == [2.0, 2.0, 2.0]  # integers ranked as floats
    tied = torch.tensor([1.0, 2.0, 2.0, 3.0])
    # Pearson's r of the ranks (1, 2.5, 2.5, 4) and (1, 2, 3, 4), counted by hand: 0.9487
    assert spearman(tied, torch.arange(4.0)).item() == pytest.approx(3 / math.sqrt(10), abs=1e-6)
    rows = torch.stack([torch.arange(5.0), torch.tensor([5.0, 1.0, 4.0, 2.0, 3.0])])
    both = spearman(rows, torch.arange(5.0).expand(2, 5))
    assert both.tolist() == pytest.approx([spearman(r, torch.arange(5.0)).item() for r in rows])
    assert torch.equal(_ranks(rows), torch.stack([_ranks(r) for r in rows]))  # each row its own ranks
    assert spearman_test(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 5.0]))["rho"] == pytest.approx(1.0)


def test_every_statistic_is_its_documented_protocol_and_ignores_the_global_random_state():
    """Seed 0, 1,000 resamples and 10,000 pairings, drawn from their own generator: a figure is
    the same whatever ran before it, and the same as the protocol's text says."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.rand(12, generator=g), torch.rand(12, generator=g)
    # 40 units: their rank correlation takes finely spaced values, so the resample count shows in
    # the quantiles (with 12 units neighbouring resamples often tie, and 1,001 resamples pass)
    units = torch.rand(40, 30, generator=g), torch.rand(40, 30, generator=g)
    calls = {
        "interval": (lambda **k: interval(a, **k), {"samples": 1000, "seed": 0}),
        "spearman_test": (lambda **k: spearman_test(a, b, **k),
                          {"permutations": 10000, "samples": 1000, "seed": 0}),
        "spearman_over_images": (lambda **k: spearman_over_images(*units, **k), {"samples": 1000, "seed": 0}),
        "lh_interval": (lambda **k: lh_interval(units[0].view(4, 10, 30), **k), {"seed": 0}),
    }  # fmt: skip
    for name, (call, protocol) in calls.items():
        torch.manual_seed(1)
        first = call()
        torch.manual_seed(2)
        assert call() == first == call(**protocol), name
        assert call(seed=1) != first, name  # the seed is used


def test_the_interval_over_images_resamples_images_shared_by_every_unit():
    """The bootstrap over images, written out as a loop over resamples, for a small case."""
    g = torch.Generator().manual_seed(4)
    a, b = torch.rand(30, 7, generator=g), torch.rand(30, 7, generator=g)  # 30 units, 7 images
    found = spearman_over_images(a, b, samples=50, seed=5)
    picks = torch.randint(7, (50, 7), generator=torch.Generator().manual_seed(5))
    rhos = torch.stack([spearman(a[:, p].mean(-1).double(), b[:, p].mean(-1).double()) for p in picks])
    low, high = rhos.nanquantile(torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    assert found == {"low": pytest.approx(low), "high": pytest.approx(high)}


def test_bounds_are_the_2_5_and_97_5_percent_quantiles_without_nans():
    from vit.interpret.stats import bounds

    values = torch.arange(1001, dtype=torch.float64)  # quantile q of 0..1000 is 1000 q
    torch.testing.assert_close(bounds(values), torch.tensor([25.0, 975.0], dtype=torch.float64))
    with_nan = torch.cat([values, torch.full((500,), float("nan"))])
    torch.testing.assert_close(bounds(with_nan), bounds(values))
    rows = torch.stack([values, 2 * values])  # along a dimension: one interval a row
    torch.testing.assert_close(bounds(rows, dim=-1), torch.tensor([[25.0, 50.0], [975.0, 1950.0]]).double())
