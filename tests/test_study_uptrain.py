"""The controlled conversion (``plan.uptrain``, ``compute.uptrain``, ``render.uptrain``): which
runs it plans and when, and its comparisons against values computed here independently (numpy,
scipy's t quantile, Holm by hand), the control's gate included."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from stats_oracle import t_interval

from qkvlab.experiments.ids import run_id
from qkvlab.experiments.registry import get_profile, runs_of
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.compute.effects import Status, effect
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.compute.uptrain import (
    FAMILIES,
    VS_SCRATCH,
    VS_UNTIED,
    comparisons,
    start_gaps,
    steps_saved,
)
from qkvlab.studies.qkv.plan import edges, rates, uptrain
from qkvlab.studies.qkv.plan.uptrain import ParentsPending
from qkvlab.studies.qkv.render.uptrain import (
    fig_q3_uptrain,
    uptrain_answer,
    uptrain_blocks,
    uptrain_rows,
    uptrain_sentence,
)


def _stored(p, done: bool):
    """``p`` as read from a store where every parent (and tuning run) is done, or none is."""
    stored = {}
    if done:
        parents = [uptrain.parent(p, s) for s in p.seeds]
        parents += [uptrain.parent(p, s, tuning=True) for s in p.lr_seeds]
        stored = {run_id(s): ("done", 3.0) for s, _ in parents}
    return dataclasses.replace(p, rates=dataclasses.replace(p.rates, stored=stored))


def test_a_conversion_waits_for_its_parents_then_lists_every_arm():
    # quick leaves the controlled conversion to standard; its untuned lm at one fraction
    p = dataclasses.replace(get_profile("quick"), uptrain_fractions=(0.2,))
    with pytest.raises(ParentsPending, match="standard lm runs"):
        runs_of("lm_convert", p)  # no store: nothing is known to be done
    with pytest.raises(ParentsPending, match=f"{len(p.seeds)} of the {len(p.seeds)}"):
        uptrain.reported_runs(_stored(p, False))
    runs = uptrain.reported_runs(_stored(p, True))
    n = len(p.seeds) * (1 + len(p.uptrain_fractions) * (len(uptrain.UPTRAIN_STARTS) + 3))
    assert len(runs) == n
    by = {(t["design"], t["fraction"], t["seed"]): s for s, t in runs}
    P = uptrain.steps_of(p)
    parent = by[("standard", 0.0, 0)]
    for f in p.uptrain_fractions:
        u = uptrain.uptrain_steps(p, f)
        fit, keep = by[("fitted", f, 0)], by[(uptrain.UNTIED, f, 0)]
        assert fit.train.steps == keep.train.steps == u
        assert fit.from_run.spec == keep.from_run.spec == parent.to_dict()
        assert (fit.from_run.tie, fit.from_run.start) == ("kv", "fitted")
        assert (keep.from_run.tie, keep.from_run.start) == ("none", None)
        assert fit.model["design"] == "tied_kv" and "design" not in keep.model
        assert fit.train.lr == keep.train.lr == pytest.approx(
            parent.train.lr * uptrain.UPTRAIN_LR_MULT, rel=1e-2)
        for d in (uptrain.KV_SCRATCH, uptrain.STANDARD_SCRATCH):
            s = by[(d, f, 0)]
            assert s.from_run is None and s.train.steps == P + u
    # every reported run is scored on the test split, as every comparison's is
    assert {s.train.test_batches for s, _ in runs} == {p.eval_batches}
    # the parent is lm_tied_kv's standard run: the same spec, the same id, trained once
    std = {run_id(s) for s, t in runs_of("lm_tied_kv", p)
           if t["design"] == "standard" and t["task"] == "lm" and t["arm"] == "equal"}
    assert {run_id(uptrain.parent(p, s)[0]) for s in p.seeds} == std


def test_a_profile_without_fractions_lists_nothing():
    p = get_profile("quick")
    p = dataclasses.replace(p, uptrain_fractions=())
    assert uptrain.reported_runs(p) == [] and uptrain.tuning_runs(p) == []


UNTIED = np.array([3.00, 3.10, 2.95, 3.05])  # the untied model trained on, per seed
FITTED = UNTIED + np.array([0.010, 0.012, 0.008, 0.011])
AVG = UNTIED + np.array([0.06, 0.09, 0.04, 0.08])
KEEP = UNTIED + np.array([0.30, 0.20, 0.50, 0.10])
SCRATCH_KV = UNTIED + np.array([0.02, 0.00, 0.03, 0.01])
SCRATCH_STD = UNTIED - np.array([0.01, 0.02, 0.00, 0.01])
CONTROL = 3.6  # lm's attention-free control, far behind standard's ~3.0


def _runs(control: float = CONTROL) -> pd.DataFrame:
    rows = []
    for design, vals in (("fitted", FITTED), ("avg", AVG), ("keep_k", KEEP),
                         (uptrain.UNTIED, UNTIED), (uptrain.KV_SCRATCH, SCRATCH_KV),
                         (uptrain.STANDARD_SCRATCH, SCRATCH_STD)):
        for seed, v in enumerate(vals):
            rows.append({"experiment": "lm_convert", "design": design, "task": "lm",
                         "arm": "equal", "seed": seed, "fraction": 0.2, "status": "done",
                         "run_id": f"{design}{seed}", "test_val_loss": float(v)})
    for design, v in (("standard", UNTIED), ("control", UNTIED + control - 3.0)):
        for seed, x in enumerate(v):
            rows.append({"experiment": "lm_tied_kv", "design": design, "task": "lm",
                         "arm": "equal", "seed": seed, "status": "done",
                         "run_id": f"t{design}{seed}", "test_val_loss": float(x)})
    return pd.DataFrame(rows)


def _data(runs: pd.DataFrame) -> StudyData:
    p = dataclasses.replace(get_profile("smoke"), uptrain_fractions=(0.2,))
    return StudyData(profile=p, runs=runs, comparisons=results.comparisons(runs, p),
                     probe=pd.DataFrame(), measures={})


def test_the_comparisons_are_paired_t_intervals_in_percent_per_token():
    df = comparisons(_data(_runs()))
    assert set(df.family.dropna()) == set(FAMILIES)
    vs_untied = df[df.family == "Q3 conversion vs untied"].set_index("design")
    for design, vals in (("fitted", FITTED), ("avg", AVG), ("keep_k", KEEP)):
        m, lo, hi, _ = t_interval(vals - UNTIED)
        e = effect(vs_untied.loc[design].to_dict())
        got = np.array([e.value, e.lo, e.hi])
        want = 100 * np.expm1([m, lo, hi])  # % perplexity per token
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    vs_kv = df[df.family == "Q3 conversion vs K=V from scratch"].set_index("design")
    m, lo, hi, _ = t_interval(FITTED - SCRATCH_KV)
    e = effect(vs_kv.loc["fitted"].to_dict())
    np.testing.assert_allclose([e.value, e.lo, e.hi], 100 * np.expm1([m, lo, hi]), rtol=1e-9)
    ref = df[df.family.isna()].set_index("design")
    m, *_ = t_interval(SCRATCH_KV - SCRATCH_STD)
    assert effect(ref.loc[uptrain.KV_SCRATCH].to_dict()).value == pytest.approx(
        100 * math.expm1(m), rel=1e-12)
    assert ref.loc[uptrain.KV_SCRATCH, "baseline"] == uptrain.STANDARD_SCRATCH


def test_each_family_is_holm_corrected_and_the_control_gates_it():
    df = comparisons(_data(_runs()))
    for fam in FAMILIES:
        sub = df[df.family == fam]
        ps = sub.p_decided.to_numpy()
        order = np.argsort(ps)
        want = np.empty_like(ps)
        run = 0.0
        for rank, i in enumerate(order):  # Holm by hand
            run = max(run, min(1.0, (len(ps) - rank) * ps[i]))
            want[i] = run
        np.testing.assert_allclose(sub.p_adj.to_numpy(), want, rtol=1e-12)
        assert (sub.family_m == 3).all()
    assert (df.attention_used == 1).all()
    fitted = effect(df[(df.family == "Q3 conversion vs untied") & (df.design == "fitted")]
                    .iloc[0].to_dict())
    assert fitted.status in (Status.WORSE, Status.EQUIVALENT)  # decided: the gate is open
    # a control level with standard: nothing is decided, every row says so
    gated = comparisons(_data(_runs(control=3.0)))
    assert (gated.attention_used == 0).all()
    assert {effect(r).status for r in gated.to_dict("records")} == {Status.ATTENTION_UNUSED}
    assert "none of these is a verdict" in uptrain_sentence(_data(_runs(control=3.0)))


def test_the_report_shows_the_table_the_figure_and_a_sentence(tmp_path):
    data = _data(_runs())
    [table] = uptrain_blocks(data)
    assert len(table.rows) == 3 + 2 and table.headers[-1] == "vs K=V from scratch"
    fig = fig_q3_uptrain(data, tmp_path)
    assert fig is not None and (tmp_path / "q3_uptrain.png").stat().st_size > 0
    drawn = pd.read_csv(tmp_path / "q3_uptrain.csv")
    assert set(drawn.design) == {"fitted", "avg", "keep_k", uptrain.KV_SCRATCH, uptrain.UNTIED}
    text = uptrain_sentence(data)
    assert text.startswith("Converting the study's own standard lm") and "fitted" in text
    empty = _data(_runs().iloc[0:0].assign(experiment=[]))
    assert uptrain_blocks(empty) == [] and uptrain_sentence(empty) == ""
    assert fig_q3_uptrain(empty, tmp_path / "none") is None


def test_the_rate_is_chosen_on_val_and_a_choice_on_the_edge_extends_the_grid():
    p = get_profile("kv")
    lrs = {("lm", d, "equal"): 6e-3 for d in ("standard", "tied_kv")}
    p = dataclasses.replace(p, rates=dataclasses.replace(p.rates, lrs=lrs, stored={}))
    with pytest.raises(ParentsPending, match="tuning seeds' standard lm runs"):
        uptrain.tuning_runs(p)
    par = {run_id(uptrain.parent(p, s, tuning=True)[0]): ("done", 3.0) for s in p.lr_seeds}
    # the tuning seeds' parents are lr_tune's standard runs at standard's chosen rate
    assert set(par) <= {run_id(s) for s, t in rates.tuning_runs(p)
                        if (t["task"], t["design"], t["arm"], t["lr"]) == ("lm", "standard",
                                                                            "equal", 6e-3)}

    def at(stored):
        return dataclasses.replace(p, rates=dataclasses.replace(p.rates, stored=stored))
    grid = uptrain.tuning_runs(at(par))
    keys = {(t["design"], t["fraction"]) for _, t in grid}
    assert len(keys) == 4 * len(p.uptrain_fractions)
    assert all(s.train.test_batches == 0 and s.train.seed in p.lr_seeds for s, _ in grid)
    with pytest.raises(ParentsPending, match="uptrain_tune"):
        uptrain.edge_runs(at(par))
    # val loss falls toward small rates for "fitted" (its choice: the grid's low edge), and
    # is lowest at 0.3 for everyone else (inside: nothing to extend)
    lo = min(p.uptrain_lr_grid)
    beyond = float(f"{lo / 3:.3g}")
    def loss(t):
        m = t["mult"]
        return m if t["design"] == "fitted" else abs(math.log(m / 0.3))
    stored = {**par, **{run_id(s): ("done", loss(t)) for s, t in grid}}
    edge = uptrain.edge_runs(at(stored))
    assert {(t["design"], t["mult"]) for _, t in edge} == {("fitted", beyond)}
    assert len(edge) == len(p.uptrain_fractions) * len(p.lr_seeds)
    with pytest.raises(ParentsPending, match="uptrain_tune_edge"):
        uptrain.chosen_mults(at(stored))
    # the extension is worse than the grid's edge: the choice is back inside, not flagged
    done = {**stored, **{run_id(s): ("done", 0.5) for s, _ in edge}}
    mults = uptrain.chosen_mults(at(done))
    assert {m for (d, _), m in mults.items() if d == "fitted"} == {lo}
    assert {m for (d, _), m in mults.items() if d != "fitted"} == {0.3}
    last = float(f"{lo / 3 ** edges.EDGE_STEPS:.3g}")
    assert not uptrain.on_edge(p, lo) and not uptrain.on_edge(p, beyond)
    assert uptrain.on_edge(p, last)
    # a better extension is followed a step further out (×3 each), to the last point at most,
    # where the choice is flagged; a diverged one counts as infinite loss
    better = dict(stored)
    for step in range(1, edges.EDGE_STEPS + 1):
        edge = uptrain.edge_runs(at(better))
        assert sorted({t["mult"] for _, t in edge if t["design"] == "fitted"}) == sorted(
            float(f"{lo / 3 ** k:.3g}") for k in range(1, step + 1))
        with pytest.raises(ParentsPending, match="uptrain_tune_edge"):
            uptrain.chosen_mults(at(better))
        better |= {run_id(s): ("done", t["mult"]) for s, t in edge}  # lower is better here
    assert uptrain.edge_runs(at(better)) == edge  # nothing past the last point
    assert {m for (d, _), m in uptrain.chosen_mults(at(better)).items() if d == "fitted"} \
        == {last}
    lost = {**stored, **{run_id(s): ("diverged", None) for s, _ in edge}}
    assert {m for (d, _), m in uptrain.chosen_mults(at(lost)).items() if d == "fitted"} == {lo}


def test_the_answer_says_it_only_where_something_is_decided():
    text = uptrain_answer(_data(_runs()))
    assert text.startswith("Where the pretraining is ours") and "95% CI" in text
    assert uptrain_answer(_data(_runs(control=3.0))) == ""  # gated: nothing decided


def test_one_seed_has_no_p_and_no_verdict():
    runs = _runs()
    one = _data(runs[runs.seed == 0])
    df = comparisons(one)
    assert df.p_adj.isna().all() and (df.n == 1).all()
    assert {effect(r).status for r in df.to_dict("records")} <= {Status.UNDECIDED,
                                                                Status.ATTENTION_UNUSED}


def test_where_each_start_begins_is_a_paired_interval_on_the_first_batch():
    runs = _runs()
    first = {"fitted": UNTIED + 0.01, "avg": UNTIED + np.array([0.3, 0.5, 0.2, 0.4]),
             "keep_k": UNTIED + 2.0, uptrain.UNTIED: UNTIED}
    conv = runs[runs.experiment == "lm_convert"]
    starts = pd.DataFrame([{"run_id": r.run_id, "start_loss": float(first[r.design][r.seed])}
                           for r in conv.itertuples() if r.design in first])
    data = dataclasses.replace(_data(runs), starts=starts)
    g = start_gaps(data).set_index("design")
    for design in ("fitted", "avg", "keep_k"):
        m, lo, hi, _ = t_interval(first[design] - UNTIED)
        if np.allclose(first[design] - UNTIED, (first[design] - UNTIED)[0]):
            lo = hi = m  # every seed the same: a zero-width interval
        np.testing.assert_allclose(g.loc[design, ["value", "lo", "hi"]].to_numpy(float),
                                   100 * np.expm1([m, lo, hi]), rtol=1e-9, atol=1e-9)
    assert "×7.39" in uptrain_sentence(data)  # keep W_K starts more than doubled: a factor
    [_, para] = uptrain_blocks(data)
    assert "Where each start begins" in para.text


def test_the_rows_with_their_verdicts_as_the_report_writes_them():
    rows = uptrain_rows(_data(_runs()))
    assert len(rows) == 2 * 3 + 2 and rows.status.notna().all()
    fitted = rows[(rows.design == "fitted") & (rows.baseline == uptrain.UNTIED)].iloc[0]
    m, lo, hi, _ = t_interval(FITTED - UNTIED)
    np.testing.assert_allclose([fitted.value, fitted.lo, fitted.hi], 100 * np.expm1([m, lo, hi]),
                               rtol=1e-9)
    assert list(uptrain_rows(_data(_runs().iloc[0:0].assign(experiment=[]))).columns)[:4] == [
        "family", "fraction", "design", "baseline"]


def test_the_steps_a_fitted_start_saves_are_read_off_measured_points_only():
    # gaps vs untied (nats, every seed the same shift): fitted 0.08 at 10 steps, 0.02 at 50;
    # avg ends at 0.05 (50 steps); keep W_K at 0.10 (already above fitted's first point)
    shift = {("fitted", 0.01): 0.08, ("fitted", 0.05): 0.02, ("avg", 0.01): 0.2,
             ("avg", 0.05): 0.05, ("keep_k", 0.01): 0.3, ("keep_k", 0.05): 0.10}
    rows = []
    for (design, f), d in {**shift, **{(uptrain.UNTIED, 0.01): 0.0,
                                         (uptrain.UNTIED, 0.05): 0.0}}.items():
        for seed, u in enumerate(UNTIED):
            rows.append({"experiment": "lm_convert", "design": design, "task": "lm",
                         "arm": "equal", "seed": seed, "fraction": f, "status": "done",
                         "run_id": f"{design}{f}{seed}",
                         "test_val_loss": float(u + d + 1e-4 * seed)})
    runs = pd.concat([pd.DataFrame(rows), _runs().query("experiment == 'lm_tied_kv'")])
    p = dataclasses.replace(get_profile("smoke"), uptrain_fractions=(0.01, 0.05), steps=1000)
    data = StudyData(profile=p, runs=runs, comparisons=results.comparisons(runs, p),
                     probe=pd.DataFrame(), measures={})
    s = steps_saved(data).set_index("other")
    # avg's 0.05 lies between fitted's 0.08 (10 steps) and 0.02 (50) nats: half way in nats,
    # so half way in log steps
    want = math.exp(math.log(10) + math.log(5) * (0.08 - 0.05) / (0.08 - 0.02))
    assert s.loc["avg", "steps_fitted"] == pytest.approx(want, rel=1e-9)
    assert s.loc["avg", "ratio"] == pytest.approx(50 / want, rel=1e-9)
    assert not s.loc["avg", "at_first"]
    # keep W_K's 0.10 is above fitted's first point: an upper bound, flagged
    assert s.loc["keep_k", "at_first"] and s.loc["keep_k", "steps_fitted"] == 10
    text = uptrain_sentence(data)
    assert f"reached the gap avg ends at after 50 steps (+5.1% over the untied model) in " \
        f"≈{want:.0f} steps" in text
    assert "already below the gap keep W_K ends at" in uptrain_blocks(data)[-1].text


def test_q3s_card_carries_the_fitted_starts_decided_verdicts_at_the_largest_fraction():
    from qkvlab.studies.qkv.compute.cards import Card, _q3_trained
    from qkvlab.studies.qkv.render.cards import sentence
    data = _data(_runs())
    numbers, facts = _q3_trained(data)
    df = comparisons(data)
    want = {}
    for fam, base in ((VS_UNTIED, UNTIED), (VS_SCRATCH, SCRATCH_KV)):
        e = effect(df[(df.family == fam) & (df.design == "fitted")].iloc[0].to_dict())
        if e.status in (Status.WORSE, Status.BETTER, Status.EQUIVALENT):
            m, lo, hi, _ = t_interval(FITTED - base)
            want[fam] = (e.status.value, 100 * np.expm1([m, lo, hi]))
    assert want and len(numbers) == len(want)
    for n, (fam, (status, ci)) in zip(numbers, want.items()):
        assert n.kind == status and n.what.startswith(
            "standard lm converted to K=V (fitted start), trained +20% (")
        np.testing.assert_allclose([n.value, n.lo, n.hi], ci, rtol=1e-9)
    assert facts == {"converted": {"fraction": 0.2, **{f: s for f, (s, _) in want.items()}}}
    _, more = sentence(Card("q3", tuple(numbers), facts | {"decided": 1}, 0, 7, "", ""))
    assert "Converting the study's trained standard lm to K=V (fitted start) and training " \
           "+20% more is decided " in more
    assert more.endswith("1 trained comparison of this question decided from scratch in its "
                         "headline family.")
    # gated by lm's control: nothing to carry
    assert _q3_trained(_data(_runs(control=3.0))) == ([], {})
