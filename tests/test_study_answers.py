"""The answers that open the report, from small synthetic results written through the real
store API: a decided effect is named with its number, an undecided one as open, the scale is
the stored runs', and the section comes right after the title.

Expected numbers are computed here independently (numpy, the t quantile for 2 degrees of
freedom) and compared whole.
"""

from __future__ import annotations

import numpy as np

from conftest import scored
from qkvlab.env import environment
from qkvlab.experiments.store import Store
from qkvlab.report.blocks import Card, Heading, Para, Section, Table, Title
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.compute.answers import Finding, Published, Scale, answer, answers
from qkvlab.studies.qkv.compute.effects import Effect, Status, attention_used
from qkvlab.studies.qkv.plan.questions import QUESTIONS
from qkvlab.studies.qkv.plan.references import REF_KV_CITE, REF_KV_PPL_PCT
from qkvlab.studies.qkv.render.answers import (
    answer_blocks,
    answer_text,
    headline_smoke,
    published_words,
)
from qkvlab.studies.qkv.render.page import SECTION_IDS, build
from qkvlab.studies.qkv.render.verdicts import all_verdicts

T975_DF2 = 4.302652729911275  # Student t, 97.5% quantile, 2 degrees of freedom
STD = [2.00, 2.10, 2.20]
TIED = [2.20, 2.30, 2.45]  # worse at equal width, and still after Holm over Q3's two
MATCHED = [2.0, 2.2, 2.1]  # undecided


def _fill(store: Store, experiment: str, task: str, values: dict[tuple[str, str], list[float]],
          metric: str = "val_loss") -> None:
    """One finished run per (design, arm, seed), d_model 64, 2 layers, 200 steps, standard with
    1,000 parameters and the tied design 900."""
    env = environment()
    for (design, arm), vals in values.items():
        for seed, v in enumerate(vals):
            spec = {"task": task, "seed": seed, "train": {"steps": 200},
                    "model": {"design": design, "arm": arm, "d_model": 64, "n_layers": 2}}
            tags = {"task": task, "design": design, "arm": arm, "seed": seed}
            (rid,) = store.add(experiment, "smoke", [(spec, tags)])
            if store.claim(rid):
                store.finish(rid, "done", 200, scored({metric: v}),
                             {"n_params": 1000 if design == "standard" else 900, **env})


def _ppl(a, b) -> tuple[float, float]:
    """Paired Δ val loss -> % perplexity: mean and half the 95% CI, mapped through exp."""
    d = np.array(a) - np.array(b)
    m, h = d.mean(), T975_DF2 * d.std(ddof=1) / np.sqrt(len(d))
    return 100 * np.expm1(m), 100 * (np.expm1(m + h) - np.expm1(m - h)) / 2


def _data(tmp_path):
    with Store(tmp_path / "r.db") as store:
        _fill(store, "lm_tied_kv", "lm", {("standard", "equal"): STD,
                                          ("standard", "matched"): STD,
                                          ("tied_kv", "equal"): TIED,
                                          ("tied_kv", "matched"): MATCHED})
        return results.load(store, "smoke")


def test_a_decided_effect_is_named_with_its_number_and_an_undecided_one_as_open(tmp_path):
    data = _data(tmp_path)
    a = answer(data, "q3")
    assert a.family_m == 2
    assert [(f.design, f.task, f.arm, f.effect.status) for f in a.decided] == \
        [("tied_kv", "lm", "equal", Status.WORSE)]
    assert [(f.design, f.arm, f.effect.status) for f in a.open] == \
        [("tied_kv", "matched", Status.UNDECIDED)]
    assert a.scale == Scale("smoke", d_model=(64,), n_layers=(2,), params=(1000, 1000),
                            steps=(200,), seeds=(3,))
    # the headline lm is per subword token (BPE) at every profile, as the published number
    assert (a.published.ours, a.published.our_unit) == (a.decided[0], "subword token")
    mean, half = _ppl(TIED, STD)
    theirs = 100 * (1.031 ** (1 / 4) - 1)  # per character, at ~4 characters a GPT-2 token
    ours = 100 * ((1 + mean / 100) ** (1 / 3.035) - 1)  # at lm's 3.035 characters a token
    seeds = a.open[0].effect.seeds
    assert answer_text(a) == (
        f"Decided, after correcting for the 2 comparisons this question asks: tied K=V is worse "
        f"than standard on text prediction (lm) at equal width ({mean:+.1f} ± {half:.1f}% "
        f"perplexity). Scale: the smoke profile, models 64 wide, 2 layers deep, 1,000 "
        f"parameters (standard), trained for 200 steps, 3 seeds per comparison. Published "
        f"({REF_KV_CITE}): tied K=V costs +{REF_KV_PPL_PCT:g}% perplexity per subword token at "
        f"300M parameters (+2.2% in their corrected-masking rerun, 300M, FineWeb-Edu, one "
        f"seed); ours, {mean:+.1f} ± {half:.1f}% perplexity at equal width, is per "
        f"subword token too, at a far smaller scale (per character: theirs +{theirs:.2f}% at ~4 "
        f"characters a token, ours {ours:+.2f}% at 3.035). Still open: tied "
        f"K=V on text prediction parameter-matched. About {seeds} seeds per comparison would "
        f"settle them. Not run at this profile: text prediction by character (lm_char), "
        f"translation (translate) and recalling a value bound to a key (bind_codes).")
    # a question this store has no runs of: nothing decided, and what was not run is named
    assert answer_text(answer(data, "q1")) == (
        "No comparison of this question has finished runs at this profile. Scale: the smoke "
        "profile. Not run at this profile: text prediction (lm), translation (translate) and "
        "text prediction by character (lm_char).")


def test_a_verdict_undone_by_holm_is_open_not_decided(tmp_path):
    """alt on lm: worse at p ≈ 0.04 alone at equal width, undone by Holm over Q1's two."""
    with Store(tmp_path / "r.db") as store:
        _fill(store, "alt_vs_standard", "lm", {
            ("standard", "equal"): STD, ("standard", "matched"): STD,
            ("alt", "equal"): [2.03, 2.14, 2.22], ("alt", "matched"): [2.1, 2.0, 2.25]})
        data = results.load(store, "smoke")
    a = answer(data, "q1")
    assert a.decided == () and [f.effect.raw_status for f in a.open] == [Status.WORSE, None]
    mean, half = _ppl([2.03, 2.14, 2.22], STD)
    text = answer_text(a)
    assert text.startswith("Nothing is decided yet: no comparison holds after correcting for "
                           "the 2 this question asks.")
    assert (f"Still open, though each would be decided on its own, without the correction for "
            f"all 2: alt (4th matrix) on text prediction (lm) at equal width, worse "
            f"({mean:+.1f} ± {half:.1f}% perplexity). Undecided outright: alt (4th matrix) on "
            f"text prediction parameter-matched.") in text
    assert "worse than" not in text


def test_the_answers_open_the_page_one_paragraph_per_question(tmp_path):
    data = _data(tmp_path)
    blocks = build(data, {}, all_verdicts(data))
    assert [b.id for b in blocks if isinstance(b, Section)] == list(SECTION_IDS)
    assert SECTION_IDS[0] == "answers"
    start = next(i for i, b in enumerate(blocks) if isinstance(b, Section))
    assert isinstance(blocks[0], Title) and start <= 2  # after the title and its provenance
    summary = next(i for i, b in enumerate(blocks) if isinstance(b, Table))
    # a card per question first, then each answer in full under its heading
    cards = blocks[start + 1:start + 4]
    assert [c.id for c in cards if isinstance(c, Card)] == ["q1", "q2", "q3"]
    assert [c.question for c in cards] == [q.title for q in QUESTIONS.values()]
    assert isinstance(blocks[start + 4], Heading)
    paras = blocks[start + 5:start + 8]
    assert start + 8 < summary and all(isinstance(p, Para) for p in paras)
    assert [p.text.split(". ")[0] for p in paras] == [q.title for q in QUESTIONS.values()]
    full = answer_blocks(data)
    assert [blocks[start], *paras] == full
    assert paras[2].text == f"{QUESTIONS['q3'].title}. {answer_text(answers(data)['q3'])}"


def test_a_published_number_beside_a_task_we_did_not_learn_gets_no_number_of_ours():
    ours = Finding("tied_kv", "lm", "equal", Effect(Status.NOT_LEARNED, unit="%",
                                                    what="perplexity", mean=4.0,
                                                    baseline_mean=4.0, chance=4.1))
    text = published_words(Published(3.1, "subword token", "300M parameters", "A et al.", ours,
                                     "character"))
    assert text == ("Published (A et al.): tied K=V costs +3.1% perplexity per subword token at "
                    "300M parameters; ours is not learned at this scale, so there is no number "
                    "to set beside it.")


def test_a_published_number_is_not_set_beside_a_gap_of_models_that_use_no_attention():
    ours = Finding("tied_kv", "lm", "equal", Effect(Status.ATTENTION_UNUSED, value=-4.2,
                                                    lo=-24.5, hi=16.1, half=20.3, unit="%",
                                                    what="perplexity"))
    text = published_words(Published(3.1, "subword token", "300M parameters", "A et al.", ours,
                                     "subword token"))
    assert text == ("Published (A et al.): tied K=V costs +3.1% perplexity per subword token at "
                    "300M parameters; ours (-4.2 ± 20.3% perplexity at equal width) is not set "
                    "beside it: at this budget standard does not beat the same model without "
                    "attention, so the difference says nothing about what the tie costs.")


def test_a_task_where_attention_is_not_used_is_named_as_not_answered():
    from qkvlab.studies.qkv.compute.answers import Answer

    unused = Finding("tied_kv", "lm", "equal", Effect(Status.ATTENTION_UNUSED, value=1.9))
    a = Answer("q3", 1, (), (), (), (), (unused,), Scale("quick"))
    text = answer_text(a)
    assert text.startswith("Nothing is decided yet: no comparison holds after correcting for "
                           "the 1 this question asks.")
    assert ("Attention not used at this budget, so not answered: text prediction (lm) "
            "(standard does not beat the same model with uniform attention by more than the "
            "margin).") in text


def test_a_headline_lm_that_does_not_use_attention_is_called_a_smoke_test(tmp_path):
    level = [2.01, 2.08, 2.22]  # the control about level with standard: attention not used
    with Store(tmp_path / "r.db") as store:
        _fill(store, "lm_tied_kv", "lm", {("standard", "equal"): STD,
                                          ("tied_kv", "equal"): TIED,
                                          ("control", "equal"): level})
        data = results.load(store, "smoke")
    row = data.compared("lm_tied_kv", task="lm", design="control", arm="equal")
    assert len(row) == 1 and attention_used(row.iloc[0].to_dict()) is False
    text = headline_smoke(data)
    value, half = _ppl(level, STD)
    assert text.startswith("At this profile the headline lm") and "smoke test" in text
    assert f"{value:+.1f} ± {half:.1f}%" in text
    assert answer_blocks(data)[-1].text == text
    assert headline_smoke(_data(tmp_path / "none")) == ""  # no control: nothing to say


def test_standard_says_where_the_head_width_axis_and_the_conversion_are(tmp_path):
    import dataclasses

    from qkvlab.experiments.registry import get_profile
    data = _data(tmp_path)
    std = dataclasses.replace(data, profile=get_profile("standard"))
    q3 = [p.text for p in answer_blocks(std) if isinstance(p, Para)][2]
    assert q3.endswith("are answered by the kv profile on the same lm runs "
                       "(`make report PROFILE=kv`).")
    # a profile that runs them itself (and every other) says nothing of kv
    for name in ("smoke", "kv"):
        other = dataclasses.replace(data, profile=get_profile(name))
        assert "PROFILE=kv" not in " ".join(p.text for p in answer_blocks(other)
                                           if isinstance(p, Para))
