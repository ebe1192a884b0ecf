"""``stats.decide``: the verdict rules checked against scipy's one-sample t-tests (TOST)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as st

from qkvlab.stats import (
    compare,
    compare_frame,
    decide,
    holm,
    paired,
    power_t,
    power_tost,
    seeds_for_power,
)


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


def test_undecided_names_the_seeds_for_80_percent_power():
    d = np.array([0.8, -0.3, 1.1, 0.2])
    sd, margin = d.std(ddof=1), 1.0
    got = decide(d.mean(), sd, len(d), margin)
    assert got["status"] == "undecided"
    k, which = seeds_for_power(d.mean(), sd, margin)
    assert got["seeds"] == k
    power = power_t if which == "difference" else (
        lambda m, s, n: power_tost(m, s, n, margin))
    assert power(d.mean(), sd, k) >= 0.8 > power(d.mean(), sd, k - 1)


@pytest.mark.parametrize(("d", "n", "power"), [(0.5, 34, 0.8078), (0.8, 15, 0.8213),
                                                (1.0, 10, 0.8031), (0.3, 90, 0.8038)])
def test_paired_t_power_matches_gpower(d, n, power):
    """G*Power 3.1, t tests, "Means: difference from constant (one sample case)", two tails,
    α = 0.05, power 0.80: total sample size and actual power for effect size d."""
    assert seeds_for_power(d, 1.0, 1e-9) == (n, "difference")
    assert power_t(d, 1.0, n) == pytest.approx(power, abs=1e-4)
    assert power_t(-d, 1.0, n) == pytest.approx(power, abs=1e-4)  # two-sided


def test_powers_match_a_simulation():
    """Both powers against 20,000 simulated experiments with a fixed seed (3 standard errors)."""
    rng = np.random.default_rng(0)
    n, reps, margin = 8, 20_000, 1.0
    for diff in (0.0, 0.4, 0.9):
        d = rng.normal(diff, 1.0, size=(reps, n))
        p = st.ttest_1samp(d, 0.0, axis=1).pvalue
        lo = st.ttest_1samp(d, -margin, axis=1, alternative="greater").pvalue
        hi = st.ttest_1samp(d, margin, axis=1, alternative="less").pvalue
        for got, hits in ((power_t(diff, 1.0, n), p < 0.05),
                          (power_tost(diff, 1.0, n, margin), np.maximum(lo, hi) < 0.05)):
            se = np.sqrt(max(got * (1 - got), 1e-4) / reps)
            assert abs(hits.mean() - got) < 3 * se + 2e-3


def test_large_seed_counts_stay_finite():
    # scipy's noncentral t returns NaN far out; the normal limit takes over there
    assert power_t(0.5, 1.0, 5000) == pytest.approx(1.0)
    assert seeds_for_power(0.05, 1.0, 1e-9) == (3142, "difference")
    assert seeds_for_power(0.01, 1.0, 1e-9) == (None, None)  # beyond 10,000


def test_holm_by_hand_and_against_a_step_down_reference():
    nan = float("nan")
    # sorted 0.005, 0.01, 0.03, 0.04 -> ×4, ×3, ×2, ×1 = 0.02, 0.03, 0.06, 0.04 -> running max
    got = holm([0.01, 0.04, 0.03, 0.005, nan])
    np.testing.assert_allclose(got, [0.03, 0.06, 0.06, 0.02, nan])
    assert holm([]) == [] and holm([0.9, 0.8]) == [1.0, 1.0] and holm([0.6, 0.7, 0.1]) == [
        pytest.approx(1.0), pytest.approx(1.0), pytest.approx(0.3)]

    def step_down(ps, alpha):  # Holm (1979) as written: reject while p_(i) <= α/(m − i)
        rejected = set()
        for i, j in enumerate(np.argsort(ps, kind="stable")):
            if ps[j] > alpha / (len(ps) - i):
                break
            rejected.add(int(j))
        return rejected

    rng = np.random.default_rng(1)
    for _ in range(200):
        ps = rng.uniform(0, 0.2, size=int(rng.integers(1, 25))) ** rng.uniform(1, 3)
        adj = holm(list(ps))
        for alpha in (0.01, 0.05, 0.1):
            assert {i for i, p in enumerate(adj) if p <= alpha} == step_down(ps, alpha)


def test_decide_names_the_p_of_the_test_that_decided():
    eq = decide(0.1, 0.2, 10, 1.0)
    assert eq["status"] == "equivalent" and eq["p_decided"] == eq["p_tost"] < 0.05
    worse = decide(3.0, 1.0, 5, 1.0)
    assert worse["status"] == "worse" and worse["p_decided"] == worse["p"] < 0.05
    d = np.array([3.0, 2.1, 4.2, 2.5, 3.3])
    np.testing.assert_allclose(decide(d.mean(), d.std(ddof=1), 5, 1.0)["p"],
                               st.ttest_1samp(d, 0.0).pvalue, rtol=1e-10)
    und = decide(0.5, 2.0, 3, 1.0)
    assert und["status"] == "undecided" and und["p_decided"] == min(und["p"], und["p_tost"])
    assert und["p_decided"] >= 0.05


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


def _run(design, seed, status, value=None, task="lm"):
    return {"tags": {"design": design, "seed": seed, "task": task}, "status": status,
            "n_params": 10, "final": {} if value is None else {"val_loss": value}}


def test_compare_counts_every_lost_run_at_the_worst_value():
    rows = [_run("standard", 0, "done", 2.0), _run("standard", 1, "done", 2.1),
            _run("standard", 2, "failed"), _run("standard", 3, "done", 2.2),
            _run("tied", 0, "done", 2.05), _run("tied", 1, "diverged"),
            _run("tied", 2, "done", 2.3), _run("tied", 3, "pending")]
    # lost runs enter at the worse of `failed` (3.0) and the group's worst finished value
    std, tied = compare(rows, "val_loss", lower_is_better=True, failed=3.0)
    assert (std["n"], std["failed"], std["lost_value"]) == (4, 1, 3.0)
    assert (tied["n"], tied["diverged"], tied["failed"]) == (3, 1, 0)  # pending: not a result
    assert (tied["n_pairs"], tied["lost"], tied["baseline_lost"]) == (3, 1, 1)
    d = np.array([2.05 - 2.0, 3.0 - 2.1, 2.3 - 3.0])
    assert tied["diff"] == pytest.approx(d.mean())
    assert tied["diff_sd"] == pytest.approx(d.std(ddof=1))
    # without `failed`: the worst finished run of the group, any design (2.3)
    _, tied = compare(rows, "val_loss", lower_is_better=True)
    assert tied["lost_value"] == 2.3 and tied["diff"] == pytest.approx(
        np.mean([0.05, 2.3 - 2.1, 2.3 - 2.3]))
    # higher is better: chance accuracy or the lowest finished, whichever is lower
    acc = [{**r, "final": {"accuracy": 1 - r["final"]["val_loss"] / 4} if r["final"] else {}}
           for r in rows]
    _, tied = compare(acc, "accuracy", lower_is_better=False, failed=lambda tags: 0.25)
    assert tied["lost_value"] == 0.25
    # a function of the group's tags; without a direction a lost run is only counted
    _, tied = compare(rows, "val_loss")
    assert (tied["n"], tied["diverged"], tied["lost_value"], tied["n_pairs"]) == (2, 1, None, 1)


def test_compare_frame_passes_the_lost_rule(tmp_path):
    import pandas as pd

    df = pd.DataFrame([{"design": r["tags"]["design"], "seed": r["tags"]["seed"], "task": "lm",
                        "status": r["status"], "n_params": 10,
                        "val_loss": r["final"].get("val_loss", float("nan"))}
                       for r in [_run("standard", 0, "done", 2.0), _run("standard", 1, "done", 2.1),
                                 _run("tied", 0, "done", 2.2), _run("tied", 1, "diverged")]])
    got = compare_frame(df, "val_loss", ["task"], lower_is_better=True,
                        failed=lambda tags: {"lm": 4.0}[tags["task"]])
    tied = got[got.design == "tied"].iloc[0]
    assert (tied.n_pairs, tied.lost, tied.lost_value) == (2, 1, 4.0)
    assert tied["diff"] == pytest.approx(np.mean([0.2, 4.0 - 2.1]))
