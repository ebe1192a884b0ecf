"""Verdicts and tables from small synthetic results written through the real store API.

Expected values are computed here independently (numpy, the t quantile for 2 degrees of
freedom) and compared whole, two-sided.
"""

from __future__ import annotations

import numpy as np
import pytest

from qkvlab.env import environment
from qkvlab.experiments.store import Store
from qkvlab.studies.qkv import page, results, study, verdicts

T975_DF2 = 4.302652729911275  # Student t, 97.5% quantile, 2 degrees of freedom
STD = [2.00, 2.10, 2.20]
TIED = [2.20, 2.30, 2.45]


def _fill(store: Store, experiment: str, task: str, values: dict[tuple[str, str], list[float]],
          metric: str = "val_loss", extra_tags: dict | None = None) -> None:
    """Register and finish one run per (design, arm, seed) with ``metric`` = the given value."""
    env = environment()
    for (design, arm), vals in values.items():
        for seed, v in enumerate(vals):
            spec = {"task": task, "model": {"design": design, "arm": arm}, "seed": seed,
                    **(extra_tags or {})}
            tags = {"task": task, "design": design, "arm": arm, "seed": seed, **(extra_tags or {})}
            (rid,) = store.add(experiment, "smoke", [(spec, tags)])
            if store.claim(rid):
                store.finish(rid, "done", 10, {metric: v},
                             {"n_params": 1000, "params": {"attention": 100 if design == "standard" else 75},
                              "tokens_per_s": 1.0, **env})


def _expected_rel(a, b):
    rel = 100 * (np.array(a) / np.array(b) - 1)
    return rel.mean(), T975_DF2 * rel.std(ddof=1) / np.sqrt(len(rel))


def test_effect_worse_inconclusive_and_single_seed():
    mean, half = _expected_rel(TIED, STD)
    c = {"metric": "val_loss", "diff": 0.2, "diff_half": 0.1, "rel_pct": mean, "rel_half": half,
         "n_pairs": 3}
    e = verdicts.effect(c, lower_is_better=True)
    assert e["status"] == "worse"
    assert e["text"] == f"{mean:+.1f}% ± {half:.1f}% val loss (worse)"
    e = verdicts.effect({**c, "rel_pct": -1.0, "rel_half": 2.5}, lower_is_better=True)
    assert e["status"] == "inconclusive"
    assert e["text"] == ("-1.0% ± 2.5% val loss (inconclusive at this scale: the CI straddles "
                         "zero)")
    e = verdicts.effect({**c, "rel_half": float("nan"), "n_pairs": 1}, lower_is_better=True)
    assert (e["status"], e["half"]) == ("inconclusive", None)
    assert "no CI: inconclusive at this scale" in e["text"]
    acc = {"metric": "accuracy", "diff": 0.05, "diff_half": 0.01, "rel_pct": 9.0, "rel_half": 1.0}
    e = verdicts.effect(acc, lower_is_better=False)
    assert (e["status"], e["value"], e["half"]) == ("better", pytest.approx(5.0), pytest.approx(1.0))


def test_q3_verdict_and_summary_from_store(tmp_path):
    db = tmp_path / "r.db"
    with Store(db) as store:
        _fill(store, "lm_tied_kv", "lm", {("standard", "equal"): STD, ("standard", "matched"): STD,
                                          ("tied_kv", "equal"): TIED,
                                          ("tied_kv", "matched"): [2.0, 2.2, 2.1]})
        data = results.load(store, "smoke")
    mean, half = _expected_rel(TIED, STD)
    mmean, mhalf = _expected_rel([2.0, 2.2, 2.1], STD)
    d = np.array(TIED) - np.array(STD)
    dm, dh = d.mean(), T975_DF2 * d.std(ddof=1) / np.sqrt(3)
    ppl = (100 * (np.exp(dm) - 1), 100 * (np.exp(dm - dh) - 1), 100 * (np.exp(dm + dh) - 1))
    v = verdicts.verdict_q3(data)
    assert v.headline == (
        f"tied K=V: {mean:+.1f}% ± {half:.1f}% val loss (worse) on lm at equal width "
        f"({ppl[0]:+.1f}% perplexity (95% CI {ppl[1]:+.1f}% … {ppl[2]:+.1f}%); published "
        f"reference ≈ +3.1% perplexity at 300M–1.2B parameters, Kayyam et al. 2026, arXiv "
        f"2606.04032); {mmean:+.1f}% ± {mhalf:.1f}% val loss (inconclusive at this scale: the "
        f"CI straddles zero) parameter-matched.")
    table = page.summary_table(data)
    assert table.headers[:5] == ("design", "attention params ×", "attention layer time ×",
                                 "KV cache ×", "decode tokens/s ×")
    assert table.rows == (("tied K=V", "0.75", "—", "—", "—",
                           f"worse {mean:+.1f} ± {half:.1f}%"),)
    assert "undecided: the CI straddles zero" in table.legend


def test_bind_gap_closes_where_ci_includes_zero(tmp_path):
    with Store(tmp_path / "r.db") as store:
        for dh, tied in ((2, [0.30, 0.32, 0.31]), (8, [0.58, 0.61, 0.60])):
            _fill(store, "bind_vs_dhead", "bind",
                  {("standard", "equal"): [0.60, 0.62, 0.58], ("tied_kv", "equal"): tied},
                  metric="accuracy", extra_tags={"d_head": dh})
        data = results.load(store, "smoke")
    gaps = verdicts.bind_gap(data)
    assert [g[0] for g in gaps] == [2, 8]
    assert [g[1]["status"] for g in gaps] == ["worse", "inconclusive"]
    d2 = 100 * (np.array([0.30, 0.32, 0.31]) - np.array([0.60, 0.62, 0.58]))
    assert gaps[0][1]["value"] == pytest.approx(d2.mean())
    assert gaps[0][1]["half"] == pytest.approx(T975_DF2 * d2.std(ddof=1) / np.sqrt(3))
    text = verdicts.verdict_q3(data).details[0]
    assert text.endswith("Tied K=V is significantly worse up to d_head = 2; from d_head = 8 on "
                         "the gap is no longer significant.")


def _bind_text(tmp_path, tied_by_dhead: dict[int, list[float]]) -> tuple[list, str]:
    with Store(tmp_path / "r.db") as store:
        for dh, tied in tied_by_dhead.items():
            _fill(store, "bind_vs_dhead", "bind",
                  {("standard", "equal"): [1.0, 1.0, 1.0], ("tied_kv", "equal"): tied},
                  metric="accuracy", extra_tags={"d_head": dh})
        data = results.load(store, "smoke")
    return verdicts.bind_gap(data), verdicts.verdict_q3(data).details[0]


def test_bind_equal_scores_read_same_and_a_late_gap_does_not_close(tmp_path):
    gaps, text = _bind_text(tmp_path / "a", {1: [0.5, 0.6, 0.55], 2: [1.0, 1.0, 1.0],
                                             4: [1.0, 1.0, 1.0]})
    assert [g[1]["status"] for g in gaps] == ["worse", "same", "same"]
    assert gaps[1][1]["text"] == ("no difference (+0.0 pp ± 0.0 pp accuracy: every seed scores "
                                  "the same for both)")
    assert text.endswith("from d_head = 2 on the gap is no longer significant.")
    # a gap that is significant again at the widest d_head has not closed
    (tmp_path / "b").mkdir()
    gaps, text = _bind_text(tmp_path / "b", {1: [0.5, 0.6, 0.55], 2: [1.0, 0.9, 1.0],
                                             4: [0.7, 0.75, 0.72]})
    assert [g[1]["status"] for g in gaps] == ["worse", "inconclusive", "worse"]
    assert text.endswith("The gap does not close up to d_head = 4.")


def test_bad_input_gives_clear_errors():
    with pytest.raises(ValueError, match="profile: 'nope' is not one of"):
        study.StudyConfig(profile="nope")
    with pytest.raises(ValueError, match="workers: 0 must be a positive integer"):
        study.StudyConfig(profile="smoke", workers=0)
    with pytest.raises(ValueError, match="pretrained: 'gpt5' is not one of"):
        study.StudyConfig(profile="smoke", pretrained=("gpt5",))


def test_comparison_between_two_guessers_is_not_a_verdict():
    """Accuracy differences where neither design beats chance read as 'not learned'."""
    from qkvlab.data import get_task

    relation = get_task("relation", vocab=16, n_context=16, n_queries=8)
    assert relation.chance == 1 / 16
    row = {"metric": "accuracy", "diff": -0.007, "diff_half": 0.005, "rel_pct": -11.0,
           "rel_half": 8.0, "n_pairs": 3, "mean": 0.055, "baseline_mean": 0.062}
    guessed = verdicts.effect(row, lower_is_better=False, chance=relation.chance)
    assert guessed["status"] == "not_learned" and guessed.get("at_chance") is True
    assert verdicts.WORDS[guessed["status"]] == "not learned"
    assert "chance 6.2%" in guessed["text"] and "not learned" in guessed["text"]
    learned = verdicts.effect({**row, "mean": 0.5, "baseline_mean": 0.6}, lower_is_better=False,
                              chance=relation.chance)
    assert learned["status"] == "worse" and not learned.get("at_chance")
