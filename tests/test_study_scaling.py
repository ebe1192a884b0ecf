"""lm_scaling: its runs (same depth and d_head at each width) and its figure's numbers."""

from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from conftest import scored
from qkvlab.env import environment
from qkvlab.experiments import registry
from qkvlab.experiments.store import Store
from qkvlab.studies.qkv.plan import profiles
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.plan import scaling as scaling_plan
from qkvlab.studies.qkv.plan import vocab
from qkvlab.studies.qkv.render import figures, figures_q, tables

T975_DF2 = 4.302652729911275


def test_scaling_runs_keep_depth_and_d_head_and_tag_the_width():
    p = profiles.PROFILES["smoke"]
    runs = registry.runs_of("lm_scaling", p)
    d_head = p.d_model // p.n_heads
    assert {t["d_model"] for _, t in runs} == set(p.scale_widths)
    for spec, tags in runs:
        m = spec.model
        assert (m["d_model"], m["n_heads"], m["n_layers"]) == (
            tags["d_model"], max(1, tags["d_model"] // d_head), p.n_layers)
        assert tags["arm"] == "equal"
        assert tags["design"] in ("standard", *vocab.SCALED, vocab.CONTROL)
        if tags["design"] == "gqa_half":
            assert m["n_kv_heads"] == vocab.half_kv(m["n_heads"])
    assert len(runs) == len(p.scale_widths) * (2 + len(vocab.SCALED)) * len(p.seeds)  # + control


def test_gqa_half_shares_half_the_kv_heads_or_the_largest_divisor_below_half():
    assert {n: vocab.half_kv(n) for n in range(1, 13)} == {
        1: 1, 2: 1, 3: 1, 4: 2, 5: 1, 6: 3, 7: 1, 8: 4, 9: 3, 10: 5, 11: 1, 12: 6}
    # every head count the scaling profiles size gets a kv count that divides it
    for name in ("scaling", "full"):
        p = profiles.PROFILES[name]
        for c in scaling_plan.cells(p):
            kv = vocab.DESIGNS["gqa_half"].model_options(
                dataclasses.replace(p, n_heads=c.n_heads))["n_kv_heads"]
            assert c.n_heads % kv == 0 and kv <= max(1, c.n_heads // 2), c


def test_scaling_figure_reads_perplexity_per_width(tmp_path):
    std = {16: [2.0, 2.1, 2.2], 32: [1.8, 1.85, 1.9]}
    kv = {16: [2.05, 2.12, 2.26], 32: [1.9, 1.97, 2.0]}
    env = environment()
    with Store(tmp_path / "r.db") as store:
        for w in std:
            for design, vals in (("standard", std[w]), ("tied_kv", kv[w])):
                for seed, v in enumerate(vals):
                    spec = {"task": "lm", "model": {"design": design, "d_model": w}, "seed": seed}
                    tags = {"task": "lm", "design": design, "arm": "equal", "seed": seed,
                            "d_model": w}
                    (rid,) = store.add("lm_scaling", "smoke", [(spec, tags)])
                    store.claim(rid)
                    store.finish(rid, "done", 1, scored({"val_loss": v}),
                                 {"n_params": 1000 * w, **env})
        data = results.load(store, "smoke")
    with plt.rc_context(figures_q.STYLE):
        fig = figures.fig_scaling(data, tmp_path / "figs")
    df = pd.read_csv(tmp_path / "figs" / fig.csv)
    want = []
    for w in (16, 32):
        d = np.subtract(kv[w], std[w])
        m, h = d.mean(), T975_DF2 * d.std(ddof=1) / np.sqrt(3)
        want.append([w, 1000 * w, *(100 * np.expm1([m, m - h, m + h]))])
    np.testing.assert_allclose(df[["d_model", "params", "value", "lo", "hi"]].to_numpy(), want,
                               rtol=1e-9)
    table = tables.scaling_blocks(data)[0]
    assert [r[1] for r in table.rows] == ["16", "32"]
    assert table.rows[1][4].startswith("worse")


def test_budget_reads_val_loss_at_half_and_full_budget(tmp_path):
    curves = {0: {100: 2.4, 200: 2.2, 300: 2.1, 400: 2.0}, 1: {100: 2.5, 200: 2.3, 300: 2.2,
                                                                400: 2.1}}
    env = environment()
    with Store(tmp_path / "r.db") as store:
        for seed, curve in curves.items():
            spec = {"task": "lm", "model": {}, "seed": seed}
            tags = {"task": "lm", "design": "standard", "arm": "equal", "seed": seed}
            (rid,) = store.add("lm_tied_kv", "smoke", [(spec, tags)])
            store.claim(rid)
            for step, v in curve.items():
                store.log(rid, step, {"val_loss": v})
            store.finish(rid, "done", 400, scored({"val_loss": curve[400]}), {"n_params": 1, **env})
        data = results.load(store, "smoke")
    (row,) = data.budget.to_dict("records")
    assert (row["task"], row["design"], row["half_step"], row["steps"], row["seeds"]) == (
        "lm", "standard", 200, 400, 2)
    np.testing.assert_allclose([row["half"], row["full"], row["change_pct"]],
                               [2.25, 2.05, 100 * (2.05 / 2.25 - 1)], rtol=1e-12)
    assert tables.budget_table(data)[0].rows == (("lm", "standard", "2", "2.25 (step 200)",
                                                "2.05 (step 400)", "-8.9%"),)
