"""The questions as typed records (``plan.questions``): every list the study used to keep by
hand is read from their rows, and adding a design to a question is one row."""

from __future__ import annotations

import dataclasses

import pytest

from qkvlab.experiments.registry import EXPERIMENTS, runs_of
from qkvlab.studies.qkv.compute import frames
from qkvlab.studies.qkv.plan import questions as Q
from qkvlab.studies.qkv.plan import vocab
from qkvlab.studies.qkv.plan.experiments import BY_NAME, ORDER, ROLES
from qkvlab.studies.qkv.plan.families import SCALE_D_HEADS, Headline
from qkvlab.studies.qkv.plan.placements import PLACEMENTS

TIED_QK = ("tied_qk", "tied_qk_selfmask", "tied_qkv", "tied_qkv_selfmask")
DIRECTED = ("tied_qk", "tied_qk_selfmask", "tied_qkv_selfmask")
BOTH = ("equal", "matched")


def test_the_families_are_the_ones_written_before_the_runs():
    """The families read from the rows are, member for member and in order, the lists
    ``plan.families`` held before the rows existed, with Q=K=V + self-mask added to Q2's two
    experiments as the rows add it, and Q1's scale cells at each init (heads × d_head =
    d_model)."""
    before = {
        "Q1": (*(Headline("alt_vs_standard", "alt", t, a) for t in ("lm", "translate")
                 for a in BOTH),
               Headline("alt_vs_standard", "alt", "lm_char"),
               Headline("alt_init", "alt_identity", "translate"),
               *(Headline("scale_train", tag, "lm", d_head=d, init=i) for i in ("gpt2", "unit")
                 for tag in PLACEMENTS if tag != "standard" for d in SCALE_D_HEADS)),
        "Q2": (*(h for d in TIED_QK for h in (
                   *(Headline("tied_qk_qkv", d, t, a) for t in ("lm", "mlm", "mqar", "relation")
                     for a in BOTH), Headline("tied_qk_qkv", d, "lm_char"))),
               *(Headline("directed_relation", d, t) for d in DIRECTED
                 for t in ("successor", "successor_causal"))),
        "Q3": (*(Headline("lm_tied_kv", "tied_kv", "lm", a) for a in BOTH),
               Headline("lm_tied_kv", "tied_kv", "lm_char"),
               Headline("lm_gqa", "gqa_half", "lm"),
               *(Headline("kv_translate", "tied_kv_cross", "translate", a) for a in BOTH),
               *(Headline("bind_vs_dhead", "tied_kv", "bind_codes", a, widest_m=True)
                 for a in BOTH)),
    }
    fams = Q.families()
    assert list(fams) == ["Q1", "Q2", "Q3"]
    assert {k: f.members for k, f in fams.items()} == before
    assert all(f.method == "holm" for f in fams.values())


def test_every_row_names_a_design_a_comparison_and_a_task_metric():
    assert set(ORDER) == set(BY_NAME) and set(ORDER) <= set(EXPERIMENTS)
    assert {e.role for e in BY_NAME.values()} <= set(ROLES)
    for r in Q.rows():
        assert r.design in vocab.DESIGNS or r.experiment == "scale_train", r
        assert BY_NAME[r.experiment].role == "comparison", r
        assert all(t in vocab.TASK_METRIC for t in (*r.tasks, *r.also)), r
    assert [q.label for q in Q.QUESTIONS.values()] == ["Q1", "Q2", "Q3"]
    assert all(q.claims for q in Q.QUESTIONS.values())


def test_the_lists_read_from_the_rows():
    assert Q.summary_sources() == ("alt_vs_standard", "tied_qk_qkv", "directed_relation",
                                   "lm_tied_kv", "lm_gqa", "kv_translate")
    assert Q.tuned_designs() == {
        "lm": ("alt", *TIED_QK, "tied_kv", "gqa_half", "control"),
        "lm_char": ("alt", *TIED_QK, "tied_kv", "control"),
        "mlm": (*TIED_QK, "control"),
        "translate": ("alt", "alt_identity", "tied_kv_cross", "control")}
    assert Q.equal_only() == {"gqa_half", "alt_identity", "control"}
    assert Q.designs_on("directed_relation") == {t: (DIRECTED, ("equal",))
                                                 for t in ("successor", "successor_causal")}
    assert Q.designs_on("tied_qk_qkv")["lm_char"] == (TIED_QK, None)
    assert Q.QUESTIONS["q3"].forest()[:2] == [(("lm_tied_kv", "lm_gqa"), "tied_kv", "lm"),
                                              (("lm_tied_kv", "lm_gqa"), "gqa_half", "lm")]


@pytest.fixture
def one_more_row(monkeypatch):
    """A new design added to Q2 the way a developer adds one: its vocabulary row (name,
    label, color, model options) and one row in the question."""
    new = vocab.Design("tied_qk_new", "tied Q=K, new", "#123456", {"design": "tied_qk"})
    monkeypatch.setitem(vocab.DESIGNS, new.name, new)
    q2 = Q.QUESTIONS["q2"]
    row = Q.Compared("tied_qk_qkv", new.name, Q.Q2_TASKS, also=Q.CHAR)
    monkeypatch.setitem(Q.QUESTIONS, "q2", dataclasses.replace(q2, rows=(*q2.rows, row)))
    return new.name


def test_adding_a_design_to_a_question_is_one_row(one_more_row):
    name = one_more_row
    smoke = {(t["task"], t["arm"]) for _, t in runs_of("tied_qk_qkv", "smoke")
             if t["design"] == name}
    baseline = {(t["task"], t["arm"]) for _, t in runs_of("tied_qk_qkv", "smoke")
                if t["design"] == "tied_qk"}
    assert smoke == baseline and {t for t, _ in smoke} == {*Q.Q2_TASKS, "lm_char"}
    tuned = {(t["task"], t["arm"]) for _, t in runs_of("lr_tune", "standard")
             if t["design"] == name}
    assert tuned == {(t["task"], t["arm"]) for _, t in runs_of("lr_tune", "standard")
                     if t["design"] == "tied_qk"}
    assert tuned, "the new design is tuned where the others are"
    members = [h for h in Q.families()["Q2"].members if h.design == name]
    assert [(h.task, h.arm) for h in members] == [
        *((t, a) for t in Q.Q2_TASKS for a in BOTH), ("lm_char", "equal")]
    assert [(d, t) for _, d, t in Q.QUESTIONS["q2"].forest() if d == name] == \
        [(name, t) for t in Q.Q2_TASKS]
    assert "tied_qk_qkv" in Q.summary_sources()
    assert Q.QUESTIONS["q2"].designs("tied_qk_qkv")[-1] == name
    assert frames.QUESTIONS is Q.QUESTIONS  # compute reads the same records
