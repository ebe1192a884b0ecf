"""The share of attention's benefit a design gives up (``plan.share``, ``compute.share``): the
rule that reads its interval, and the per-seed ratios against values computed here
independently (numpy, scipy's t quantile), a lost run included."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from qkvlab.experiments.registry import get_profile
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.compute.share import shares
from qkvlab.studies.qkv.plan.share import READINGS, reading
from qkvlab.studies.qkv.render.share import share_sentence, share_table


@pytest.mark.parametrize("lo, hi, want", [
    (0.9, 1.05, "none_kept"), (-0.1, 0.2, "all_kept"), (0.2, 0.6, "part"),
    (1.1, 1.4, "below_control"), (-0.5, -0.1, "above_standard"), (-0.2, 1.2, "undecided"),
    (float("nan"), 1.0, "undecided"), (0.0, 1.0, "undecided"), (1.0, 1.2, "none_kept")])
def test_the_reading_of_a_share_interval(lo, hi, want):
    assert reading(lo, hi) == want and want in READINGS


STD = np.array([2.00, 2.10, 1.95, 2.05, 2.02])  # standard's test loss per seed (nats)
CTRL = STD + np.array([0.50, 0.40, 0.55, 0.45, 0.52])  # the control, far behind
QKV = STD + np.array([0.49, 0.41, 0.53, 0.47, 0.50])  # about the control's
QK = STD + np.array([0.10, 0.12, 0.08, 0.11, 0.09])  # a fifth of it


def _runs(lost_seed: int | None = None) -> pd.DataFrame:
    rows = []
    for design, vals in (("standard", STD), ("control", CTRL), ("tied_qkv", QKV),
                         ("tied_qk", QK)):
        for seed, v in enumerate(vals):
            lost = design == "tied_qk" and seed == lost_seed
            rows.append({"experiment": "tied_qk_qkv", "design": design, "task": "lm",
                         "arm": "equal", "seed": seed, "run_id": f"{design}{seed}",
                         "status": "diverged" if lost else "done",
                         "test_val_loss": float("nan") if lost else float(v)})
    return pd.DataFrame(rows)


def _data(runs: pd.DataFrame) -> StudyData:
    p = get_profile("smoke")
    return StudyData(profile=p, runs=runs, comparisons=results.comparisons(runs, p),
                     probe=pd.DataFrame(), measures={})


def _ci(x) -> tuple[float, float, float]:
    x = np.asarray(x, dtype=float)
    h = st.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return x.mean(), x.mean() - h, x.mean() + h


def test_shares_are_per_seed_ratios_with_a_t_interval():
    df = shares(_data(_runs())).set_index("design")
    assert set(df.index) == {"tied_qk", "tied_qkv"}
    for design, vals, want in (("tied_qkv", QKV, "none_kept"), ("tied_qk", QK, "part")):
        got = df.loc[design]
        np.testing.assert_allclose([got.share, got.lo, got.hi],
                                   _ci((vals - STD) / (CTRL - STD)), rtol=1e-12, atol=0)
        assert (got.n, got.reading, got.attention_used) == (5, want, 1.0)
        # the raw gaps beside it, as the tables show them (% perplexity per token)
        np.testing.assert_allclose(got.value, 100 * (np.exp((vals - STD).mean()) - 1),
                                   rtol=1e-9)
        np.testing.assert_allclose(got.control_value, 100 * (np.exp((CTRL - STD).mean()) - 1),
                                   rtol=1e-9)


def test_a_lost_run_enters_the_share_as_it_enters_its_comparison():
    runs = _runs(lost_seed=2)
    data = _data(runs)
    done = runs[runs.status == "done"].test_val_loss
    worst = max(float(done.max()), results.chance("lm", data.profile))
    qk = QK.copy()
    qk[2] = worst
    got = shares(data).set_index("design").loc["tied_qk"]
    np.testing.assert_allclose([got.share, got.lo, got.hi], _ci((qk - STD) / (CTRL - STD)),
                               rtol=1e-12, atol=0)


def test_no_share_is_read_where_standard_does_not_beat_the_control():
    runs = _runs()
    ctrl = runs.design == "control"
    runs.loc[ctrl, "test_val_loss"] = STD + np.array([0.001, -0.002, 0.0, 0.002, -0.001])
    df = shares(_data(runs))
    assert (df.attention_used == 0).all() and df.reading.isna().all()
    table = share_table(_data(runs))
    assert table.rows == () and "2 comparison(s)" in table.caption


def test_the_page_says_where_a_design_is_no_better_than_no_attention():
    data = _data(_runs())
    text = share_sentence(data, "q2")
    assert text.startswith("Indistinguishable from no attention") and "Q=K=V on lm" in text
    assert "tied Q=K on" not in text and share_sentence(data, "q3") == ""
    rows = {r[1]: r for r in share_table(data).rows}
    assert rows["Q=K=V"][5] == "indistinguishable from no attention"
    assert rows["tied Q=K"][5] == "keeps part of it"


def test_the_answer_card_says_where_a_design_is_no_better_than_no_attention():
    from qkvlab.studies.qkv.compute.cards import cards, no_attention
    from qkvlab.studies.qkv.render.cards import sentence
    data = _data(_runs())
    assert no_attention(data, "q2") == [("tied_qkv", "lm")] and no_attention(data, "q3") == []
    c = cards(data)
    assert c["q2"].facts["no_attention"] == [("tied_qkv", "lm")]
    assert sentence(c["q2"])[1].endswith(
        "Q=K=V on lm: indistinguishable from no attention (its gap to standard is the "
        "attention-free control's, summary).")
    assert "indistinguishable" not in sentence(c["q3"])[1]
