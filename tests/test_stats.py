"""lmpipe.stats: the spread of one run is unknown, the gap rule is one rule, the bootstrap over seeds shrinks with
their noise and repeats with its seed, and the lack-of-fit test keeps a true form and rejects a wrong one."""

from __future__ import annotations

import numpy as np
import pytest

from lmpipe import stats

X = np.geomspace(1.0, 64.0, 7)


def replicated(truth, sd: float, seeds: int = 3, seed: int = 0) -> list[np.ndarray]:
    """`seeds` noisy runs of `truth` at each x."""
    rng = np.random.default_rng(seed)
    return [truth(x) + rng.normal(0, sd, seeds) for x in X]


def test_a_single_run_has_no_sd_and_no_gap_to_it_is_judged():
    assert stats.mean_sd([2.0]) == (2.0, None)
    mean, sd = stats.mean_sd([1.0, 2.0, 3.0])
    assert mean == 2.0 and sd == pytest.approx(1.0)
    assert stats.gap_is_real(2.0, None, 2.5, 0.01) is None and stats.gap_is_real(2.0, float("nan"), 2.5, 0.01) is None
    assert stats.gap_is_real(2.0, 0.01, 2.03, 0.005) is True  # 0.03 > 2 x 0.01
    assert stats.gap_is_real(2.0, 0.01, 2.019, 0.005) is False  # 0.019 is not more than 2 x 0.01
    assert stats.larger_sd(0.1, 0.3) == 0.3 and stats.larger_sd(0.1, None) is None


def test_lowest_keeps_each_groups_best_run_in_first_seen_order():
    rows = [{"m": "a", "c": 1, "valid_bpb": "2.0"}, {"m": "a", "c": 1, "valid_bpb": "1.9"},
            {"m": "b", "c": 1, "valid_bpb": "1.5"}, {"m": "a", "c": 2, "valid_bpb": "1.2"}]
    best = stats.lowest(rows, lambda r: (r["m"], r["c"]))
    assert list(best) == [("a", 1), ("b", 1), ("a", 2)] and best["a", 1]["valid_bpb"] == "1.9"
    assert stats.lowest(rows, lambda r: r["c"])[1]["m"] == "b"


def slope(ys) -> float:
    return float(np.polyfit(np.log(X), ys, 1)[0])


def test_the_bootstrap_interval_shrinks_with_the_seeds_noise_and_repeats_with_its_seed():
    truth = lambda x: 3.0 - 0.1 * np.log(x)  # noqa: E731
    widths = []
    for sd in (0.02, 0.005):
        band = stats.interval(stats.bootstrap(replicated(truth, sd), slope, seed=1))
        assert band[0] < -0.1 < band[1]
        widths.append(band[1] - band[0])
    assert widths[1] < widths[0] / 2
    data = replicated(truth, 0.01)
    assert stats.interval(stats.bootstrap(data, slope, seed=7)) == stats.interval(stats.bootstrap(data, slope, seed=7))
    assert stats.interval(stats.bootstrap(data, slope, seed=7)) != stats.interval(stats.bootstrap(data, slope, seed=8))
    assert stats.bootstrap([[1.0], [2.0]], slope) is None  # no replicates: no noise measured, no interval


def test_a_single_run_borrows_the_pooled_seed_noise():
    draws = stats.replicate_draws([[1.0, 1.1, 0.9], [5.0]], samples=4000, seed=0)
    assert draws[:, 1].std() == pytest.approx(0.1, rel=0.1)  # one run: the noise of one run
    assert draws[:, 0].std() == pytest.approx(0.1 / np.sqrt(3), rel=0.1)  # a mean of three


def test_the_lack_of_fit_test_keeps_the_true_form_and_rejects_a_wrong_one():
    truth = lambda x: 2.0 + 1.0 * x ** -0.5  # noqa: E731
    data = replicated(truth, 0.01, seed=3)
    means = np.array([ys.mean() for ys in data])
    exact = stats.lack_of_fit(data, truth(X), 3)
    assert exact.df_lack == 4 and exact.df_pure == 14 and not exact.rejected
    line = np.polyval(np.polyfit(np.log(X), means, 1), np.log(X))  # a straight line in log x: the wrong form
    wrong = stats.lack_of_fit(data, line, 2)
    assert wrong.rejected and wrong.p < 1e-3 and wrong.text().startswith("rejected (lack-of-fit F = ")
    assert stats.lack_of_fit([[1.0], [2.0], [3.0]], [1, 2, 3], 1) is None  # no replicates: no pure error
    # over many noisy grids the true form is rejected about as often as the test's level says
    rejected = np.mean([stats.lack_of_fit(d, truth(X), 0).rejected for d in
                        (replicated(truth, 0.01, seed=s) for s in range(300))])
    assert 0.02 <= rejected <= 0.09
