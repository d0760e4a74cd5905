"""Failure studies over few seeds give Student-t intervals: with 2 to 10 runs the normal's 1.96
would claim a mean known 1.1 to 6.5 times better than it is."""

import math

import numpy as np
import pytest

from clustersim.analysis.failures.study import Stat, ci95_half, t95

T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 19: 2.093, 29: 2.045,
           60: 2.000, 120: 1.980}
"""t(0.975, dof) from the standard table (NIST/SEMATECH e-Handbook, section 1.3.6.7.2)."""


@pytest.mark.parametrize("dof, value", sorted(T_TABLE.items()))
def test_t95_matches_the_published_table(dof, value):
    assert t95(dof) == pytest.approx(value, abs=6e-3 if dof == 3 else 1e-3)


def test_t95_matches_scipy_where_it_is_installed():
    stats = pytest.importorskip("scipy.stats")
    for dof in range(1, 200):
        assert t95(dof) == pytest.approx(stats.t.ppf(0.975, dof), rel=1.3e-3 if dof == 3 else 4e-4)


def test_the_interval_of_three_runs_uses_t_with_two_degrees_of_freedom():
    runs = [0.90, 0.95, 0.97]
    half = 4.302653 * np.std(runs, ddof=1) / math.sqrt(3)
    assert ci95_half(runs) == pytest.approx(half, rel=1e-6)
    stat = Stat.of(runs, upper=1.0)
    assert stat.ci95 == pytest.approx((np.mean(runs) - half, min(np.mean(runs) + half, 1.0)))
    assert ci95_half([0.9]) == 0.0
