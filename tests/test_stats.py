"""``stats.decide``: the verdict rules checked against scipy's one-sample t-tests (TOST)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as st

from qkvlab.stats import decide, paired


def _scipy_verdict(d: np.ndarray, margin: float, lower_is_better: bool = True) -> str:
    """The same rules written with scipy's tests: TOST (both one-sided p < 5%) first, then a
    two-sided test at 5%."""
    p_low = st.ttest_1samp(d, -margin, alternative="greater").pvalue
    p_high = st.ttest_1samp(d, margin, alternative="less").pvalue
    if max(p_low, p_high) < 0.05:
        return "equivalent"
    if st.ttest_1samp(d, 0.0).pvalue < 0.05:
        return "worse" if (d.mean() > 0) == lower_is_better else "better"
    return "undecided"


@pytest.mark.parametrize("seed", range(40))
def test_decide_agrees_with_tost_and_t_test(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 12))
    d = rng.normal(rng.normal(0, 1.5), rng.uniform(0.1, 2.0), size=n)
    margin = float(rng.uniform(0.3, 2.0))
    for lower in (True, False):
        got = decide(d.mean(), d.std(ddof=1), n, margin, lower_is_better=lower)
        assert got["status"] == _scipy_verdict(d, margin, lower)
        ci = st.t.interval(0.95, n - 1, loc=d.mean(), scale=st.sem(d))
        np.testing.assert_allclose([got["lo"], got["hi"]], ci, rtol=1e-12, atol=1e-12)


def test_undecided_names_the_seed_count_that_decides():
    d = np.array([0.8, -0.3, 1.1, 0.2])
    sd, margin = d.std(ddof=1), 1.0
    got = decide(d.mean(), sd, len(d), margin)
    assert got["status"] == "undecided"
    k = got["seeds"]

    def decided(n):  # the observed mean and sd, n seeds
        return (decide(d.mean(), sd, n, margin)["status"] != "undecided")

    assert decided(k) and not decided(k - 1)


def test_decide_edge_cases_and_bad_input():
    assert decide(0.0, 0.0, 3, 1.0)["status"] == "equivalent"  # every pair identical
    one = decide(0.5, float("nan"), 1, 1.0)
    assert (one["status"], one["seeds"]) == ("undecided", None)
    # a real difference smaller than the margin is equivalent, and says it is significant
    small = decide(0.2, 0.05, 10, 1.0)
    assert (small["status"], small["significant"]) == ("equivalent", True)
    with pytest.raises(ValueError, match="margin: 0 must be a positive number"):
        decide(0.1, 0.1, 3, 0)
    with pytest.raises(ValueError, match="level: 1.5 must be in"):
        decide(0.1, 0.1, 3, 1.0, level=1.5)


def test_paired_reports_the_spread_of_the_differences():
    a, b = [2.2, 2.3, 2.45], [2.0, 2.1, 2.2]
    got = paired(a, b)
    d = np.subtract(a, b)
    rel = 100 * (np.divide(a, b) - 1)
    np.testing.assert_allclose([got["diff_sd"], got["rel_sd"]],
                               [d.std(ddof=1), rel.std(ddof=1)], rtol=1e-12)
