"""The statistics of a report: pass@k and pass^k, the Wilson interval, and the paired tests
that say whether a change is beyond noise.

Sources (cited in docs/evals.md):

* pass@k, unbiased: Chen et al. 2021, "Evaluating Large Language Models Trained on Code",
  eq. 1: ``1 - C(n - c, k) / C(n, k)`` for `n` runs of which `c` passed.
* pass^k: Yao et al. 2024, "tau-bench", the chance that `k` runs drawn without replacement
  all pass: ``C(c, k) / C(n, k)``.
* Wilson score interval: Wilson 1927; Agresti & Coull 1998.
* The exact sign test (McNemar's exact test when each case ran once) on the cases that moved,
  and Fisher's exact test per case.
"""

from __future__ import annotations

import math

__all__ = ["pass_at_k", "pass_hat_k", "wilson_interval"]

Z_95 = 1.959963984540054
"""The 97.5th percentile of the standard normal distribution (a two-sided 95 % interval)."""


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """The chance that at least one of `k` runs passes, estimated without bias from `n` runs
    of which `c` passed (``None`` when fewer than `k` ran).

    Raises:
        ValueError: a count is negative, `c` exceeds `n`, or `k` is below 1.
    """
    _check(n, c, k)
    if n < k:
        return None
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float | None:
    """pass^k: the chance that `k` runs all pass, estimated without bias from `n` runs of
    which `c` passed (``None`` when fewer than `k` ran).

    Raises:
        ValueError: as `pass_at_k`.
    """
    _check(n, c, k)
    if n < k:
        return None
    return math.comb(c, k) / math.comb(n, k)


def _check(n: int, c: int, k: int) -> None:
    if n < 0 or c < 0 or c > n or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")


def wilson_interval(passed: int, runs: int, z: float = Z_95) -> tuple[float, float] | None:
    """The Wilson score interval of a pass rate (95 % by default); ``None`` with no runs."""
    if runs <= 0:
        return None
    p = passed / runs
    z2 = z * z
    denominator = 1 + z2 / runs
    center = (p + z2 / (2 * runs)) / denominator
    half = z * math.sqrt(p * (1 - p) / runs + z2 / (4 * runs * runs)) / denominator
    return max(0.0, center - half), min(1.0, center + half)


def sign_test(worse: int, better: int) -> float:
    """The two-sided p-value of the exact sign test: of the ``worse + better`` paired items
    that changed, `worse` got worse; under no real change each way is equally likely. With
    one run per case this is McNemar's exact test. 1.0 when nothing changed."""
    moved = worse + better
    if moved == 0:
        return 1.0
    tail: float = sum(math.comb(moved, i) for i in range(min(worse, better) + 1)) / 2**moved
    return min(1.0, 2 * tail)


def fisher_exact(a_passed: int, a_failed: int, b_passed: int, b_failed: int) -> float:
    """The two-sided p-value of Fisher's exact test on a 2x2 table (passed and failed runs of
    one case before and after): the probability, with the margins fixed, of a table at most
    as likely as the one seen."""
    row_a, passed, total = a_passed + a_failed, a_passed + b_passed, a_passed + a_failed
    total += b_passed + b_failed
    if total == 0:
        return 1.0

    def probability(x: int) -> float:
        return math.comb(row_a, x) * math.comb(total - row_a, passed - x) / math.comb(total, passed)

    seen = probability(a_passed)
    low, high = max(0, passed - (total - row_a)), min(row_a, passed)
    p = sum(probability(x) for x in range(low, high + 1) if probability(x) <= seen * (1 + 1e-9))
    return min(1.0, p)
