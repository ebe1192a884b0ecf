"""The study's figures drawn from synthetic results written through the real store API.

Each figure's CSV must hold exactly the numbers drawn; the expected numbers are computed here
independently (numpy and the t quantile for 2 degrees of freedom) and compared whole, both ways.
"""

from __future__ import annotations

import math
import re

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from conftest import scored
from qkvlab.data import get_task
from qkvlab.experiments.store import Store
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.plan.vocab import DESIGNS, METRICS, TASK_METRIC
from qkvlab.studies.qkv.render import figures, figures_q

T975_DF2 = 4.302652729911275  # Student t, 97.5% quantile, 2 degrees of freedom
SEEDS = (0, 1, 2)
# final metric per (task, design, arm), one value per seed; standard's runs are shared by the
# experiments that use the same spec (as in the study: same spec, same run)
STD = {"lm": [2.00, 2.10, 2.20], "mlm": [3.00, 3.20, 3.10], "translate": [4.0, 4.2, 4.1],
       "mqar": [0.90, 0.85, 0.95], "relation": [0.70, 0.72, 0.75]}
STD_MATCHED = {"lm": [2.02, 2.08, 2.21], "mlm": [3.01, 3.22, 3.05], "translate": [4.1, 4.1, 4.0],
               "mqar": [0.91, 0.86, 0.90], "relation": [0.69, 0.74, 0.76]}
ALT = {("lm", "equal"): [2.05, 2.12, 2.26], ("lm", "matched"): [2.04, 2.18, 2.20],
       ("translate", "equal"): [4.1, 4.4, 4.15], ("translate", "matched"): [4.0, 4.3, 4.2]}
CHRF = {"standard": [20.0, 22.0, 21.0], "alt": [19.0, 22.5, 20.0]}
TIED_QK = {d: {(t, a): [v * (1 + s) for v in vals]
               for t in STD for a, vals in (("equal", STD[t]), ("matched", STD_MATCHED[t]))}
           for d, s in (("tied_qk", 0.01), ("tied_qk_selfmask", -0.02), ("tied_qkv", 0.05))}
TIED_QK["tied_qk"][("mqar", "equal")] = [0.80, 0.70, 0.90]  # not a constant ratio
KV = {"equal": [2.10, 2.25, 2.30], "matched": [2.05, 2.15, 2.25]}
GQA = [2.03, 2.14, 2.28]
KV_CROSS = {"equal": [4.3, 4.35, 4.2], "matched": [4.2, 4.3, 4.1]}
BIND_M = 2  # bind_codes' bits: the forest and summary read d_head = m at the largest m
BIND_STD = {2: [0.50, 0.55, 0.52], 8: [0.80, 0.82, 0.79]}
BIND_KV = {2: [0.30, 0.35, 0.31], 8: [0.78, 0.83, 0.80]}
DECODE = [{"design": "standard", "cache_bytes_per_token": 512.0, "decode_tokens_per_s": 100.0},
          {"design": "tied_kv", "cache_bytes_per_token": 256.0, "decode_tokens_per_s": 120.0},
          {"design": "gqa_half", "cache_bytes_per_token": 256.0, "decode_tokens_per_s": 110.0}]


def _run(store: Store, experiment: str, task: str, design: str, seed: int, final: dict,
         arm: str | None = "equal", tags: dict | None = None, log: dict | None = None) -> str:
    """Register (or join) one run and finish it with ``final``; returns its id."""
    extra = {k: v for k, v in {"arm": arm, **(tags or {})}.items() if v is not None}
    spec = {"task": task, "model": {"design": design, **extra}, "seed": seed}
    (rid,) = store.add(experiment, "smoke", [(spec, {"task": task, "design": design,
                                                     "seed": seed, **extra})])
    if store.claim(rid):
        for step, metrics in (log or {}).items():
            store.log(rid, step, metrics)
        store.finish(rid, "done", 10, scored(final), {"n_params": 1000, "tokens_per_s": 1.0,
                                              "params": {"attention": 100}})
    return rid


def _arms(store, experiment, task, designs: dict, metric: str, arms=("equal", "matched"),
          tags=None) -> dict:
    """standard and ``designs`` ({design: {arm: values}}) per arm and seed; run ids."""
    std = {"equal": STD.get(task), "matched": STD_MATCHED.get(task)}
    ids = {}
    for arm in arms:
        for d, vals in {"standard": std, **designs}.items():
            for seed, v in zip(SEEDS, vals[arm]):
                ids[(d, arm, seed)] = _run(store, experiment, task, d, seed, {metric: v}, arm,
                                           tags)
    return ids


def _measure(store, name, spec, records, run=None):
    store.measure(name, {"profile": "smoke", **spec}, lambda: records, run=run)


def fill(store: Store) -> None:
    """Every experiment and measure the figures read, at small synthetic values."""
    for t in ("lm", "translate"):
        ids = {}
        for arm in ("equal", "matched"):
            for d, vals in (("standard", (STD if arm == "equal" else STD_MATCHED)[t]),
                            ("alt", ALT[(t, arm)])):
                for seed, v in zip(SEEDS, vals):
                    final = {"val_loss": v, **({"chrf": CHRF[d][seed]} if t == "translate" else {})}
                    ids[(d, arm, seed)] = _run(store, "alt_vs_standard", t, d, seed, final, arm)
        if t == "lm":
            for (d, arm, seed), rid in ids.items():
                if arm == "equal":
                    _measure(store, "convex_range", {"run": rid},
                             {"outside_share": 0.0 if d == "standard" else 0.1 + 0.05 * seed,
                              "range_ratio": 0.5 + 0.1 * seed + (d == "alt")}, run=rid)
    for t in STD:
        if t == "translate":
            continue
        metric = METRICS[TASK_METRIC[t]].stored  # mlm's masked_loss is stored as val_loss
        ids = _arms(store, "tied_qk_qkv", t,
                    {d: {a: v[(t, a)] for a in ("equal", "matched")} for d, v in TIED_QK.items()},
                    metric)
        if t in ("lm", "relation"):
            for (d, arm, seed), rid in ids.items():
                if arm == "equal":
                    _measure(store, "own_position", {"run": rid},
                             {"own_weight": 0.1 * (1 + seed) + 0.3 * (d == "tied_qk"),
                              "uniform": 0.2}, run=rid)
    _arms(store, "lm_tied_kv", "lm", {"tied_kv": KV}, "val_loss")
    _arms(store, "lm_gqa", "lm", {"gqa_half": {"equal": GQA}}, "val_loss", arms=("equal",))
    _arms(store, "kv_translate", "translate", {"tied_kv_cross": KV_CROSS}, "val_loss")
    for dh, std in BIND_STD.items():
        for d, vals in (("standard", std), ("tied_kv", BIND_KV[dh])):
            for seed, v in zip(SEEDS, vals):
                _run(store, "bind_vs_dhead", "bind_codes", d, seed, {"accuracy": v},
                     tags={"m": BIND_M, "d_head": dh})
    for kind, task in (("encoder", "mlm"), ("decoder", "lm_char")):
        for seed in SEEDS:
            rid = _run(store, "symmetry_emergence", task, "standard", seed,
                       {"val_loss": 3.0, "bits_per_char": 3.0 / math.log(2)},
                       arm=None, tags={"kind": kind})
            _measure(store, "symmetry_steps", {"run": rid},
                     [{"step": s, "role": kind, "symmetry": s * (0.05 if kind == "encoder"
                                                                 else 0.01) + 0.01 * seed}
                      for s in (0, 3, 6)], run=rid)
    for dh in (16, 64):
        for scale in ("inside", "outside", "both", "none"):
            _run(store, "scale_probe", "lm", scale, 0, {"val_loss": 2.0 + dh / 100}, arm=None,
                 tags={"scale": scale, "d_head": dh},
                 log={0: {"probe/saturated": dh / 100, "probe/norm_entropy": 0.5,
                          "probe/grad_WQ": 1.0 + dh, "probe/grad_WK": 1.0}})
    _measure(store, "decode_speed", {}, DECODE)
    _measure(store, "pretrained", {"source": "minilm"},
             [{"level": "summary", "role": "encoder", "measure": "symmetry", "mean": 0.3,
               "std": 0.1, "null_mean": 0.0, "null_std": 0.05, "null_lo": -0.1, "null_hi": 0.1,
               "share_above_null": 0.8, "n_heads": 12}]
             + [{"level": "layer", "role": "encoder", "layer": i, "measure": m, "value": v + i / 10}
                for i in range(3) for m, v in (("symmetry", 0.2), ("cka", 0.9))])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    with Store(tmp_path_factory.mktemp("store") / "r.db") as store:
        fill(store)
        return results.load(store, "smoke")


@pytest.fixture(scope="module")
def drawn(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("figs")
    return out, figures.all_figures(data, out)


def _ci(x) -> tuple[float, float]:
    x = np.asarray(x, dtype=float)
    return x.mean(), T975_DF2 * x.std(ddof=1) / np.sqrt(len(x))


def _effect(a, b, acc: bool) -> list[float]:
    """value, lo, hi of a forest row: 100·Δ accuracy (points), or the paired Δ loss mapped to
    % perplexity through exp (mean and both 95% CI bounds)."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    m, h = _ci(d)
    f = (lambda x: 100 * x) if acc else (lambda x: 100 * np.expm1(x))
    return [f(m), f(m - h), f(m + h)]


def _csv(drawn, name: str) -> pd.DataFrame:
    out, figs = drawn
    (fig,) = [f for fs in figs.values() for f in fs if f.name == name]
    return pd.read_csv(out / fig.csv)


def test_every_figure_drawn_with_files(drawn):
    out, figs = drawn
    names = {q: [f.name for f in fs] for q, fs in figs.items()}
    assert names == {"q1": ["forest_q1", "q1_alt_loss", "q1_scale_probe", "q1_convex"],
                     "q2": ["forest_q2", "q2_own_position",
                            "q2_pretrained_symmetry", "q2_zoo", "q2_symmetry_emergence"],
                     "q3": ["forest_q3", "q3_bind", "q3_kv"],
                     "scaling": [], "setup": [],  # see test_study_scaling.py, test_study_lr.py
                     "scaling_gap": []}
    for f in (f for fs in figs.values() for f in fs):
        for path in (f.png, f.svg, f.csv):
            assert (out / path).stat().st_size > 0
        h, w = mpimg.imread(out / f.png).shape[:2]
        assert h > 200 and w > 500  # legible at laptop width
        assert w < 1500  # and not wider than a laptop screen at 110 dpi


def test_bind_figure_csv(drawn):
    df = _csv(drawn, "q3_bind").sort_values(["design", "d_head"])
    got = df[["m", "design", "arm", "d_head"]].to_numpy().tolist()
    want = [[BIND_M, d, "equal", dh] for d in ("standard", "tied_kv") for dh in sorted(BIND_STD)]
    assert got == want
    exp = [[len(SEEDS), *_ci(vals[dh])] for vals in (BIND_STD, BIND_KV) for dh in sorted(vals)]
    np.testing.assert_allclose(df[["n", "mean", "half"]].to_numpy(), exp, rtol=1e-9)


def test_forest_q2_loss_and_accuracy_rows(drawn):
    df = _csv(drawn, "forest_q2")
    want = []
    for d, vals in TIED_QK.items():
        for t in ("lm", "mlm", "mqar", "relation"):
            for arm, std in (("equal", STD[t]), ("matched", STD_MATCHED[t])):
                a, b = np.array(vals[(t, arm)]), np.array(std)
                acc = t in ("mqar", "relation")
                want.append([d, t, arm, "accuracy" if acc else "loss", *_effect(a, b, acc)])
    assert df[["design", "task", "arm", "panel"]].to_numpy().tolist() == [w[:4] for w in want]
    np.testing.assert_allclose(df[["value", "lo", "hi"]].to_numpy(), [w[4:] for w in want],
                               rtol=1e-9, atol=1e-12)


def test_forest_q3_rows_and_bind_at_d_head_m(drawn):
    df = _csv(drawn, "forest_q3")
    cases = [("tied_kv", "lm", "equal", KV["equal"], STD["lm"]),
             ("tied_kv", "lm", "matched", KV["matched"], STD_MATCHED["lm"]),
             ("gqa_half", "lm", "equal", GQA, STD["lm"]),
             ("tied_kv_cross", "translate", "equal", KV_CROSS["equal"], STD["translate"]),
             ("tied_kv_cross", "translate", "matched", KV_CROSS["matched"],
              STD_MATCHED["translate"])]
    want = [[d, t, arm, *_effect(a, b, False)] for d, t, arm, a, b in cases]
    want.append(["tied_kv", "bind_codes", "equal",
                 *_effect(BIND_KV[BIND_M], BIND_STD[BIND_M], True)])
    assert df[["design", "task", "arm"]].to_numpy().tolist() == [w[:3] for w in want]
    np.testing.assert_allclose(df[["value", "lo", "hi"]].to_numpy(), [w[3:] for w in want],
                               rtol=1e-9)
    assert df.d_head.isna().tolist() == [True] * 5 + [False]
    assert df.d_head.iloc[-1] == BIND_M


def test_one_colour_per_design_across_figures(drawn):
    out, figs = drawn
    by_name = {f.name: f for fs in figs.values() for f in fs}
    for design, names in {"tied_kv": ("forest_q3", "q3_bind", "q3_kv"),
                          "alt": ("forest_q1", "q1_alt_loss", "q1_convex"),
                          "tied_qkv": ("forest_q2", "q2_own_position")}.items():
        colour = DESIGNS[design].color.lower()
        for n in names:
            assert colour in (out / by_name[n].svg).read_text().lower(), (design, n)
    # a design absent from a figure does not lend it its colour
    svg = (out / by_name["forest_q1"].svg).read_text().lower()
    assert DESIGNS["tied_qkv"].color.lower() not in svg
    assert len(set(re.findall(r"#[0-9a-f]{6}", svg))) < 12


def test_kv_figure_cost_ratios_and_quality(drawn):
    df = _csv(drawn, "q3_kv")
    cost = df[df.panel == "cost"]
    base = DECODE[0]
    assert cost.design.tolist() == ["standard", "tied_kv", "gqa_half"]
    np.testing.assert_allclose(
        cost[["cache_vs_standard", "decode_vs_standard"]].to_numpy(),
        [[r["cache_bytes_per_token"] / base["cache_bytes_per_token"],
          r["decode_tokens_per_s"] / base["decode_tokens_per_s"]] for r in DECODE], rtol=1e-12)
    q = df[df.panel == "quality"]
    d = np.array(KV["equal"]) - np.array(STD["lm"])
    m, h = _ci(d)
    row = q[(q.design == "tied_kv") & (q.arm == "equal")]
    np.testing.assert_allclose(row[["ppl_pct", "lo", "hi"]].to_numpy()[0],
                               100 * np.expm1([m, m - h, m + h]), rtol=1e-9)
    assert sorted(zip(q.design, q.arm)) == [("gqa_half", "equal"), ("tied_kv", "equal"),
                                            ("tied_kv", "matched"),
                                            ("tied_kv_cross", "equal"),
                                            ("tied_kv_cross", "matched")]


def test_measure_figures_csv(drawn):
    own = _csv(drawn, "q2_own_position").set_index(["design", "group"])
    m, h = _ci([0.1 * (1 + s) + 0.3 for s in SEEDS])
    np.testing.assert_allclose(own.loc[("tied_qk", "lm"), ["mean", "half", "uniform"]], [m, h, 0.2])
    em = _csv(drawn, "q2_symmetry_emergence")
    enc = em[em.kind == "encoder"].sort_values("step")
    np.testing.assert_allclose(enc[["mean", "half"]].to_numpy(),
                               [_ci([s * 0.05 + 0.01 * seed for seed in SEEDS]) for s in (0, 3, 6)],
                               rtol=1e-9, atol=1e-12)
    pt = _csv(drawn, "q2_pretrained_symmetry")
    np.testing.assert_allclose(pt[["layer", "symmetry", "rel_depth", "null_lo", "null_hi"]],
                               [[i, 0.2 + i / 10, i / 2, -0.1, 0.1] for i in range(3)])
    cv = _csv(drawn, "q1_convex")
    share = cv[cv.group.str.startswith("outside")].set_index("design")
    np.testing.assert_allclose(share.loc["alt", ["mean", "half"]],
                               _ci([100 * (0.1 + 0.05 * s) for s in SEEDS]), rtol=1e-9)
    sc = _csv(drawn, "q1_scale_probe")
    sat = sc[sc.stat == "saturated"].sort_values(["scale", "d_head"])
    assert sat.n.tolist() == [1] * 8 and sat.half.isna().all()  # one probe seed: no CI
    np.testing.assert_allclose(sat["mean"], [0.16, 0.64] * 4)


def test_q1_loss_holds_val_loss_and_chrf(drawn):
    df = _csv(drawn, "q1_alt_loss")
    chrf = df[df.metric == "chrf"].set_index(["design", "arm"])
    np.testing.assert_allclose(chrf.loc[("alt", "equal"), ["mean", "half"]], _ci(CHRF["alt"]))
    # each task's own loss: lm per subword token (val_loss), translate per target token
    assert set(df[df.task == "lm"].metric) == {"val_loss"}
    loss = df[df.metric == "target_loss"].set_index(["design", "task", "arm"])
    np.testing.assert_allclose(loss.loc[("alt", "translate", "matched"), ["mean", "half"]],
                               _ci(ALT[("translate", "matched")]))


def test_one_seed_draws_marker_without_bar(tmp_path):
    with Store(tmp_path / "r.db") as store:
        for d, v in (("standard", 2.0), ("alt", 2.2)):
            _run(store, "alt_vs_standard", "lm", d, 0, {"val_loss": v})
        data = results.load(store, "smoke")
    with plt.rc_context(figures_q.STYLE):
        fig = figures.fig_forest_q1(data, tmp_path / "figs")
    df = pd.read_csv(tmp_path / "figs" / fig.csv)
    assert df[["design", "task", "arm"]].to_numpy().tolist() == [["alt", "lm", "equal"]]
    assert df.value.iloc[0] == pytest.approx(100 * np.expm1(0.2))  # % perplexity
    assert df[["lo", "hi"]].isna().all(axis=None)


def test_figures_without_data_are_skipped(tmp_path):
    with Store(tmp_path / "r.db") as store:
        empty = results.load(store, "smoke")
    assert figures.all_figures(empty, tmp_path / "figs") == {"q1": [], "q2": [], "q3": [],
                                                              "scaling": [], "setup": [],
                                                              "scaling_gap": []}


def test_symmetry_emergence_verdict_uses_the_margin(data):
    from qkvlab.studies.qkv.render import verdicts

    # fill(): at step 6 the encoder scores 0.30 + 0.01·seed and the decoder 0.06 + 0.01·seed,
    # so every seed's encoder − decoder difference is 0.24, far outside the ±0.05 margin
    (s,) = [d for d in verdicts.verdict_q2(data).details if d.startswith("Trained from")]
    verdict, caveat = s.split(" Caveat: ")
    assert verdict.endswith(": the encoder is more symmetric (difference +0.240 ± 0.000).")
    # fill() gives those runs val loss 3.0 nats (3.0/ln 2 bits per character), within ln 2
    # nats (1 bit) of the text's context-free loss; lm_char's is in bits per character
    ch = {t: results.chance(t, data.profile) for t in ("mlm", "lm_char")}
    nats = get_task("lm_char", **data.profile.task_options["lm_char"]).chance
    assert ch["lm_char"] == pytest.approx(nats / math.log(2), rel=1e-12)  # one char a token
    assert caveat == (f"the encoder (mlm) has not learned its task at this budget (val loss "
                      f"3.000, context-free {ch['mlm']:.3f}), so its symmetry says little; the "
                      f"decoder (lm_char) has not learned its task at this budget (bits per "
                      f"character {3 / math.log(2):.3f}, context-free {ch['lm_char']:.3f}), so "
                      f"its symmetry says little.")


def test_forest_rows_without_a_verdict_are_grey():
    """A cell where attention is not used (or the task not learned) is drawn, in grey; a
    decided one in its design's color."""
    import pandas as pd
    from matplotlib.colors import to_hex

    df = pd.DataFrame({"panel": ["loss", "loss"], "design": ["tied_kv", "tied_qk"],
                       "task": ["lm", "lm"], "arm": ["equal", "equal"], "d_head": [None, None],
                       "value": [1.0, 2.0], "lo": [0.5, 1.5], "hi": [1.5, 2.5],
                       "status": ["attention_unused", "worse"], "unit": ["% perplexity"] * 2})
    fig, ax = plt.subplots()
    figures._forest_panel(ax, df, "loss", 2)
    markers = [line for line in ax.lines if line.get_marker() in ("o", "s")]
    colors = [to_hex(line.get_color()) for line in markers]
    plt.close(fig)
    assert colors == [figures.NO_VERDICT_COLOR, DESIGNS["tied_qk"].color.lower()]
