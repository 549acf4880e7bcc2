"""The statistics of eval reports, against values worked out by hand and by definition."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minions.evals import pass_at_k, pass_hat_k, wilson_interval
from minions.evals._stats import fisher_exact, sign_test


def test_pass_at_k_is_chens_unbiased_estimator() -> None:
    assert pass_at_k(4, 2, 1) == pytest.approx(0.5)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0  # fewer than k failures: some sample of k passes
    assert pass_at_k(2, 1, 3) is None  # fewer runs than k


def test_pass_hat_k_is_the_chance_that_k_runs_all_pass() -> None:
    assert pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)
    assert pass_hat_k(4, 4, 4) == 1.0
    assert pass_hat_k(4, 3, 4) == 0.0
    assert pass_hat_k(5, 5, 1) == 1.0


@given(st.integers(1, 8), st.data())
def test_the_estimators_equal_the_average_over_every_k_subset(n: int, data: st.DataObject) -> None:
    outcomes = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    k = data.draw(st.integers(1, n))
    c = sum(outcomes)
    subsets = list(itertools.combinations(outcomes, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert pass_hat_k(n, c, k) == pytest.approx(sum(all(s) for s in subsets) / len(subsets))


def test_wilson_interval_matches_the_textbook_values() -> None:
    low, high = wilson_interval(2, 4) or (0, 0)
    assert (round(low, 4), round(high, 4)) == (0.1500, 0.8500)
    low, high = wilson_interval(0, 10) or (0, 0)
    assert low == 0.0
    assert high == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(0, 0) is None


def test_sign_test_is_two_sided_and_exact() -> None:
    assert sign_test(0, 0) == 1.0
    assert sign_test(6, 0) == pytest.approx(2 / 64)
    assert sign_test(5, 0) == pytest.approx(2 / 32)
    assert sign_test(3, 3) == 1.0


def test_fisher_exact_two_sided() -> None:
    # 4 of 4 before, 2 of 4 after: p = 0.4286 (R: fisher.test(matrix(c(4,0,2,2), 2)))
    assert fisher_exact(4, 0, 2, 2) == pytest.approx(3 / 7, abs=1e-4)
    assert fisher_exact(10, 0, 0, 10) == pytest.approx(2 / math.comb(20, 10), rel=1e-6)
    assert fisher_exact(0, 0, 0, 0) == 1.0
