"""Q1's scale in training: scale_train's and scale_tune's runs (heads × d_head = d_model, two
inits), T5's init against a float64 reference, the verdict rows (each placement vs inside from
the same init, Q1's Holm family, the control's gate), and the figure's data and words.

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
from qkvlab.experiments.frames import runs_frame
from qkvlab.experiments.store import Store
from qkvlab.models import ModelConfig
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.compute.scale import (
    placement_effects,
    placement_grid,
    scale_answer,
    scale_answers,
)
from qkvlab.studies.qkv.plan import profiles, rates
from qkvlab.studies.qkv.plan.questions import families
from qkvlab.studies.qkv.plan.placements import INIT_WORDS, PLACEMENTS, SCALE_INITS
from qkvlab.studies.qkv.render import figures_q
from qkvlab.studies.qkv.render.scale import (
    fig_q1_scale_train,
    scale_lead,
    scale_table,
    scale_words,
)
from qkvlab.studies.qkv.plan.questions import tuned_designs
from qkvlab.train import InitConfig
from qkvlab.train.build import apply_init, build_seeded
from conftest import scored

SCALES = {"standard": ("inside", False), "outside": ("outside", False), "both": ("both", False),
          "none": ("none", False), "none_t5": ("none", True)}
# InitConfig.qk of each (init, T5's remedy): None is the model's own
QK = {("gpt2", False): None, ("gpt2", True): "t5", ("unit", False): "unit",
      ("unit", True): "unit_t5"}


def test_placements_are_the_four_scales_and_t5_from_two_inits():
    assert {t: (p.scale, p.t5) for t, p in PLACEMENTS.items()} == SCALES
    assert SCALE_INITS == ("gpt2", "unit")


@pytest.mark.parametrize("name", ["smoke", "quick", "standard"])
def test_scale_train_splits_each_width_as_heads_times_d_head_equal_to_d_model(name):
    p = profiles.PROFILES[name]
    assert len(p.scale_train_d_heads) >= 2
    for spec, t in registry.runs_of("scale_train", dataclasses.replace(p, lr_grid=())):
        m = dict(spec.model)
        assert m["n_heads"] * m["d_head"] == m["d_model"] == p.d_model, t
        assert (t["n_heads"], t["d_head"]) == (m["n_heads"], m["d_head"])


def test_a_d_head_that_does_not_divide_d_model_is_refused_by_name():
    p = dataclasses.replace(profiles.PROFILES["smoke"], scale_train_d_heads=(8, 12))
    with pytest.raises(ValueError, match=r"scale_train_d_heads: 12 does not divide d_model 32"):
        registry.runs_of("scale_train", p)


@pytest.mark.parametrize("name", ["smoke", "quick"])
def test_scale_train_runs_every_placement_from_each_init_and_the_control_per_width(name):
    p = profiles.PROFILES[name]
    runs = registry.runs_of("scale_train", p)
    got = sorted((t["design"], t["d_head"], t["init"], t["seed"]) for _, t in runs)
    want = sorted([(d, w, i, s) for d in SCALES for w in p.scale_train_d_heads
                   for i in SCALE_INITS for s in p.scale_train_seeds]
                  + [("control", w, "gpt2", s) for w in p.scale_train_d_heads
                     for s in p.scale_train_seeds])
    assert got == want
    for spec, t in runs:
        assert spec.task == "lm" and t["arm"] == "equal"
        assert spec.train.lr == rates.task_lr("lm", p)  # no grid: lm's rate
        m = dict(spec.model)
        assert (m["n_heads"], m["d_head"], m["d_model"]) == (
            p.d_model // t["d_head"], t["d_head"], p.d_model)
        if t["design"] == "control":
            assert m["design"] == "uniform" and "scale" not in m and spec.init is None
        else:
            scale, t5 = SCALES[t["design"]]
            qk = QK[(t["init"], t5)]
            assert (m["scale"], spec.init) == (scale, None if qk is None else InitConfig(qk=qk))
    assert registry.runs_of("scale_tune", p) == []  # no grid, nothing to tune


GRID = (0.5, 1.0, 2.0)


def test_each_placement_width_and_init_trains_at_its_own_tuned_rate(tmp_path):
    p = dataclasses.replace(profiles.PROFILES["smoke"], lr_grid=GRID, lr_seeds=(100,))
    keys = [(d, w, i) for d in SCALES for w in p.scale_train_d_heads for i in SCALE_INITS] + [
        ("control", w, "gpt2") for w in p.scale_train_d_heads]
    tune = registry.runs_of("scale_tune", p)
    assert sorted((t["design"], t["d_head"], t["init"], t["lr"], t["seed"]) for _, t in tune) \
        == sorted((*k, rates.lr_of("lm", m, p), 100) for k in keys for m in GRID)
    with pytest.raises(rates.RatesPending, match=r"run `qkvlab sweep scale_tune --profile smoke"):
        registry.runs_of("scale_train", p, None)
    with pytest.raises(rates.RatesPending, match=r"scale_tune has not chosen"):
        registry.runs_of("scale_tune_edge", p, None)
    # best multiplier (the loss's minimum, on a log axis): at the widest head none's from the
    # model's init is the grid's top (2: an edge, and the point beyond it, 4, is worse), none +
    # T5's from unit variance is far past the top (32: every point followed past it wins, up
    # to the last, 16), the control's at the narrowest is past the bottom (1/8: the second
    # point below wins, the third does not); everything else the middle (none + T5 from the
    # model's init too: the init is a key of its own)
    widest, narrowest = max(p.scale_train_d_heads), min(p.scale_train_d_heads)
    best = {("none", widest, "gpt2"): 2.0, ("none_t5", widest, "unit"): 32.0,
            ("control", narrowest, "gpt2"): 0.125}

    def loss(t) -> float:
        b = best.get((t["design"], t.get("d_head"), t.get("init")), 1.0)
        return 2.0 + abs(math.log(t["lr"] / rates.task_lr(t["task"], p) / b))

    def train(store, name) -> list:
        """Train ``name``'s runs, listed again until nothing new is listed (the sweep's
        stages); returns the first listing."""
        first = None
        while True:
            runs = registry.runs_of(name, p, store)
            first = runs if first is None else first
            fresh = [(rid, t) for rid, (_, t) in zip(store.add(name, p.name, runs,
                                                                replace=True), runs)
                     if store.claim(rid)]
            for rid, t in fresh:
                store.finish(rid, "done", 1, {"val_loss": loss(t)}, {"n_params": 1})
            if not fresh:
                return first

    base = rates.task_lr("lm", p)
    with Store(tmp_path / "r.db") as store:
        for name in ("lr_tune", "scale_tune"):
            train(store, name)
        with pytest.raises(rates.RatesPending, match=r"then scale_tune_edge"):
            registry.runs_of("scale_train", p, store)  # the edge points come first
        # first one point a grid step (×2 here) past each choice on an edge, val only
        first = train(store, "scale_tune_edge")
        assert sorted((t["design"], t["d_head"], t["init"], t["lr"], t["seed"])
                      for _, t in first) == sorted([
            ("none", widest, "gpt2", float(f"{4 * base:.3g}"), 100),
            ("none_t5", widest, "unit", float(f"{4 * base:.3g}"), 100),
            ("control", narrowest, "gpt2", float(f"{base / 4:.3g}"), 100)])
        # then the next while the newest wins, at most three
        edge = registry.runs_of("scale_tune_edge", p, store)
        assert sorted((t["design"], t["lr"]) for _, t in edge) == sorted(
            (d, float(f"{m * base:.3g}")) for d, m in [
                ("none", 4.0), ("none_t5", 4.0), ("none_t5", 8.0), ("none_t5", 16.0),
                ("control", 0.25), ("control", 0.125), ("control", 0.0625)])
        assert all(s.train.test_batches == 0 for s, _ in edge)
        runs = registry.runs_of("scale_train", p, store)
        data = results.load(store, p)
        chosen = rates.chosen_lrs(p, store)
    # the placements keyed by width and init beside the designs' own keys, which keep their form
    assert {k for k in chosen if len(k) == 5} == {("lm", d, "equal", w, i) for d, w, i in keys}
    assert {k for k in chosen if len(k) == 3} == {
        (t, d, a) for t, labels in tuned_designs().items() for d in ("standard", *labels)
        for a in rates.tuned_arms(p, t, d)}
    want = {("none", widest, "gpt2"): 2.0, ("none_t5", widest, "unit"): 16.0,
            ("control", narrowest, "gpt2"): 0.125}
    for spec, t in runs:
        mult = want.get((t["design"], t["d_head"], t["init"]), 1.0)
        assert spec.train.lr == float(f"{mult * base:.3g}"), t
    grid = placement_grid(data)
    assert len(grid) == len(tune) + len(edge)
    chosen = grid[grid.chosen]
    assert len(chosen) == len(keys)
    # flagged: a choice still at an end of the extended grid, none + T5's on its last point;
    # none's 2 and the control's 1/8 are inside it now
    assert set(chosen[chosen.edge].itertuples(index=False, name=None)) == {
        ("none_t5", widest, "unit", float(f"{16 * base:.3g}"), 2.0 + math.log(2), 1, True,
         True)}


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


def test_unit_t5_is_the_unit_draw_with_w_q_divided_by_sqrt_d_head():
    """T5's own init: W_Q, W_K, W_V from N(0, 1/d_model), W_Q then divided by √d_head, so with
    no scale the scores equal those of the unit draw with the scale inside."""
    ref, t5 = _lm("inside", InitConfig(qk="unit")), _lm("none", InitConfig(qk="unit_t5"))
    x = torch.randn(3, 7, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for (_, _, a), (_, _, b) in zip(ref.attention_layers(), t5.attention_layers()):
        va, vb = a.view(), b.view()
        dk = a.cfg.d_head
        assert_close(vb.W_Q, va.W_Q / math.sqrt(dk), rtol=F32, atol=0)
        for n in ("W_K", "W_V", "W_O"):
            assert torch.equal(getattr(va, n), getattr(vb, n))
        # the unit draw: every entry of W_in from N(0, 1/d_model) (n = 4,608 entries: the
        # sample sd's standard error is ~1%, so 5% is 5 standard errors)
        sd = float(a.W_in.detach().std())
        assert sd * math.sqrt(a.cfg.d_model) == pytest.approx(1.0, abs=0.05)
        want = _scores(a, x)
        tol = 4 * F32 * float(want.abs().max())
        assert_close(_scores(b, x), want, rtol=0, atol=tol)
    idx = torch.randint(0, 40, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_close(t5(idx), ref(idx), rtol=1e-6, atol=1e-7)  # whole logits at step 0


@pytest.mark.parametrize("qk", ["t5", "unit_t5"])
@pytest.mark.parametrize("design", ["tied_qk", "tied_qkv", "uniform"])
def test_t5_init_needs_a_query_block_of_its_own(design, qk):
    cfg = ModelConfig(d_vocab=40, n_ctx=16, d_model=32, n_layers=1, n_heads=2, design=design)
    model = build_seeded(cfg, "decoder", 0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=rf"init.qk: '{qk}'.*0.attn is '{design}'"):
        apply_init(model, InitConfig(qk=qk))
    after = model.state_dict()  # refused before anything was drawn
    assert all(torch.equal(before[k], after[k]) for k in before)


# per (design, d_head, init): the val loss over and above inside's from that init, per seed
SEEDS = (0, 1, 2, 3, 4, 5)
NOISE = (0.004, -0.003, 0.001, -0.002, 0.002, -0.002)


def _shift(design: str, d_head: int, init: str) -> float:
    if design == "control":
        return 0.5  # far worse than standard: attention is used at every width
    if design == "none" and d_head == 16 and init == "unit":
        return 0.10  # none trains worse at the widest head from unit variance
    if design == "both" and d_head == 8 and init == "gpt2":
        return -0.10  # both trains better at the narrow head from the model's own init
    return 0.0


def _load(path, shift) -> results.StudyData:
    p = dataclasses.replace(profiles.PROFILES["smoke"], scale_train_seeds=SEEDS)
    runs = registry.runs_of("scale_train", p)
    with Store(path) as store:
        for rid, (_, t) in zip(store.add("scale_train", p.name, runs), runs):
            assert store.claim(rid)
            noise = 0.0 if t["design"] == "standard" else NOISE[t["seed"]]
            inside = 1.5 + 0.01 * t["seed"] + (0.2 if t["init"] == "unit" else 0.0)
            store.finish(rid, "done", 1,
                         scored({"val_loss": inside + shift(t["design"], t["d_head"], t["init"])
                                 + noise}), {"n_params": 1})
        return results.load(store, p)


@pytest.fixture
def data(tmp_path):
    return _load(tmp_path / "r.db", _shift)


def _wide_unused(design: str, d_head: int, init: str) -> float:
    """From either init, every design 0.4 nats worse at the widest head, and there the control
    (0.4 worse too) matches the model's own inside: attention is not used there; at the
    narrower head the control is 0.3 worse than inside, and none is worse from the model's
    own init."""
    if d_head == 16:
        return 0.4
    if design == "control":
        return 0.3
    return 0.10 if design == "none" and init == "gpt2" else 0.0


def test_a_width_where_attention_is_unused_is_named_and_read_at_the_narrower_one(tmp_path):
    data = _load(tmp_path / "r.db", _wide_unused)
    a = scale_answer(data)
    assert a.init == "gpt2" and a.unused_widths() == [16]
    assert a.widest("none")[0] == 8 and a.status("none").value == "worse"  # not the 16's
    base = np.array([1.5 + 0.01 * s for s in SEEDS])

    def mean(design, d_head, init="gpt2"):
        noise = 0.0 if design == "standard" else np.array(NOISE)
        return float(np.mean(base + (0.2 if init == "unit" and design != "control" else 0.0)
                             + _wide_unused(design, d_head, init) + noise))
    assert a.means == pytest.approx({(d, w): mean(d, w) for d in (*SCALES, "control")
                                     for w in data.profile.scale_train_d_heads}, abs=1e-12)
    assert a.d_model == data.profile.d_model
    words = scale_words(a)
    assert words.startswith("From the model's own init (std 0.02), vs inside: ")
    assert "So the constant is needed at d_head 8" in words
    assert (f"At d_head 16 inside does not beat the attention-free control "
            f"({mean('standard', 16):.3f} vs {mean('control', 16):.3f} nats), so no placement "
            f"is judged there.") in words
    # from unit variance the control gates the same width (it has no init of its own), and
    # this answer's means hold unit variance's placements beside the same control
    u = scale_answer(data, "unit")
    assert u.unused_widths() == [16] and u.status("none").value == "equivalent"
    assert u.means == pytest.approx({(d, w): mean(d, w, "unit") for d in (*SCALES, "control")
                                     for w in data.profile.scale_train_d_heads}, abs=1e-12)


def test_verdict_rows_are_each_placement_vs_inside_from_its_init_per_width_in_q1s_family(data):
    df = placement_effects(data)
    widths = data.profile.scale_train_d_heads
    assert list(zip(df.init, df.design, df.d_head)) == [
        (i, d, w) for i in SCALE_INITS for d in SCALES if d != "standard" for w in widths]
    n = len(SCALES) - 1
    assert (df.family_m == n * len(widths) * len(SCALE_INITS)).all() and (df.n == len(SEEDS)).all()
    for r in df.itertuples():
        d = np.array([_shift(r.design, r.d_head, r.init) + x for x in NOISE])
        h = st.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
        assert (r.value, r.lo, r.hi) == pytest.approx(
            tuple(100 * math.expm1(v) for v in (d.mean(), d.mean() - h, d.mean() + h)),
            rel=1e-9, abs=1e-9)
        # each side's mean is its own init's: inside from unit variance is 0.2 nats above
        inside = float(np.mean([1.5 + 0.01 * s for s in SEEDS])) + 0.2 * (r.init == "unit")
        assert r.baseline_mean == pytest.approx(inside, abs=1e-12)
    status = dict(zip(zip(df.design, df.d_head, df.init), df.status))
    assert status.pop(("none", 16, "unit")) == "worse"
    assert status.pop(("both", 8, "gpt2")) == "better"
    assert set(status.values()) == {"equivalent"}  # ±0.4% at most, the margin ±2%
    # the family holds exactly these cells at this profile, each at its width and init
    assert {(h.design, h.d_head, h.init) for h in families()["Q1"].members
            if h.experiment == "scale_train" and h.d_head in widths} == set(
        zip(df.design, df.d_head, df.init))


def test_runs_from_before_heads_times_d_head_equal_d_model_are_not_read(tmp_path):
    """A store keeps scale_train's memberships of two heads at every width (no n_heads tag):
    tagged like the current runs, they would stand beside them in a comparison."""
    path = tmp_path / "r.db"
    want = _load(path, _shift).comparisons
    p = dataclasses.replace(profiles.PROFILES["smoke"], scale_train_seeds=SEEDS)
    old = [registry.make_run("lm", registry.base_model(p, n_heads=2, d_head=t["d_head"],
                                                       scale=dict(spec.model).get("scale")),
                             p, t["seed"], {k: v for k, v in t.items()
                                            if k not in ("n_heads", "task", "seed")})
           for spec, t in registry.runs_of("scale_train", p) if t["design"] != "control"]
    with Store(path) as store:
        for rid, (_, t) in zip(store.add("scale_train", p.name, old), old):
            if store.claim(rid):
                store.finish(rid, "done", 1, scored({"val_loss": 9.0}), {"n_params": 1})
        stored = runs_frame(store, "scale_train", p.name)
        data = results.load(store, p)
    assert stored.n_heads.isna().sum() == len(old) > 0  # kept in the store, not read
    assert data.runs.n_heads.notna().all()
    pd.testing.assert_frame_equal(data.comparisons, want)


def test_the_figure_draws_the_verdict_rows_and_the_words_answer_from_them(data, tmp_path):
    with plt.rc_context(figures_q.STYLE):
        fig = fig_q1_scale_train(data, tmp_path)
    drawn = pd.read_csv(tmp_path / fig.csv)
    want = placement_effects(data)
    assert (tmp_path / fig.png).is_file()
    assert list(zip(drawn.init, drawn.design, drawn.d_head)) == list(
        zip(want.init, want.design, want.d_head))
    assert np.array_equal(drawn[["value", "lo", "hi"]].to_numpy(),
                          want[["value", "lo", "hi"]].to_numpy().astype(float))
    assert [a.init for a in scale_answers(data)] == list(SCALE_INITS)
    a, u = scale_answers(data)
    assert not a.tuned and a.edges == () and a.status("none").value == "equivalent"
    assert u.status("none").value == "worse"
    lead = scale_lead(data)
    assert lead.startswith("Where 1/√d_k sits, trained on lm with each width split as heads × "
                           f"d_head = d_model ({data.profile.d_model}), every placement at lm's "
                           "learning rate")
    assert f" {scale_words(a)} {scale_words(u)}" in lead
    assert ("From a unit-variance init (std 1/√d_model), vs inside: 1/√d_k outside: "
            "equivalent at d_head 8 (+0.0 ± 0.3% perplexity) and 16 (+0.0 ± 0.3% perplexity)"
            in lead)
    assert "no 1/√d_k: equivalent at d_head 8 (+0.0 ± 0.3% perplexity); worse at d_head 16 " \
        "(+10.5 ± 0.3% perplexity); no 1/√d_k, T5 init" in scale_words(u)
    assert "So the constant is needed at d_head 16: without it lm trains worse" in scale_words(u)
    assert "1/√d_k inside and outside: better at d_head 8 (-9.5 ± 0.3% perplexity)" \
        in scale_words(a)
    assert "without it lm trains as well at d_head 16 from this init" in scale_words(a)
    table = scale_table(data)[0]
    n = len(data.profile.scale_train_d_heads)
    assert len(table.rows) == n * (len(SCALES) * len(SCALE_INITS) + 1)
    assert {r[3] for r in table.rows} == {f"{rates.task_lr('lm', data.profile):g} (lm's)"}
    assert [r[0] for r in table.rows].count("— (no Q, K)") == n


def test_q1s_answer_opens_with_the_trained_verdicts_and_words_only_the_rest_after(data):
    from qkvlab.studies.qkv.render.answers import answer_blocks

    lead = scale_lead(data)
    q1 = answer_blocks(data, {"q1": lead})[1].text
    n = (len(SCALES) - 1) * len(data.profile.scale_train_d_heads) * len(SCALE_INITS)
    assert q1.startswith(f"Q1 — the 4th matrix and the scale. {lead} None of the other "
                         f"comparisons is decided after correcting for the {n} this question "
                         f"asks. Scale: the smoke profile")
    assert "d_head 16" not in q1[len(lead):]  # the per-width cells are worded once, in the lead


def test_where_no_cell_uses_attention_the_words_say_so_once_per_init(tmp_path):
    """The control level with inside at every width (quick's lm): no per-cell list, the
    reason once, then each width's means."""
    data = _load(tmp_path / "r.db", lambda design, d_head, init: 0.0)
    for a in scale_answers(data):
        words = scale_words(a)
        assert words.startswith(f"From {INIT_WORDS[a.init]}: No verdict yet: standard does not "
                                f"beat the attention-free control at this budget")
        assert "vs inside:" not in words
        assert words.count("inside does not beat the attention-free control") == 2
