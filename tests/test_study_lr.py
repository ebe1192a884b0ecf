"""Per-design learning rates: ``lr_tune``'s grid, the choice read back from the store, and the
comparisons trained at the chosen rates (``Profile.prepared``: ``experiments.read_rates``)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from qkvlab.experiments import registry
from qkvlab.experiments.runner import sweep_plan
from qkvlab.experiments.store import Store
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.compute.frames import lr_frame
from qkvlab.studies.qkv.plan import edges, profiles, rates
from qkvlab.studies.qkv.plan.questions import equal_only, tuned_designs

GRID = (0.5, 1.0, 2.0)


@pytest.fixture
def profile():
    """The smoke profile with a 3-point grid on one tuning seed (not registered: passed as is)."""
    return dataclasses.replace(profiles.PROFILES["smoke"], lr_grid=GRID, lr_seeds=(100, 101))


def _finish_grid(store: Store, p, loss, skip=()) -> None:
    """Register lr_tune's runs and finish each with val_loss = loss(task, design, arm, lr,
    seed) (None: diverged); runs whose (task, design) is in ``skip`` stay pending."""
    runs = registry.runs_of("lr_tune", p)
    ids = store.add("lr_tune", p.name, runs)
    for rid, (_, tags) in zip(ids, runs):
        if (tags["task"], tags["design"]) in skip or not store.claim(rid):
            continue
        v = loss(tags["task"], tags["design"], tags["arm"], tags["lr"], tags["seed"])
        store.finish(rid, "diverged" if v is None else "done", 1,
                     {} if v is None else {"val_loss": v}, {"n_params": 1})


def _finish_edge(store: Store, p, loss, stages: int | None = None) -> list:
    """Register lr_tune_edge's runs (planned from the finished grid) and finish them like
    ``_finish_grid``, listing them again after each stage until nothing new is listed, as the
    sweep does (at most ``stages`` stages); returns the last listing."""
    n = 0
    while stages is None or n < stages:
        runs = registry.runs_of("lr_tune_edge", p, store)
        ids = store.add("lr_tune_edge", p.name, runs, replace=True)
        fresh = [(rid, tags) for rid, (_, tags) in zip(ids, runs) if store.claim(rid)]
        for rid, tags in fresh:
            v = loss(tags["task"], tags["design"], tags["arm"], tags["lr"], tags["seed"])
            store.finish(rid, "diverged" if v is None else "done", 1,
                         {} if v is None else {"val_loss": v}, {"n_params": 1})
        n += 1
        if not fresh:
            break
    return runs


def test_lr_tune_covers_every_tuned_design_rate_and_seed(profile):
    runs = registry.runs_of("lr_tune", profile)
    want = {(t, d, a, float(f"{rates.task_lr(t, profile) * m:.3g}"), s)
            for t, labels in tuned_designs().items() for d in ("standard", *labels)
            for a in rates.tuned_arms(profile, t, d) for m in GRID for s in (100, 101)}
    got = {(tg["task"], tg["design"], tg["arm"], tg["lr"], tg["seed"]) for _, tg in runs}
    assert got == want and len(runs) == len(want)
    # the matched arm is tuned where the comparisons run one: not for standard (its matched
    # arm is its equal run), GQA or identity-init alt (equal width only), or a task whose
    # profile runs equal width only
    assert {(t, d) for t, d, a, _, _ in want if a == "matched"} == {
        (t, d) for t, labels in tuned_designs().items() for d in labels
        if d not in equal_only() and t != "lm_char"}  # lm_char: equal width only
    assert profile.task_arms["lm_char"] == ("equal",)
    narrow = dataclasses.replace(profile, task_arms={"mlm": ("equal",)})
    assert not {tg["design"] for _, tg in registry.runs_of("lr_tune", narrow)
                if tg["task"] == "mlm" and tg["arm"] == "matched"}
    matched_spec = {tg["design"]: s.model for s, tg in runs if tg["arm"] == "matched"}
    assert matched_spec["tied_qk"]["d_head"] > profile.d_model // profile.n_heads  # widened
    assert all(spec.train.lr == tags["lr"] and spec.train.seed == tags["seed"]
               for spec, tags in runs)
    assert not set(profile.lr_seeds) & set(profile.seeds)
    assert registry.runs_of("lr_tune", profiles.PROFILES["quick"]) == []  # quick: one shared rate


def test_comparisons_wait_for_the_grid_with_a_clear_error(profile, tmp_path):
    with pytest.raises(ValueError, match=r"run `qkvlab sweep lr_tune --profile smoke`, then lr_tune_edge, first"):
        registry.runs_of("lm_tied_kv", profile)
    with Store(tmp_path / "r.db") as store:
        _finish_grid(store, profile,  # the middle rate wins: no edge to extend
                     lambda t, d, a, lr, s: 2.0 + abs(math.log(lr / rates.task_lr(t, profile))),
                     skip={("lm", "tied_kv")})
        with pytest.raises(rates.RatesPending, match=r"not finished for \['tied_kv \(equal\)', "
                                                 r"'tied_kv \(matched\)'\]"):
            registry.runs_of("lm_tied_kv", profile, store)
        assert sweep_plan("lm_gqa", profile, store=store)  # its grid is complete


def n_tuned(p) -> int:
    """How many (task, design, arm) rates ``lr_tune`` chooses at profile ``p``."""
    return sum(len(rates.tuned_arms(p, t, d)) for t, labels in tuned_designs().items()
               for d in ("standard", *labels))


def test_each_design_and_arm_trains_at_the_rate_with_the_lowest_mean_val_loss(profile,
                                                                              tmp_path):
    base = rates.task_lr("lm", profile)
    # multiplier with the lowest loss per (design, arm): the matched tied K=V its own
    best = {("standard", "equal"): 0.5, ("tied_kv", "equal"): 2.0, ("tied_kv", "matched"): 0.5}

    def loss(task, design, arm, lr, seed):
        m = lr / rates.task_lr(task, profile)
        if design == "tied_kv" and arm == "equal" and m == 1.0 and seed == 101:
            return None  # diverged: counts as an infinite loss, so 1.0 cannot win
        return 2.0 + abs(math.log(m / best.get((design, arm), 1.0))) + 0.01 * (seed - 100)

    with Store(tmp_path / "r.db") as store:
        _finish_grid(store, profile, loss)
        # three choices sit on the grid's edge: their comparisons wait for the point beyond
        with pytest.raises(rates.RatesPending, match="then lr_tune_edge"):
            registry.runs_of("lm_tied_kv", profile, store)
        edge = _finish_edge(store, profile, loss)
        runs = registry.runs_of("lm_tied_kv", profile, store)
        chosen = rates.chosen_lrs(profile, store)
    # one step past each edge choice (0.25 below 0.5, 4 above 2), on both tuning seeds; the
    # loss there is higher, so the edge choice stands
    assert {(t["task"], t["design"], t["arm"], t["lr"] / base) for _, t in edge
            if t["task"] == "lm"} == {("lm", "standard", "equal", 0.25),
                                      ("lm", "tied_kv", "equal", 4.0),
                                      ("lm", "tied_kv", "matched", 0.25)}
    assert all(s.train.test_batches == 0 and t["seed"] in (100, 101) for s, t in edge)
    assert {(s.train.lr, t["design"], t["arm"]) for s, t in runs} == {
        (float(f"{base * 0.5:.3g}"), "standard", "equal"),
        (float(f"{base * 0.5:.3g}"), "standard", "matched"),  # standard's equal run
        (float(f"{base * 2.0:.3g}"), "tied_kv", "equal"),
        (float(f"{base * 0.5:.3g}"), "tied_kv", "matched"),
        (float(f"{base:.3g}"), "control", "equal")}  # the control at its own tuned rate
    assert chosen[("lm", "alt", "equal")] == float(f"{base:.3g}")
    assert len(chosen) == n_tuned(profile)


def test_the_choice_reads_only_the_grid_the_profile_lists_now(profile, tmp_path):
    # a store keeps the runs of an earlier grid (other rates, same memberships' experiment):
    # they neither complete nor change the current choice
    old = dataclasses.replace(profile, lr_grid=(0.1, 1.0))
    with Store(tmp_path / "r.db") as store:
        _finish_grid(store, old, lambda *a: 1.0)  # the old grid's 0.1 wins everywhere
        assert rates.chosen_lrs(profile, store) == {}  # the current grid has not run yet
        _finish_grid(store, profile,
                     lambda t, d, a, lr, s: 2.0 + abs(math.log(lr / rates.task_lr(t, profile))))
        chosen = rates.chosen_lrs(profile, store)
    assert len(chosen) == n_tuned(profile)
    assert all(lr == float(f"{rates.task_lr(t, profile):.3g}") for (t, _, _), lr in chosen.items())


def test_ties_go_to_the_smaller_rate_and_all_diverged_chooses_nothing(profile, tmp_path):
    def loss(t, d, a, lr, s):
        return None if d == "alt" and t == "lm" else 2.0
    with Store(tmp_path / "r.db") as store:
        _finish_grid(store, profile, loss)
        grid = rates.chosen_lrs(profile, store)
        _finish_edge(store, profile, loss, stages=1)
        one_step = rates.chosen_lrs(profile, store)
        _finish_edge(store, profile, loss)
        chosen = rates.chosen_lrs(profile, store)
        data = results.load(store, profile)
    assert grid == {}  # every choice sits on the edge (the smallest rate): none is final yet
    assert one_step == {}  # the point past it ties and wins: the next one is listed
    assert ("lm", "alt", "equal") not in chosen and ("lm", "alt", "matched") not in chosen
    # the tie goes to the smaller rate at every step, so the choice is followed to the last
    # point past the grid (0.5 / 2³) and stops there, flagged in the report
    last = float(f"{rates.task_lr('lm', profile) * 0.5 / 2 ** edges.EDGE_STEPS:.3g}")
    assert chosen[("lm", "standard", "equal")] == last
    frame = lr_frame(data)
    flagged = frame[frame.chosen & frame.edge]
    assert set(zip(flagged.design, flagged.lr)) >= {("standard", last)}
    assert frame[frame.chosen].edge.all()


def test_a_choice_is_followed_past_the_edge_until_it_turns(profile, tmp_path):
    # lm's standard is best at 1/8 of the task's rate: the grid (0.5, 1, 2) chooses 0.5, the
    # first point past it (0.25) wins, the next (0.125) wins, the third (0.0625) loses
    base = rates.task_lr("lm", profile)

    def loss(t, d, a, lr, s):
        b = 0.125 if (t, d) == ("lm", "standard") else 1.0
        return 2.0 + abs(math.log(lr / rates.task_lr(t, profile) / b))
    with Store(tmp_path / "r.db") as store:
        _finish_grid(store, profile, loss)
        stages = [sorted({t["lr"] for _, t in _finish_edge(store, profile, loss, stages=1)
                          if (t["task"], t["design"]) == ("lm", "standard")})]
        for _ in range(3):
            stages.append(sorted({t["lr"] for _, t in registry.runs_of(
                "lr_tune_edge", profile, store) if (t["task"], t["design"]) == ("lm", "standard")}))
            _finish_edge(store, profile, loss, stages=1)
        chosen = rates.chosen_lrs(profile, store)
        runs = registry.runs_of("lm_tied_kv", profile, store)
        data = results.load(store, profile)
    # each stage lists one point more, once the one before has won; then nothing new
    lr = [float(f"{base * m:.3g}") for m in (0.0625, 0.125, 0.25)]
    assert stages == [lr[2:], lr[1:], lr, lr]
    assert chosen[("lm", "standard", "equal")] == float(f"{base * 0.125:.3g}")
    assert {s.train.lr for s, t in runs if (t["task"], t["design"]) == ("lm", "standard")} == {
        float(f"{base * 0.125:.3g}")}
    frame = lr_frame(data)
    std = frame[(frame.task == "lm") & (frame.design == "standard") & frame.chosen]
    assert list(std.lr) == [float(f"{base * 0.125:.3g}")] and not std.edge.any()


def test_report_draws_the_grid_and_lists_each_chosen_rate(profile, tmp_path):
    import matplotlib.pyplot as plt
    import pandas as pd

    from qkvlab.studies.qkv.compute import results
    from qkvlab.studies.qkv.render import figures, figures_q, tables

    def loss(task, design, arm, lr, seed):
        return 2.0 + abs(math.log(lr / rates.task_lr(task, profile))) + (0.5 if design == "alt" else 0)

    with Store(tmp_path / "r.db") as store:
        _finish_grid(store, profile, loss)
        data = results.load(store, profile)
    with plt.rc_context(figures_q.STYLE):
        fig = figures.fig_lr(data, tmp_path / "figs")
    df = pd.read_csv(tmp_path / "figs" / fig.csv)
    n_designs = n_tuned(profile)
    assert len(df) == n_designs * len(GRID) and df.seeds.eq(2).all()
    chosen = df[df.chosen]
    assert len(chosen) == n_designs
    assert all(r.lr == float(f"{rates.task_lr(r.task, profile):.3g}") for r in chosen.itertuples())
    assert not chosen.edge.any()  # the middle rate won everywhere
    want = {("lm", "alt", "matched", float(f"{rates.task_lr('lm', profile) * 2:.3g}")):
            2.5 + math.log(2)}
    got = df.set_index(["task", "design", "arm", "lr"]).val_loss
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-12)
    blocks = tables.lr_blocks(data, {"setup": [fig]})
    table = blocks[-1]
    assert len(table.rows) == n_designs and {r[5] for r in table.rows} == {"no"}
    assert {r[2] for r in table.rows} == {"equal", "matched"}


def test_task_seeds_and_arms_narrow_only_the_tasks_they_name():
    p = dataclasses.replace(profiles.PROFILES["smoke"], seeds=(0, 1), task_seeds={"mqar": (5,)},
                            task_arms={"mlm": ("equal",)})
    runs = registry.runs_of("tied_qk_qkv", p)
    got = {(tg["task"], tg["seed"], tg["arm"]) for _, tg in runs}
    seeds, arms = (0, 1), ("equal", "matched")
    want = ({("lm", s, a) for s in seeds for a in arms}
            | {("relation", s, a) for s in seeds for a in arms}
            | {("mlm", s, "equal") for s in seeds}
            | {("lm_char", s, a) for s in seeds for a in arms}  # task_arms replaced: both
            | {("mqar", 5, a) for a in arms})
    assert got == want
    # no seeds leave the task out
    gone = registry.runs_of("tied_qk_qkv", dataclasses.replace(p, task_seeds={"mqar": ()}))
    assert {tg["task"] for _, tg in gone} == {"lm", "lm_char", "mlm", "relation"}
    # the experiments that name their own seeds or arms keep them
    assert {tg["seed"] for _, tg in registry.runs_of("lm_scaling", dataclasses.replace(
        p, scale_widths=(16,), scale_seeds=(3,)))} == {3}



def test_follow_edge_trains_the_next_point_only_while_the_newest_wins():
    def past(k):  # a grid whose lowest point is 1, stepping ×1/2
        return 0.5 ** k
    # inside the grid: nothing to follow
    assert edges.follow_edge(2.0, lambda k: None, {2.0: 1.0}.get) == ([], 2.0)
    # the first point has not run: listed, no choice yet
    assert edges.follow_edge(1.0, past, {1.0: 3.0}.get) == ([0.5], None)
    # it lost: the choice stays at the grid's edge, nothing more listed
    assert edges.follow_edge(1.0, past, {1.0: 3.0, 0.5: 3.5}.get) == ([0.5], 1.0)
    # it won: the next is listed; that one lost: the choice is the first point
    assert edges.follow_edge(1.0, past, {1.0: 3.0, 0.5: 2.0}.get) == ([0.5, 0.25], None)
    assert edges.follow_edge(1.0, past, {1.0: 3.0, 0.5: 2.0, 0.25: 2.5}.get) == (
        [0.5, 0.25], 0.5)
    # a tie goes to the smaller rate, so it counts as a win; a diverged point (inf) loses
    assert edges.follow_edge(1.0, past, {1.0: 3.0, 0.5: 3.0, 0.25: math.inf}.get) == (
        [0.5, 0.25], 0.5)
    # every point wins: followed EDGE_STEPS points and no further
    falling = {1.0: 9.0, **{0.5 ** k: 9.0 - k for k in range(1, 10)}}
    pts, choice = edges.follow_edge(1.0, past, falling.get)
    assert pts == [0.5 ** k for k in range(1, edges.EDGE_STEPS + 1)] and choice == pts[-1]


def test_the_report_flags_a_choice_still_at_an_end_of_the_rates_tried():
    import types

    import pandas as pd

    from qkvlab.studies.qkv.compute.frames import edge_choices
    from qkvlab.studies.qkv.render.text import edge_note

    def rows(design, losses):
        return [{"run_id": f"{design}-{lr}-{s}", "experiment": "head_width_tune", "design": design,
                 "d_model": 64, "n_heads": 1, "lr": lr, "status": st, "val_loss": v}
                for lr, seeds in losses.items() for s, (st, v) in enumerate(seeds)]
    done = lambda *v: [("done", x) for x in v]  # noqa: E731
    df = pd.DataFrame(
        rows("standard", {1e-3: done(3.0, 3.2), 2e-3: done(2.0, 2.2), 4e-3: done(2.5, 2.5)})
        # K=V: best at the smallest rate tried (the last point past the edge): flagged
        + rows("tied_kv", {1.25e-4: done(1.0, 1.0), 2.5e-4: done(1.5, 1.5), 1e-3: done(2, 2)})
        # GQA: the larger rate diverged on one seed (infinite mean), so the smaller is chosen,
        # the smallest tried: flagged
        + rows("gqa_half", {1e-3: done(2.0, 2.0), 2e-3: [("done", 0.1), ("diverged", None)]})
        # the control: every rate diverged: no choice, nothing to flag
        + rows("control", {1e-3: [("diverged", None)], 2e-3: [("diverged", None)]}))
    got = edge_choices(types.SimpleNamespace(runs=df), ("head_width_tune",),
                       ["design", "d_model", "n_heads"])
    assert got.to_dict("records") == [
        {"design": "gqa_half", "d_model": 64, "n_heads": 1, "lr": 1e-3},
        {"design": "tied_kv", "d_model": 64, "n_heads": 1, "lr": 1.25e-4}]
    (para,) = edge_note(got, lambda r: r.design)
    assert para.text == ("Rates chosen at the last point followed past the grid's edge (3 grid "
                         "steps at most; the best may lie further out): gqa_half (0.001), "
                         "tied_kv (0.000125).")
    assert edge_note(got.iloc[:0], lambda r: r.design) == []
