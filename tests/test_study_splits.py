"""Three splits in the study: rates and every choice on val, reported numbers on test.

Fake runs written through the real store carry different val and test numbers, so each check
says which split a number was read from.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from qkvlab.experiments import registry
from qkvlab.experiments.store import Store
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.compute.effects import Status, effect
from qkvlab.studies.qkv.plan import profiles, rates
from qkvlab.studies.qkv.plan.experiments import BY_NAME, ORDER
from qkvlab.studies.qkv.plan.vocab import CONTROL, reported
from qkvlab.studies.qkv.render.tables import compare_table, margins_table
from qkvlab.studies.qkv.render.text import pm
from qkvlab.studies.qkv.plan.profiles import Rates
from qkvlab.studies.qkv.plan.questions import tuned_designs

VAL = {"standard": [2.00, 2.10, 2.20], "tied_kv": [2.01, 2.11, 2.21], CONTROL: [3.0, 3.1, 3.2]}
TEST = {"standard": [2.05, 2.12, 2.30], "tied_kv": [2.40, 2.52, 2.66], CONTROL: [3.5, 3.6, 3.7]}


def _fill(store: Store, test: dict | None = None, skip_test=(), train=None) -> None:
    """lm_tied_kv runs finished with val loss ``VAL`` and test loss ``test`` (``TEST``); runs
    (design, seed) in ``skip_test`` finished without a test score; ``train``: the spec's."""
    test = TEST if test is None else test
    for design, vals in VAL.items():
        for seed, v in enumerate(vals):
            spec = {"task": "lm", "model": {"design": design}, "seed": seed,
                    **({"train": train} if train is not None else {})}
            tags = {"task": "lm", "design": design, "arm": "equal", "seed": seed}
            (rid,) = store.add("lm_tied_kv", "smoke", [(spec, tags)])
            store.claim(rid)
            final = {"val_loss": v}
            if (design, seed) not in skip_test:
                final["test_val_loss"] = test[design][seed]
            store.finish(rid, "done", 10, final, {"n_params": 1000})


def test_reported_names_the_test_score_of_a_metric():
    assert [reported(m) for m in ("val_loss", "accuracy", "bits_per_char", "chrf")] == \
        ["test_val_loss", "test_accuracy", "test_bits_per_char", "test_chrf"]
    assert reported("tokens_per_s") == "tokens_per_s"  # throughput is no split's score


def test_comparisons_and_their_table_read_the_test_split(tmp_path):
    with Store(tmp_path / "r.db") as store:
        _fill(store)
        data = results.load(store, "smoke")
    df = data.compared("lm_tied_kv", metric="val_loss").set_index("design")
    for design in VAL:
        assert df.loc[design, "mean"] == pytest.approx(np.mean(TEST[design]), rel=1e-12)
    d = np.array(TEST["tied_kv"]) - np.array(TEST["standard"])
    e = effect(df.loc["tied_kv"].to_dict())
    assert e.value == pytest.approx(100 * math.expm1(d.mean()), rel=1e-9)
    assert e.status is Status.WORSE  # on val it would be +1% (equivalent or undecided)
    table = compare_table(data.compared("lm_tied_kv"), "lm", ("val_loss",))
    means = {r[2]: r[-3] for r in table.rows}
    assert means["standard"] == pm(np.mean(TEST["standard"]), df.loc["standard", "half"], 4)
    assert means["standard"] != pm(np.mean(VAL["standard"]), df.loc["standard", "half"], 4)


def test_a_finished_run_without_a_test_score_enters_as_lost(tmp_path):
    with Store(tmp_path / "r.db") as store:
        _fill(store, skip_test={("tied_kv", 1)})
        data = results.load(store, "smoke")
    row = data.compared("lm_tied_kv", metric="val_loss", design="tied_kv").iloc[0]
    # counted, not dropped: 3 seeds, one failed, entering at the worst value (chance or the
    # worst finished run of the comparison, the control's 3.7 here)
    assert (row["n"], row["failed"], row["n_pairs"], row["lost"]) == (3, 1, 3, 1)
    worst = max(max(v) for v in TEST.values())
    assert row["lost_value"] >= worst


def test_runs_of_an_earlier_definition_without_test_scores_are_not_read(tmp_path):
    """A store keeps the runs of an experiment's earlier definition (same tags, no test
    batches): they neither stand in for the current runs nor count as lost."""
    old = {d: [v + 5 for v in vals] for d, vals in VAL.items()}
    with Store(tmp_path / "r.db") as store:
        _fill(store, test=old, skip_test={(d, s) for d in VAL for s in range(3)},
              train={"test_batches": 0})
        _fill(store, train={"test_batches": 2})
        data = results.load(store, "smoke")
    df = data.compared("lm_tied_kv", metric="val_loss").set_index("design")
    for design in VAL:
        assert df.loc[design, "mean"] == pytest.approx(np.mean(TEST[design]), rel=1e-12)
        assert (df.loc[design, "n"], df.loc[design, "failed"]) == (3, 0)


def test_rates_are_chosen_on_val_and_tuning_runs_never_score_test(tmp_path):
    p = dataclasses.replace(profiles.PROFILES["smoke"], lr_grid=(0.5, 1.0, 2.0),
                            lr_seeds=(100,))
    runs = registry.runs_of("lr_tune", p)
    assert {s.train.test_batches for s, _ in runs} == {0}
    with Store(tmp_path / "r.db") as store:
        ids = store.add("lr_tune", p.name, runs)
        for rid, (_, tags) in zip(ids, runs):
            store.claim(rid)
            mid = tags["lr"] == rates.lr_of(tags["task"], 1.0, p)
            # val prefers the middle rate, a (never stored in practice) test score the others
            store.finish(rid, "done", 1, {"val_loss": 2.0 if mid else 2.5,
                                          "test_val_loss": 3.0 if mid else 1.0}, {"n_params": 1})
        chosen = rates.chosen_lrs(p, store)
    assert chosen and all(lr == rates.lr_of(k[0], 1.0, p) for k, lr in chosen.items())


@pytest.mark.parametrize("name", ["smoke", "quick", "standard"])
def test_every_reported_run_is_scored_on_test(name):
    p = profiles.PROFILES[name]
    if p.lr_grid:  # comparisons at the task's rate, as if lr_tune had chosen it
        scale = {("lm", tag, "equal", d, i): rates.lr_of("lm", 1.0, p)
                 for tag, d, i in rates.placement_keys(p)}
        p = dataclasses.replace(p, rates=Rates(
            lrs={(t, d, a): rates.lr_of(t, 1.0, p) for t, labels in tuned_designs().items()
                 for d in ("standard", *labels) for a in ("equal", "matched")} | scale,
            scale_edge_points={k: () for k in scale}))
    if p.scaling_lr_grid:  # scaling's runs at lm's rate, as if scaling_tune had chosen it
        p = dataclasses.replace(p, scaling_lr_grid=())
    # tuning runs score val only; lm_convert's are checked in test_study_uptrain (they need
    # their parents done), head_width's in test_study_headwidth (they need their rates)
    got = {(e, s.train.test_batches) for e in ORDER
           if BY_NAME[e].role != "tuning" and e not in ("lm_convert", "head_width")
           for s, _ in registry.runs_of(e, p)}
    assert got == {(e, p.eval_batches) for e, _ in got}
    assert p.test_batches == p.eval_batches > 0


def test_the_report_says_which_split_each_number_comes_from():
    p = profiles.PROFILES["quick"]
    caption = margins_table(p).caption
    assert (f"Rates and every choice on val; reported numbers on the test split "
            f"({p.test_batches} batches per run") in caption
