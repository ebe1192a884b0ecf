"""Figures drawn from synthetic stored results: files exist, the CSV holds exactly the numbers
drawn, and one design keeps one colour across figures."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from test_report_verdicts import T975_DF2, _fill

from qkvlab.experiments.store import Store
from qkvlab.report import collect, figures

STD = {2: [0.50, 0.55, 0.52], 8: [0.80, 0.82, 0.79]}
TIED = {2: [0.30, 0.35, 0.31], 8: [0.78, 0.83, 0.80]}


@pytest.fixture
def data(tmp_path):
    with Store(tmp_path / "r.db") as store:
        for dh, std in STD.items():
            _fill(store, "bind_vs_dhead", "bind",
                  {("standard", "equal"): std, ("tied_kv", "equal"): TIED[dh]},
                  metric="accuracy", extra_tags={"d_head": dh})
        _fill(store, "lm_tied_kv", "lm", {("standard", "equal"): [2.0, 2.1, 2.2],
                                          ("tied_kv", "equal"): [2.1, 2.2, 2.4]})
        d = collect.collect(store, "smoke", {})
    d["q3"]["decode"] = {"standard/cache_bytes_per_token": 512.0, "tied_kv/cache_bytes_per_token": 256.0,
                         "standard/decode_tokens_per_s": 100.0, "tied_kv/decode_tokens_per_s": 120.0}
    return d


def test_bind_figure_files_and_data(data, tmp_path):
    out = tmp_path / "figs"
    fig = figures.fig_q3_bind(data, out)
    assert fig.name == "q3_bind"
    for f in (fig.png, fig.svg, fig.csv):
        assert (out / f).stat().st_size > 0
    img = mpimg.imread(out / fig.png)
    assert img.shape[0] > 200 and img.shape[1] > 500  # legible at laptop width
    df = pd.read_csv(out / fig.csv).sort_values(["design", "d_head"])
    got = df[["design", "d_head", "mean", "half"]].to_numpy().tolist()
    want = []
    for design, vals in (("standard", STD), ("tied_kv", TIED)):
        for dh in sorted(vals):
            v = np.array(vals[dh])
            want.append([design, dh, v.mean(), T975_DF2 * v.std(ddof=1) / np.sqrt(3)])
    assert [g[:2] for g in got] == [w[:2] for w in want]
    np.testing.assert_allclose([g[2:] for g in got], [w[2:] for w in want], rtol=1e-9)


def test_one_colour_per_design_across_figures(data, tmp_path):
    out = tmp_path / "figs"
    bind, kv = figures.fig_q3_bind(data, out), figures.fig_q3_kv(data, out)
    colour = figures.PALETTE["tied_kv"].lower()
    for f in (bind, kv):
        assert colour in (out / f.svg).read_text().lower()
    cost = pd.read_csv(out / kv.csv)
    cost = cost[cost.panel == "cost"].set_index("design")
    assert cost.loc["tied_kv", "cache_vs_standard"] == pytest.approx(0.5)
    assert cost.loc["tied_kv", "decode_vs_standard"] == pytest.approx(1.2)


def test_figures_without_data_are_skipped(tmp_path):
    with Store(tmp_path / "r.db") as store:
        empty = collect.collect(store, "smoke", {})
    assert figures.all_figures(empty, tmp_path / "figs") == {"q1": [], "q2": [], "q3": []}
