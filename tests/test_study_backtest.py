"""The size trend's back-test (``compute.backtest``, issue 39 item 4): the split of the size
cells, each form's prediction of a held-out cell against what it measured, and that only a form
that passes is extrapolated, in the table, the figure and the answers' sentence."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from qkvlab.experiments.registry import get_profile
from qkvlab.experiments.store import run_id
from qkvlab.studies.qkv.compute import backtest as BT
from qkvlab.studies.qkv.compute import scaling as S
from qkvlab.studies.qkv.plan import scaling as P
from qkvlab.studies.qkv.plan.profiles import Rates
from qkvlab.studies.qkv.plan.vocab import label
from qkvlab.studies.qkv.render import figures_scaling as R
from test_study_gap_scale import run_row, size_runs, study_data

E, A, ALPHA = 3.0, 2.0, 0.3
# each design worth this share of standard's parameters: tied Q=K=V far less than the rest
SHARE = dict(zip(P.DESIGNS, (0.5, 0.6, 0.1, 0.95, 0.8)))
CELLS = ((1e4, 32, 1), (2e4, 40, 1), (3e4, 48, 1), (4e4, 56, 1), (1.5e5, 96, 2))


def curve(n: float) -> float:
    return E + A * (n / 1e5) ** -ALPHA


def multiplier_runs(cells=CELLS) -> pd.DataFrame:
    """Size cells whose losses follow one curve for standard and L(m·N) for each design; the
    seeds scatter every design of a seed alike (-0.01, 0, +0.01), so each cell's mean and each
    seed's gap are exact."""
    rows = []
    for n, width, depth in cells:
        for seed, off in enumerate((-0.01, 0.0, 0.01)):
            rows.append(run_row("scaling_size", "size", 10, n, "standard", seed,
                                curve(n) + off, width=width, depth=depth))
            rows += [run_row("scaling_size", "size", 10, n, d, seed, curve(m * n) + off,
                             width=width, depth=depth) for d, m in SHARE.items()]
    return pd.DataFrame(rows)


def exact_gap(design: str, n: float) -> float:
    return 100.0 * math.expm1(curve(SHARE[design] * n) - curve(n))


@pytest.fixture(autouse=True)
def fewer_resamples(monkeypatch):
    monkeypatch.setattr(BT, "BOOT", 200)


def test_the_fit_reads_sizes_a_third_of_the_held_out_cell_or_less():
    assert BT.split([1, 2, 3, 4, 12]) == ([1, 2, 3, 4], [12])
    assert BT.split([1, 2, 3, 4, 11]) == ([1, 2, 3], [11])  # 4 is not 3x below 11
    assert BT.split([4, 12, 30, 40]) == ([4, 12], [40])  # 30 < 3 x 12: neither
    assert BT.split([1, 2]) == ([], []) and BT.split([]) == ([], [])


def test_the_multiplier_form_recovers_its_own_curve_and_the_line_misses_it():
    recs = pd.DataFrame(BT.backtest(multiplier_runs()))
    held = BT.kind(recs, "heldout").set_index(["form", "design"])
    assert set(held.held_params) == {1.5e5} and set(held.fit_cells) == {4}
    for d in P.DESIGNS:
        want = exact_gap(d, 1.5e5)
        assert held.loc[("multiplier", d), "measured"] == pytest.approx(want, rel=1e-9)
        assert held.loc[("multiplier", d), "predicted"] == pytest.approx(want, rel=1e-4)
        assert held.loc[("multiplier", d), "covered"]
    # the line through log N cannot follow Q=K=V's curve 3.75x beyond its last size
    assert not held.loc[("line", "tied_qkv"), "covered"]
    pred = BT.kind(recs, "prediction")
    multi = pred[pred.form == "multiplier"].set_index(["design", "target"])
    assert set(multi.index) == {(d, t) for d in P.DESIGNS for t in S.TARGETS}
    got = np.array([multi.loc[(d, t), "gap_pct"] for d in P.DESIGNS for t in S.TARGETS])
    want = np.array([exact_gap(d, t) for d in P.DESIGNS for t in S.TARGETS])
    np.testing.assert_allclose(got, want, rtol=1e-3)
    assert (multi.lo <= multi.gap_pct).all() and (multi.gap_pct <= multi.hi).all()
    # only the designs a form passed for are extrapolated by it
    line_ok = set(held.loc["line"].index[held.loc["line"].covered])
    assert set(pred[pred.form == "line"].design) == line_ok


def test_sizes_too_close_together_are_not_back_tested_and_nothing_is_extrapolated(tmp_path):
    runs = size_runs(12.0, -2.0)  # 1e4 .. 4e5: only 3 cells at a third of the largest
    recs = pd.DataFrame(BT.backtest(runs))
    assert list(recs.kind) == ["untested"]
    assert "hold 3 cell(s) at ≤ 1/3 of the largest, and a back-test needs 4" in \
        recs.reason.iloc[0]
    data = study_data(runs, {S.PREDICTION: pd.DataFrame(S.prediction_records(runs)),
                             BT.MEASURE: recs})
    assert R.backtest_text(data).startswith("not back-tested: the sizes where standard uses "
                                            "attention (10,000 to 400,000 parameters, 40.0×)")
    assert not any("published" in getattr(b, "caption", "") for b in R.tables(data))
    assert "nothing is extrapolated to the published sizes" in R.answer_sentence(data)
    assert "carries little weight" not in R.answer_sentence(data)
    assert "not back-tested" in R.fig_size(data, tmp_path).caption


def test_the_report_extrapolates_only_the_forms_that_passed(tmp_path):
    runs = multiplier_runs()
    recs = pd.DataFrame(BT.backtest(runs))
    data = study_data(runs, {S.PREDICTION: pd.DataFrame(S.prediction_records(runs)),
                             BT.MEASURE: recs})
    tables = {b.caption.split(":")[0]: b for b in R.tables(data)}
    back = tables["The size trend's back-test"]
    assert len(back.rows) == 2 * len(P.DESIGNS)
    qkv = [r for r in back.rows if r[:2] == ("multiplier", label("tied_qkv"))][0]
    assert qkv[2] == "4: 10,000–40,000" and qkv[3] == "150,000 (3 seeds)" and qkv[6] == "yes"
    # the line misses every design here (its interval is the seeds' zero scatter), so the
    # published table holds the multiplier's predictions alone, each design at 300M, K=V at 1.2B
    assert {r[6] for r in back.rows if r[0] == "line"} == {"no"}
    cmp = [b for b in R.tables(data) if b.caption.startswith("Predicted by the forms")][0]
    assert [(r[0], r[1], r[2]) for r in cmp.rows] == [
        *((label(d), "multiplier", "300M") for d in P.DESIGNS),
        (label("tied_kv"), "multiplier", "1,200M")]
    text = R.backtest_text(data)
    assert text.startswith("back-tested on a cell of 150,000 parameters held out, ≥ 3× the 4 "
                           "cells fitted: ")
    assert text.endswith("the effective-parameter multiplier on standard's L(N) = E + A·N^-α "
                         "passed for " + ", ".join(map(label, P.DESIGNS)) +
                         " (only these are extrapolated)")
    assert "carries little weight" in R.answer_sentence(data)


def test_the_held_out_cell_is_never_tuned_and_trains_at_its_donors_rates():
    p = get_profile("scaling")
    size = [c for c in P.cells(p) if c.kind == "size"]
    held = [c for c in size if c.held]
    assert [(c.d_model, c.n_layers, c.n_heads) for c in held] == [(112, 2, 7)]
    assert P.donor(p, held[0]).d_model == 80 and P.donor(p, held[0]).n_layers == 2
    # the back-test holds it out: >= 3x every size up to 64 x 2, the fit's four where
    # attention was used in the first run (50k and up)
    assert BT.split([c.n_params for c in size if c.n_params > 45_000]) == (
        [50112.0, 56640.0, 78000.0, 100096.0], [float(held[0].n_params)])
    assert not [r for r in P.grid_runs(p) if r[1]["d_model"] == 112]  # never tuned
    grid = P.lr_grid(p)

    def loss(tags):  # 80 x 2 prefers the grid's lowest rate, every other cell its middle one
        want = grid[0] if (tags["d_model"], tags["n_layers"]) == (80, 2) else grid[1]
        return 1.0 if tags["lr"] == want else 2.0

    status = {run_id(s.to_dict()): ("done", loss(t)) for s, t in P.grid_runs(p)}
    p = dataclasses.replace(p, rates=Rates(scaling_tuned=status))
    status |= {run_id(s.to_dict()): ("done", 3.0) for s, t in P.edge_runs(p)}  # edges worse
    p = dataclasses.replace(p, rates=Rates(scaling_tuned=status))
    runs = P.main_runs(p, "size", p.size_seeds)
    rates = {(t["d_model"], t["n_layers"], t["design"]): t["lr"] for _, t in runs}
    assert {v for (w, _, _), v in rates.items() if w == 112} == {grid[0]}
    assert {v for (w, d, _), v in rates.items() if (w, d) == (64, 2)} == {grid[1]}
    assert len({d for (w, _, d) in rates if w == 112}) == 7  # every design and the control


def test_a_form_that_cannot_be_fitted_fails_its_back_test_and_is_not_extrapolated(monkeypatch):
    fit = BT._fit

    def no_multiplier(cells, form, p0=None):
        if form == "multiplier":
            raise RuntimeError("Optimal parameters not found")
        return fit(cells, form, p0)

    monkeypatch.setattr(BT, "_fit", no_multiplier)
    recs = pd.DataFrame(BT.backtest(multiplier_runs()))
    multi = recs[(recs.kind == "heldout") & (recs.form == "multiplier")]
    assert len(multi) == len(P.DESIGNS) and not multi.covered.any()
    assert multi.lo.isna().all() and (multi.failed == BT.BOOT).all()
    assert "multiplier" not in set(BT.kind(recs, "prediction").get("form", []))
