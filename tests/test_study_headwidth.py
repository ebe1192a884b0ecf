"""K = V's head-width axis (``plan.headwidth``, ``compute.headwidth``, ``render.headwidth``):
which runs it plans, that its rates are chosen on val with the grid's edge extended, and its
comparisons, shares and trend against values computed here independently (numpy, scipy's t
quantile, Holm by hand), the control's gate included."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from stats_oracle import t_interval

from qkvlab.experiments.ids import run_id
from qkvlab.experiments.registry import get_profile, runs_of
from qkvlab.studies.qkv.compute.effects import Status, effect
from qkvlab.studies.qkv.compute.headwidth import FAMILY, comparisons, reading, trend
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.plan import headwidth
from qkvlab.studies.qkv.plan.rates import RatesPending, lr_of
from qkvlab.studies.qkv.render.headwidth import (
    fig_q3_head_width,
    head_width_answer,
    head_width_blocks,
    head_width_rows,
    head_width_sentence,
)


def test_each_cell_splits_the_width_and_the_profiles_own_cell_is_lm_tied_kvs_runs():
    # quick leaves the axis to standard; its untuned lm with quick's old cells
    p = dataclasses.replace(get_profile("quick"), head_width_cells=((64, 8), (64, 4), (64, 1)))
    runs = headwidth.reported_runs(p)
    by = {(t["design"], t["d_model"], t["n_heads"], t["seed"]): s for s, t in runs}
    for (design, m, h, _), s in by.items():
        assert (s.model["d_model"], s.model["n_heads"]) == (m, h)
        assert s.model["n_layers"] == p.n_layers and s.task == "lm"
    # GQA-half needs two heads; every other cell compares both designs and has its control
    assert not any(d == "gqa_half" and h == 1 for d, _, h, _ in by)
    assert {d for d, _, h, _ in by if h == 8} == {"standard", "tied_kv", "gqa_half", "control"}
    assert by[("gqa_half", 64, 8, 0)].model["n_kv_heads"] == 4
    assert by[("tied_kv", 64, 1, 0)].model["design"] == "tied_kv"
    # the profile's own cell: the same specs as lm_tied_kv's and lm_gqa's, so the same runs
    own = {run_id(s) for (_, m, h, _), s in by.items() if (m, h) == (p.d_model, p.n_heads)}
    theirs = {run_id(s) for e in ("lm_tied_kv", "lm_gqa") for s, t in runs_of(e, p)
              if t["task"] == "lm" and t["arm"] == "equal"}
    assert own and own <= theirs
    assert len(runs) == len(set(run_id(s) for s, _ in runs))
    # every reported run is scored on the test split, as every comparison's is
    assert {s.train.test_batches for s, _ in runs} == {p.eval_batches}


def test_a_cell_that_does_not_split_into_whole_heads_is_refused():
    p = dataclasses.replace(get_profile("quick"), head_width_cells=((64, 3),))
    with pytest.raises(ValueError, match=r"head_width_cells \[\(64, 3\)\].*divide"):
        headwidth.reported_runs(p)


def test_rates_are_chosen_per_cell_on_val_and_an_edge_choice_extends_the_grid():
    p = get_profile("kv")
    p = dataclasses.replace(p, rates=dataclasses.replace(p.rates, stored={}))
    grid = headwidth.tuning_runs(p)
    keys = {(t["design"], t["d_model"], t["n_heads"]) for _, t in grid}
    assert len(grid) == len(keys) * len(p.lr_grid) * len(p.lr_seeds)
    assert all(s.train.test_batches == 0 and s.train.seed in p.lr_seeds for s, _ in grid)
    with pytest.raises(RatesPending, match="head_width_tune"):
        headwidth.reported_runs(p)
    lrs = sorted({lr_of("lm", m, p) for m in p.lr_grid})

    def at(stored):
        return dataclasses.replace(p, rates=dataclasses.replace(p.rates, stored=stored))
    # val loss lowest at the grid's smallest rate for K=V at 1 × 64, inside (the second rate)
    # for everything else
    def loss(t):
        target = lrs[0] if (t["design"], t["n_heads"]) == ("tied_kv", 1) else lrs[1]
        return 3.0 + abs(math.log(t["lr"] / target))
    stored = {run_id(s): ("done", loss(t)) for s, t in grid}
    edge = headwidth.edge_runs(at(stored))
    assert {(t["design"], t["n_heads"], t["lr"]) for _, t in edge} == \
        {("tied_kv", 1, lr_of("lm", min(p.lr_grid) ** 2 / sorted(p.lr_grid)[1], p))}
    with pytest.raises(RatesPending, match="head_width_tune_edge"):
        headwidth.chosen(at(stored))
    worse = {**stored, **{run_id(s): ("done", 9.0) for s, _ in edge}}
    chosen = headwidth.chosen(at(worse))
    assert chosen[("tied_kv", 64, 1)] == lrs[0] and chosen[("standard", 64, 8)] == lrs[1]
    # the point past the edge wins: the next one out is listed, and the choice waits for it
    better = {**stored, **{run_id(s): ("done", 1.0) for s, _ in edge}}
    further = headwidth.edge_runs(at(better))
    assert sorted({t["lr"] for _, t in further}) == [
        lr_of("lm", min(p.lr_grid) ** 3 / sorted(p.lr_grid)[1] ** 2, p), edge[0][0].train.lr]
    with pytest.raises(RatesPending, match="head_width_tune_edge"):
        headwidth.chosen(at(better))
    turned = {**better, **{run_id(s): ("done", 2.0) for s, t in further
                           if t["lr"] != edge[0][0].train.lr}}
    assert headwidth.chosen(at(turned))[("tied_kv", 64, 1)] == edge[0][0].train.lr
    runs = headwidth.reported_runs(at(worse))
    got = {(t["design"], t["d_model"], t["n_heads"]): s.train.lr for s, t in runs}
    assert got == {k: chosen[k] for k in got}
    assert {s.train.test_batches for s, _ in runs} == {p.eval_batches}


D_HEADS = {8: (64, 8), 16: (64, 4), 64: (64, 1)}
STD = np.array([3.00, 3.10, 2.95, 3.05])
KV_GAP = {8: np.array([0.060, 0.070, 0.050, 0.065]),  # per seed, K=V − standard (nats)
          16: np.array([0.040, 0.045, 0.030, 0.050]),
          64: np.array([0.010, 0.020, 0.000, 0.015])}
GQA_GAP = np.array([0.01, 0.012, 0.008, 0.011])


def _runs(control: float = 0.4) -> pd.DataFrame:
    rows = []
    for d_head, (m, h) in D_HEADS.items():
        vals = {"standard": STD, "tied_kv": STD + KV_GAP[d_head],
                "control": STD + control + 0.01 * np.arange(4)}
        if h > 1:
            vals["gqa_half"] = STD + GQA_GAP
        for design, v in vals.items():
            for seed, x in enumerate(v):
                rows.append({"experiment": "head_width", "design": design, "task": "lm",
                             "arm": "equal", "seed": seed, "d_model": m, "n_heads": h,
                             "d_head": d_head, "status": "done",
                             "run_id": f"{design}{m}{h}{seed}", "test_val_loss": float(x),
                             "spec.train.lr": 0.018 if design == "control" else 0.006})
    return pd.DataFrame(rows)


def _data(runs: pd.DataFrame) -> StudyData:
    p = dataclasses.replace(get_profile("smoke"), d_model=64,
                            head_width_cells=tuple(D_HEADS.values()))
    return StudyData(profile=p, runs=runs, comparisons=pd.DataFrame(), probe=pd.DataFrame(),
                     measures={})


def test_each_cell_is_a_paired_interval_holm_corrected_over_the_family():
    df = comparisons(_data(_runs()))
    for d_head, gap in KV_GAP.items():
        r = df[(df.design == "tied_kv") & (df.d_head == d_head)].iloc[0].to_dict()
        m, lo, hi, _ = t_interval(gap)
        e = effect(r)
        np.testing.assert_allclose([e.value, e.lo, e.hi], 100 * np.expm1([m, lo, hi]),
                                   rtol=1e-9, atol=1e-9)
        # the share: per seed the gap over the control's, mean and t interval
        sm, slo, shi, _ = t_interval(gap / (0.4 + 0.01 * np.arange(4)))
        np.testing.assert_allclose([r["share"], r["share_lo"], r["share_hi"]], [sm, slo, shi],
                                   rtol=1e-9)
    fam = df[df.family == FAMILY]
    assert set(fam.design) == {"tied_kv", "gqa_half"} and len(fam) == 5
    ps = fam.p_decided.to_numpy()
    want, run = np.empty_like(ps), 0.0
    for rank, i in enumerate(np.argsort(ps)):  # Holm by hand
        run = max(run, min(1.0, (len(ps) - rank) * ps[i]))
        want[i] = run
    np.testing.assert_allclose(fam.p_adj.to_numpy(), want, rtol=1e-12)
    assert (fam.attention_used == 1).all()
    assert df[df.design == "control"].family.isna().all()


def test_the_trend_is_the_mean_per_seed_slope_on_log2_d_head():
    t = trend(_data(_runs()))
    x = np.log2(sorted(KV_GAP))
    slopes = [np.polyfit(x, [KV_GAP[d][s] for d in sorted(KV_GAP)], 1)[0] for s in range(4)]
    m, lo, hi, _ = t_interval(slopes)
    np.testing.assert_allclose([t["slope"], t["lo"], t["hi"]], 100 * np.expm1([m, lo, hi]),
                               rtol=1e-9)
    assert t["reading"] == "falls" and t["d_heads"] == [8, 16, 64] and t["n"] == 4
    assert [reading(-2, -1), reading(1, 2), reading(-0.4, 0.3), reading(-2, 0.1)] == \
        ["falls", "grows", "flat", "undecided"]
    assert head_width_answer(_data(_runs())).startswith("At width 64 (d_head 8, 16, 64), K=V's "
                                                        "cost falls as d_head grows")


def test_a_control_level_with_standard_holds_every_verdict_back():
    data = _data(_runs(control=0.0))
    df = comparisons(data)
    kv = df[df.design != "control"]
    assert (kv.attention_used == 0).all()
    assert {effect(r).status for r in kv.to_dict("records")} == {Status.ATTENTION_UNUSED}
    assert trend(data)["reading"] == "attention_unused" and head_width_answer(data) == ""
    assert "none of these is a verdict" in head_width_sentence(data)


def test_the_report_shows_the_table_the_figure_and_a_sentence(tmp_path):
    data = _data(_runs())
    table, para = head_width_blocks(data)
    assert [r[1] for r in table.rows] == ["8 × 8", "4 × 16", "1 × 64"]
    assert table.rows[2][3] == "—"  # no GQA-half at one head
    assert [r[-1] for r in table.rows] == ["0.006 / 0.006 / 0.006 / 0.018"] * 2 + \
        ["0.006 / 0.006 / — / 0.018"]  # the rate each design trained at, per cell
    assert "falls as d_head grows" in para.text
    fig = fig_q3_head_width(data, tmp_path)
    assert fig is not None and (tmp_path / "q3_head_width.png").stat().st_size > 0
    assert "diamonds" not in fig.caption  # one width: no wider model to mark
    drawn = pd.read_csv(tmp_path / "q3_head_width.csv")
    assert set(drawn.design) == {"tied_kv", "gqa_half", "control"}
    rows = head_width_rows(data)
    assert len(rows) == 3 + 2 + 3 and set(rows.status) >= {"worse"}
    assert head_width_sentence(data).startswith("K=V against standard as the heads widen")
    empty = _data(_runs().iloc[0:0])
    assert head_width_blocks(empty) == [] and head_width_sentence(empty) == ""
    assert fig_q3_head_width(empty, tmp_path / "none") is None


def test_q3s_card_carries_each_decided_head_width_cell_but_the_profiles_own():
    """The card's numbers are the cells' own corrected effects (independent t intervals); the
    profile's cell (d_model 64, its n_heads) is the headline's comparison and is left out."""
    from qkvlab.studies.qkv.compute.cards import _q3_trained
    data = _data(_runs())
    data = dataclasses.replace(data, profile=dataclasses.replace(data.profile, n_heads=4))
    numbers, facts = _q3_trained(data)
    statuses = {r["d_head"]: effect(r).status for r in comparisons(data).to_dict("records")
                if r["design"] == "tied_kv"}
    decided = [d for d in (8, 64) if statuses[d] in (Status.WORSE, Status.BETTER)]
    assert decided and [n.what for n in numbers] == [
        f"tied K=V vs standard on lm, {h} head{'s' if h > 1 else ''} × d_head {d} (head width)"
        for d, (_, h) in D_HEADS.items() if d in decided]
    for n, d in zip(numbers, decided):
        m, lo, hi, _ = t_interval(KV_GAP[d])
        np.testing.assert_allclose([n.value, n.lo, n.hi], 100 * np.expm1([m, lo, hi]),
                                   rtol=1e-9)
        assert n.kind == statuses[d].value and n.scale == "d_model 64, 4 seeds"
    assert facts == {"head_width": {"worse": decided}}
    # nothing is decided where the control is level with standard
    level = _data(_runs(control=0.0))
    assert _q3_trained(level) == ([], {})
