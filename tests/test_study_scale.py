"""Q1's scale in training: scale_train's and scale_tune's runs, T5's init against a float64
reference, the verdict rows (each placement vs inside, Q1's Holm family, the control's gate),
and the figure's data and words.

Expected values are computed here independently and compared two-sided, whole tensors.
"""

from __future__ import annotations

import dataclasses
import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as st
from torch.testing import assert_close

from qkvlab.experiments import registry
from qkvlab.experiments.store import Store
from qkvlab.models import ModelConfig
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.compute.scale import placement_effects, placement_grid, scale_answer
from qkvlab.studies.qkv.plan import profiles, rates
from qkvlab.studies.qkv.plan.questions import families
from qkvlab.studies.qkv.plan.placements import PLACEMENTS, SCALE_HEADS
from qkvlab.studies.qkv.render import figures_q
from qkvlab.studies.qkv.render.scale import fig_q1_scale_train, scale_table, scale_words
from qkvlab.studies.qkv.plan.questions import tuned_designs
from qkvlab.train import InitConfig
from qkvlab.train.build import apply_init, build_seeded
from conftest import scored

SCALES = {"standard": ("inside", None), "outside": ("outside", None), "both": ("both", None),
          "none": ("none", None), "none_t5": ("none", InitConfig(qk="t5"))}


def test_placements_are_the_four_scales_and_t5():
    assert {t: (p.scale, None if p.init == "gpt2" else InitConfig(qk=p.init))
            for t, p in PLACEMENTS.items()} == SCALES


@pytest.mark.parametrize("name", ["smoke", "quick"])
def test_scale_train_runs_every_placement_and_the_control_at_every_width_and_seed(name):
    p = profiles.PROFILES[name]
    runs = registry.runs_of("scale_train", p)
    got = sorted((t["design"], t["d_head"], t["seed"]) for _, t in runs)
    want = sorted((d, w, s) for d in (*SCALES, "control") for w in p.scale_train_d_heads
                  for s in p.scale_train_seeds)
    assert got == want and len(p.scale_train_d_heads) >= 3
    for spec, t in runs:
        assert spec.task == "lm" and t["arm"] == "equal"
        assert spec.train.lr == rates.task_lr("lm", p)  # no grid: lm's rate
        m = dict(spec.model)
        assert (m["n_heads"], m["d_head"], m["d_model"]) == (SCALE_HEADS, t["d_head"], p.d_model)
        if t["design"] == "control":
            assert m["design"] == "uniform" and "scale" not in m and spec.init is None
        else:
            assert (m["scale"], spec.init) == SCALES[t["design"]]
    assert registry.runs_of("scale_tune", p) == []  # no grid, nothing to tune
    assert max(profiles.PROFILES["quick"].scale_train_d_heads) == 256
    assert max(profiles.PROFILES["standard"].scale_train_d_heads) == 256


GRID = (0.5, 1.0, 2.0)


def test_each_placement_and_width_trains_at_its_own_tuned_rate(tmp_path):
    p = dataclasses.replace(profiles.PROFILES["smoke"], lr_grid=GRID, lr_seeds=(100,))
    tune = registry.runs_of("scale_tune", p)
    assert sorted((t["design"], t["d_head"], t["lr"], t["seed"]) for _, t in tune) == sorted(
        (d, w, rates.lr_of("lm", m, p), 100) for d in (*SCALES, "control")
        for w in p.scale_train_d_heads for m in GRID)
    with pytest.raises(rates.RatesPending, match=r"run `qkvlab sweep scale_tune --profile smoke"):
        registry.runs_of("scale_train", p, None)
    with pytest.raises(rates.RatesPending, match=r"scale_tune has not chosen"):
        registry.runs_of("scale_tune_edge", p, None)
    # best multiplier (the loss's minimum, on a log axis): at the widest head none's is the
    # grid's top (2: an edge, and the point beyond it, 4, is worse), none + T5's is past the top
    # (8: the point beyond wins and is a new edge), the control's at the narrowest is past the
    # bottom (1/8); everything else the middle
    widest, narrowest = max(p.scale_train_d_heads), min(p.scale_train_d_heads)
    best = {("none", widest): 2.0, ("none_t5", widest): 8.0, ("control", narrowest): 0.125}

    def loss(t) -> float:
        b = best.get((t["design"], t.get("d_head")), 1.0)
        return 2.0 + abs(math.log(t["lr"] / rates.task_lr(t["task"], p) / b))

    def train(store, name) -> None:
        runs = registry.runs_of(name, p, store)
        for rid, (_, t) in zip(store.add(name, p.name, runs), runs):
            if store.claim(rid):
                store.finish(rid, "done", 1, {"val_loss": loss(t)}, {"n_params": 1})

    base = rates.task_lr("lm", p)
    with Store(tmp_path / "r.db") as store:
        for name in ("lr_tune", "scale_tune"):
            train(store, name)
        with pytest.raises(rates.RatesPending, match=r"then scale_tune_edge"):
            registry.runs_of("scale_train", p, store)  # the edge points come first
        edge = registry.runs_of("scale_tune_edge", p, store)
        # one point a grid step (×2 here) past each choice on an edge, val only
        assert sorted((t["design"], t["d_head"], t["lr"], t["seed"]) for _, t in edge) == sorted([
            ("none", widest, float(f"{4 * base:.3g}"), 100),
            ("none_t5", widest, float(f"{4 * base:.3g}"), 100),
            ("control", narrowest, float(f"{base / 4:.3g}"), 100)])
        assert all(s.train.test_batches == 0 for s, _ in edge)
        train(store, "scale_tune_edge")
        runs = registry.runs_of("scale_train", p, store)
        data = results.load(store, p)
        chosen = rates.chosen_lrs(p, store)
    # the placements keyed by width beside the designs' own keys, which keep their form
    assert {k for k in chosen if len(k) == 4} == {  # the control tuned per width too
        ("lm", d, "equal", w) for d in (*SCALES, "control") for w in p.scale_train_d_heads}
    assert {k for k in chosen if len(k) == 3} == {
        (t, d, a) for t, labels in tuned_designs().items() for d in ("standard", *labels)
        for a in rates.tuned_arms(p, t, d)}
    want = {("none", widest): 2.0, ("none_t5", widest): 4.0, ("control", narrowest): 0.25}
    for spec, t in runs:
        mult = want.get((t["design"], t["d_head"]), 1.0)
        assert spec.train.lr == float(f"{mult * base:.3g}"), t
    grid = placement_grid(data)
    assert len(grid) == len(tune) + len(edge)
    chosen = grid[grid.chosen]
    assert len(chosen) == (len(SCALES) + 1) * len(p.scale_train_d_heads)
    # flagged: a choice still at an end of the extended grid; none's 2 is inside it now
    assert set(chosen[chosen.edge].itertuples(index=False, name=None)) == {
        ("none_t5", widest, float(f"{4 * base:.3g}"), 2.0 + math.log(2), 1, True, True),
        ("control", narrowest, float(f"{base / 4:.3g}"), 2.0 + math.log(2), 1, True, True)}


def _lm(scale: str, init: InitConfig | None, seed: int = 3, d_head: int = 24):
    cfg = ModelConfig(d_vocab=40, n_ctx=16, d_model=32, n_layers=2, n_heads=2, d_head=d_head,
                      scale=scale)
    model = build_seeded(cfg, "decoder", seed)
    apply_init(model, init, seed)
    return model.double().eval()


def _scores(att, x):
    """(B, H, T, T) float64 scores inner · q kᵀ, head by head from the public per-head view."""
    v = att.view()
    q = torch.einsum("btd,hde->bhte", x, v.W_Q)
    k = torch.einsum("btd,hde->bhte", x, v.W_K)
    return att.cfg.inner_scale * q @ k.transpose(-1, -2)


F32 = 2.0 ** -23  # one float32 rounding: the init is drawn and scaled in float32


def test_t5_init_with_no_scale_computes_exactly_the_scores_of_the_scale_inside():
    ref, t5, bare = _lm("inside", None), _lm("none", InitConfig(qk="t5")), _lm("none", None)
    x = torch.randn(3, 7, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for (_, _, a), (_, _, b), (_, _, c) in zip(ref.attention_layers(), t5.attention_layers(),
                                               bare.attention_layers()):
        va, vb = a.view(), b.view()
        dk = a.cfg.d_head
        assert (a.cfg.inner_scale, b.cfg.inner_scale) == (1 / math.sqrt(dk), 1.0)
        # W_Q scaled by 1/√d_k (to float32's rounding), every other weight the model's own
        assert_close(vb.W_Q, va.W_Q / math.sqrt(dk), rtol=F32, atol=0)
        for n in ("W_K", "W_V", "W_O"):
            assert torch.equal(getattr(va, n), getattr(vb, n))
        want = _scores(a, x)
        tol = 4 * F32 * float(want.abs().max())  # W_Q's rounding, summed over d_model terms
        assert_close(_scores(b, x), want, rtol=0, atol=tol)
        # without T5's init the same seed's scores are √d_k times larger
        assert_close(_scores(c, x), math.sqrt(dk) * want, rtol=0, atol=math.sqrt(dk) * tol)
    idx = torch.randint(0, 40, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_close(t5(idx), ref(idx), rtol=1e-6, atol=1e-7)  # whole logits at step 0


@pytest.mark.parametrize("design", ["tied_qk", "tied_qkv", "uniform"])
def test_t5_init_needs_a_query_block_of_its_own(design):
    cfg = ModelConfig(d_vocab=40, n_ctx=16, d_model=32, n_layers=1, n_heads=2, design=design)
    model = build_seeded(cfg, "decoder", 0)
    with pytest.raises(ValueError, match=rf"init.qk: 't5'.*0.attn is '{design}'"):
        apply_init(model, InitConfig(qk="t5"))


# per (design, d_head): the val loss over and above inside's, per seed (nats)
SEEDS = (0, 1, 2, 3)
NOISE = (0.004, -0.003, 0.001, -0.002)


def _shift(design: str, d_head: int) -> float:
    if design == "control":
        return 0.5  # far worse than standard: attention is used at every width
    if design == "none" and d_head == 16:
        return 0.10  # none trains worse at the widest head
    return 0.0


def _load(path, shift) -> results.StudyData:
    p = dataclasses.replace(profiles.PROFILES["smoke"], scale_train_seeds=SEEDS)
    runs = registry.runs_of("scale_train", p)
    with Store(path) as store:
        for rid, (_, t) in zip(store.add("scale_train", p.name, runs), runs):
            assert store.claim(rid)
            noise = 0.0 if t["design"] == "standard" else NOISE[t["seed"]]
            store.finish(rid, "done", 1,
                         scored({"val_loss": 1.5 + 0.01 * t["seed"]
                                 + shift(t["design"], t["d_head"]) + noise}), {"n_params": 1})
        return results.load(store, p)


@pytest.fixture
def data(tmp_path):
    return _load(tmp_path / "r.db", _shift)


def _wide_unused(design: str, d_head: int) -> float:
    """Every design 0.4 nats worse at the widest head, outside and both 0.3; there the control
    matches inside (attention not used) and is 0.1 worse than at the narrower heads, where it
    is 0.3 worse than inside; none is worse at the middle width."""
    if d_head == 16:
        return 0.3 if design in ("outside", "both") else 0.4
    if design == "control":
        return 0.3
    return 0.10 if design == "none" and d_head == 8 else 0.0


def test_a_width_where_attention_is_unused_is_explained_from_the_control_not_read(tmp_path):
    data = _load(tmp_path / "r.db", _wide_unused)
    a = scale_answer(data)
    assert a.unused_widths() == [16]
    assert a.widest("none")[0] == 8 and a.status("none").value == "worse"  # not the 16's
    base = {s: 1.5 + 0.01 * s for s in SEEDS}

    def mean(design, d_head):
        noise = 0.0 if design == "standard" else np.array(NOISE)
        return float(np.mean(np.array(list(base.values())) + _wide_unused(design, d_head)
                             + noise))
    assert a.means == pytest.approx({(d, w): mean(d, w) for d in (*SCALES, "control")
                                     for w in data.profile.scale_train_d_heads}, abs=1e-12)
    assert a.d_model == data.profile.d_model
    words = scale_words(a)
    assert "So the constant is needed at d_head 8" in words
    ctrl16, ctrl4 = mean("control", 16), mean("control", 4)
    assert (f"At d_head 16 inside does not beat the attention-free control "
            f"({mean('standard', 16):.3f} vs {ctrl16:.3f} nats)") in words
    assert (f"is itself {ctrl16 - ctrl4:.3g} nats worse at d_head 16 than at 4, so what worsens "
            f"with the width is the value path ({SCALE_HEADS} heads × 16 = {SCALE_HEADS * 16} "
            f"wide, on a {data.profile.d_model}-wide residual stream)") in words
    assert (f"(1/√d_k outside {mean('outside', 16):.3f}, 1/√d_k inside and outside "
            f"{mean('both', 16):.3f})") in words
    # where the control is no worse at the wide head, only the gate is stated
    plain = scale_words(dataclasses.replace(a, means={**a.means, ("control", 16): ctrl4}))
    assert "At d_head 16 inside does not beat" in plain and "value path" not in plain


def test_verdict_rows_are_each_placement_vs_inside_per_width_in_q1s_family(data):
    df = placement_effects(data)
    widths = data.profile.scale_train_d_heads
    assert sorted(zip(df.design, df.d_head)) == sorted(
        (d, w) for d in SCALES if d != "standard" for w in widths)
    n = len(SCALES) - 1
    assert (df.family_m == n * len(widths)).all() and (df.n == len(SEEDS)).all()
    for r in df.itertuples():
        d = np.array([_shift(r.design, r.d_head) + x for x in NOISE])
        h = st.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
        assert (r.value, r.lo, r.hi) == pytest.approx(
            tuple(100 * math.expm1(v) for v in (d.mean(), d.mean() - h, d.mean() + h)),
            rel=1e-9, abs=1e-9)
    status = dict(zip(zip(df.design, df.d_head), df.status))
    assert status.pop(("none", 16)) == "worse"
    assert set(status.values()) == {"equivalent"}  # ±0.4% at most, the margin ±2%
    # the family holds exactly these cells at this profile, each at its width
    assert {(h.design, h.d_head) for h in families()["Q1"].members
            if h.experiment == "scale_train" and h.d_head in widths} == set(zip(df.design,
                                                                              df.d_head))


def test_the_figure_draws_the_verdict_rows_and_the_words_answer_from_them(data, tmp_path):
    with plt.rc_context(figures_q.STYLE):
        fig = fig_q1_scale_train(data, tmp_path)
    drawn = pd.read_csv(tmp_path / fig.csv)
    want = placement_effects(data)
    assert (tmp_path / fig.png).is_file()
    assert list(zip(drawn.design, drawn.d_head)) == list(zip(want.design, want.d_head))
    assert np.array_equal(drawn[["value", "lo", "hi"]].to_numpy(),
                          want[["value", "lo", "hi"]].to_numpy().astype(float))
    a = scale_answer(data)
    assert not a.tuned and a.edges == () and a.status("none").value == "worse"
    words = scale_words(a)
    assert "So the constant is needed at d_head 16: without it lm trains worse" in words
    assert "no 1/√d_k: equivalent at d_head 4 (+0.0 ± 0.5% perplexity) and 8 (+0.0 ± 0.5% " \
        "perplexity); worse at d_head 16 (+10.5 ± 0.6% perplexity)" in words
    assert "every placement at lm's learning rate" in words
    table = scale_table(data)[0]
    assert len(table.rows) == len(data.profile.scale_train_d_heads) * (len(SCALES) + 1)
    assert {r[2] for r in table.rows} == {f"{rates.task_lr('lm', data.profile):g} (lm's)"}


def test_q1s_answer_opens_with_the_trained_verdicts_and_words_only_the_rest_after(data):
    from qkvlab.studies.qkv.render.answers import answer_blocks

    lead = scale_words(scale_answer(data))
    q1 = answer_blocks(data, {"q1": lead})[1].text
    n = (len(SCALES) - 1) * len(data.profile.scale_train_d_heads)
    assert q1.startswith(f"Q1 — the 4th matrix and the scale. {lead} None of the other "
                         f"comparisons is decided after correcting for the {n} this question "
                         f"asks. Scale: the smoke profile")
    assert "d_head 16" not in q1[len(lead):]  # the per-width cells are worded once, in the lead
