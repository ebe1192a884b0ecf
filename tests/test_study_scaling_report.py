"""The scaling profile end to end through a real store, with stored losses instead of training:
its four stages list their runs from what the store holds, the prediction is recorded, and the
report of a store that holds nothing else (no run carries an arm) is written and answers."""

from __future__ import annotations

import json

import pandas as pd

from conftest import scored
from qkvlab.experiments.registry import get_profile, runs_of
from qkvlab.experiments.store import Store
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.compute import backtest as BT
from qkvlab.studies.qkv.compute import scaling as S
from qkvlab.studies.qkv.plan import scaling as P
from qkvlab.studies.qkv.render import figures_scaling as R
from qkvlab.studies.qkv.render import page
from qkvlab.studies.qkv.study import Recorder, StudyConfig, run_measures

# per design: the test loss over standard's (nats); the control far behind, so attention is used
OFFSET = {"standard": 0.0, "tied_kv": 0.05, "tied_qk": 0.08, "tied_qkv": 0.2, "gqa_half": 0.01,
          "mqa": 0.02, "control": 0.5}


def _loss(tags: dict) -> float:
    """Smaller with parameters and steps; the grid's middle rate best; a seed's noise."""
    base = 4.0 - 0.1 * (tags["cell_params"] / 1e5) - 0.05 * (tags["steps"] / 1000)
    off = abs(tags["lr"] - P.lr_grid(get_profile("scaling"))[1]) * 10
    noise = 0.002 * ((7 * tags["seed"] + tags["steps"] + len(tags["design"])) % 5)
    return base + OFFSET[tags["design"]] + off + noise


def test_a_scaling_only_store_runs_its_stages_and_writes_a_report(tmp_path, monkeypatch):
    monkeypatch.setattr(BT, "BOOT", 100)  # the back-test's resamples: enough to run its path
    p = get_profile("scaling")
    db = tmp_path / "r.db"
    with Store(db) as store:
        counts = {}
        for name in P.EXPERIMENTS:  # each stage listed from the one before's stored results
            runs = runs_of(name, p, store)
            counts[name] = len(runs)
            for rid, (_, t) in zip(store.add(name, p.name, runs), runs):
                if store.claim(rid):
                    v = _loss(t)
                    store.finish(rid, "done", 1, scored({"val_loss": v}) if "seed" in t
                                 and t["seed"] < 100 else {"val_loss": v}, {"n_params": 1})
        assert counts["scaling_tune_edge"] == 0  # the middle rate wins everywhere
        # 8 tuned sizes and the back-test's held-out one, 7 designs, 3 seeds
        assert counts["scaling_budget"] == 4 * 7 * 6 and counts["scaling_size"] == 9 * 7 * 3
        rec = Recorder(store, p.name)
        run_measures(rec, StudyConfig(profile=p.name, db=str(db), progress=False))
        assert rec.notes == []
        data = results.load(store, p.name)
    assert not data.runs.empty and data.runs.arm.isna().all()
    pred = data.measure(S.PREDICTION)
    assert set(zip(pred.design, pred.target)) == {(d, t) for d in P.DESIGNS for t in S.TARGETS}
    bt = data.measure(BT.MEASURE)  # the size trend's back-test, stored before the report
    assert not bt.empty and set(bt.kind) <= {"heldout", "prediction", "untested"}
    index = page.write_report(data, tmp_path / "report")
    html = index.read_text()
    assert "Predicted" in html and "gap" in html
    assert R.backtest_text(data).split(':')[0] in html  # its outcome, in the size figure
    verdicts = json.loads((tmp_path / "report" / "verdicts.json").read_text())
    assert verdicts  # the answers on top are generated from the stored decisions
    md = (tmp_path / "report" / "report.md").read_text()
    answers = md[md.index("## The answers"):md.index("## Summary")]
    assert "Profile scaling trains only the gap of each tie" in answers
    assert "At scale: each tie's per-token gap to standard against training budget" in answers
    assert "No comparison of this question" not in answers and "Q1 —" not in answers
    figs = {f.name for f in (tmp_path / "report" / "figures").glob("*.png")}
    assert any("budget" in f for f in figs) and any("size" in f for f in figs), figs
    # the budget rule read every design
    trend = S.budget_trend(S.gaps(S.losses(data.runs)))
    assert set(trend.design) == set(P.DESIGNS)
    assert set(trend.verdict) <= {S.SHRINKS, S.GROWS, S.FLAT}
    # no comparison rows, but the verdict columns `qkvlab study --agree` reads
    cmp = pd.read_csv(tmp_path / "report" / "comparisons.csv")
    assert cmp.empty and {"verdict", "raw_verdict", "effect"} <= set(cmp.columns)
