"""The attention-free control: the rule that gates every verdict on it, how it composes with
Holm and reads in words, and that adding it left every existing run id as it was.

Expected values are computed here independently (numpy, scipy's t quantiles) and compared
two-sided.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from conftest import scored
from qkvlab.experiments.registry import EXPERIMENTS, get_profile, run_id
from qkvlab.experiments.store import Store, canonical
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.compute.effects import Status, attention_used, effect
from qkvlab.studies.qkv.compute.multiplicity import correct
from qkvlab.studies.qkv.compute.results import mark_control
from qkvlab.studies.qkv.plan import rates
from qkvlab.studies.qkv.plan.experiments import ORDER
from qkvlab.studies.qkv.plan.scaling import EXPERIMENTS as SCALING
from qkvlab.studies.qkv.plan.vocab import CONTROL
from qkvlab.studies.qkv.render.tables import compare_table
from qkvlab.studies.qkv.render.text import WORDS, cell, said
from qkvlab.studies.qkv.plan.profiles import TASK_TRAIN, QKVProfile, Rates
from qkvlab.studies.qkv.plan.questions import tuned_designs

MARGIN = np.log1p(0.02)  # val_loss: ±2% perplexity


def _row(diffs, metric="val_loss", **tags) -> dict:
    d = np.asarray(diffs, dtype=float)
    sd = d.std(ddof=1) if len(d) > 1 else float("nan")
    return {"metric": metric, "diff": d.mean(), "diff_sd": sd, "n_pairs": len(d),
            "rel_pct": 0.0, "rel_sd": 1.0, **tags}


def _ci(diffs) -> tuple[float, float]:
    d = np.asarray(diffs, dtype=float)
    h = st.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return d.mean() - h, d.mean() + h


FAR = [0.50, 0.55, 0.52]  # the control far worse than standard (≈ +68% perplexity)
NEAR = [0.01, 0.00, 0.02]  # the control within the margin of standard
STRADDLE = [0.01, 0.05, 0.03]  # the control's CI starts inside the margin, ends past it


def test_attention_used_is_the_controls_ci_wholly_past_the_margin():
    for diffs in (FAR, NEAR, STRADDLE):
        assert attention_used(_row(diffs)) == bool(_ci(diffs)[0] > MARGIN), diffs
    assert _ci(STRADDLE)[0] < MARGIN < _ci(STRADDLE)[1]  # the straddling case is one
    # accuracy: higher is better, the control must be worse by more than 2 points
    assert attention_used(_row([-0.30, -0.32, -0.31], "accuracy")) is True
    assert attention_used(_row([-0.01, -0.03, -0.02], "accuracy")) is False
    assert attention_used(_row([0.6])) is False  # one seed: no CI, so not shown used
    assert attention_used(None) is None and attention_used({"metric": "val_loss"}) is None


def _frame(control_diffs, experiment="lm_tied_kv") -> pd.DataFrame:
    """Comparison rows as ``results.comparisons`` makes them: standard, tied K=V in both arms
    on val loss and throughput, and (unless None) the control at equal width."""
    tied = [0.20, 0.21, 0.25]  # tied K=V clearly worse than standard by its own test
    rows = [_row([0, 0, 0], design="standard", arm=a) for a in ("equal", "matched")]
    rows += [_row(tied, design="tied_kv", arm=a) for a in ("equal", "matched")]
    rows.append(_row([0.0, 0.1, -0.1], "tokens_per_s", design="tied_kv", arm="equal"))
    if control_diffs is not None:
        rows.append(_row(control_diffs, design=CONTROL, arm="equal"))
        rows.append(_row([0.0, 0.1, -0.1], "tokens_per_s", design=CONTROL, arm="equal"))
    return pd.DataFrame([{**r, "experiment": experiment, "task": "lm"} for r in rows])


def _effects(df: pd.DataFrame) -> dict[tuple[str, str, str], object]:
    return {(r["design"], r["arm"], r["metric"]): effect(r) for r in df.to_dict("records")}


def test_a_verdict_is_decided_only_where_standard_beats_the_control():
    used = _effects(mark_control(_frame(FAR)))
    for arm in ("equal", "matched"):
        e = used[("tied_kv", arm, "val_loss")]
        assert (e.status, e.raw_status) == (Status.WORSE, None)
        lo, hi = _ci(FAR)
        assert e.control_value == pytest.approx(100 * np.expm1(np.mean(FAR)))
        assert e.control_half == pytest.approx(100 * (np.expm1(hi) - np.expm1(lo)) / 2)
    for diffs in (NEAR, STRADDLE):
        unused = _effects(mark_control(_frame(diffs)))
        for arm in ("equal", "matched"):  # one control serves both arms (standard is shared)
            e = unused[("tied_kv", arm, "val_loss")]
            assert (e.status, e.raw_status) == (Status.ATTENTION_UNUSED, Status.WORSE)
            assert e.value == pytest.approx(100 * np.expm1(np.mean([0.20, 0.21, 0.25])))
        # throughput is not learned: not gated, and the control has no throughput row; the
        # control's own row is the gate, not gated
        assert unused[("tied_kv", "equal", "tokens_per_s")].status is not Status.ATTENTION_UNUSED
        assert (CONTROL, "equal", "tokens_per_s") not in unused
        assert unused[(CONTROL, "equal", "val_loss")].raw_status is None
    # no control rows (an experiment that trains none, or an old store): verdicts as before
    none = mark_control(_frame(None))
    assert none.attention_used.isna().all()
    assert _effects(none)[("tied_kv", "equal", "val_loss")].status is Status.WORSE
    # a control of another experiment or task does not gate this one's rows
    other = pd.concat([_frame(None), _frame(NEAR, experiment="lm_gqa")], ignore_index=True)
    marked = mark_control(other)
    assert marked[marked.experiment == "lm_tied_kv"].attention_used.isna().all()


def test_attention_unused_stays_in_its_holm_family_and_reads_in_words():
    df = correct(mark_control(_frame(NEAR)))
    fam = df[df.family == "Q3"]
    assert sorted(fam.arm) == ["equal", "matched"] and set(fam.family_m) == {2}
    e = effect(fam[fam.arm == "equal"].iloc[0].to_dict())
    p = st.ttest_1samp([0.20, 0.21, 0.25], 0.0).pvalue  # its own test still decided "worse"
    assert e.p == pytest.approx(p, rel=1e-9) and e.p_adj == pytest.approx(2 * p, rel=1e-9)
    assert e.status is Status.ATTENTION_UNUSED and e.raw_status is Status.WORSE
    assert WORDS[e.status] == "attention not used at this budget"
    ctl = f"{e.control_value:+.1f}% ± {e.control_half:.1f}%"
    assert cell(e) == (f"attention not used at this budget {e.value:+.1f} ± {e.half:.1f}% "
                       f"(control {ctl} vs standard; own test: worse)")
    assert said(e) == (f"{e.value:+.1f}% ± {e.half:.1f}% perplexity (attention not used at this "
                       f"budget: standard does not beat the attention-free control by more than "
                       f"the margin: the control vs standard is {ctl} perplexity; no verdict; its "
                       f"own test would read worse at p {p:.2g})")


def test_another_metric_quotes_the_control_on_the_tasks_own_metric():
    """chrF on translate is gated by the control's loss per target token (translate's own
    metric, target_loss), and says so in its unit."""
    df = pd.DataFrame([{**_row([0.0, 0.0, 0.0], "target_loss"), "design": "standard"},
                       {**_row(NEAR, "target_loss"), "design": CONTROL},
                       {**_row([1.0, 2.0, 1.5], "chrf"), "design": "alt"}]
                      ).assign(experiment="alt_vs_standard", task="translate", arm="equal")
    e = effect(mark_control(df).iloc[2].to_dict())
    assert (e.status, e.raw_status, e.unit) == (Status.ATTENTION_UNUSED, Status.BETTER, " points")
    assert (e.control_unit, e.control_what) == ("%", "perplexity")
    assert f"control vs standard is {e.control_value:+.1f}% ± " in said(e)


def test_the_control_has_its_row_in_the_comparison_table():
    df = correct(mark_control(_frame(NEAR)))
    table = compare_table(df.assign(n=3, mean=2.0, half=0.1), "lm", ("val_loss",))
    row = next(r for r in table.rows if r[2] == "no attention (uniform)")
    assert row[-2] == said(effect(df[df.design == CONTROL].iloc[0].to_dict()))
    assert "(undecided" in row[-2]  # the control vs standard, with its own verdict


def _listed(profile: str | QKVProfile) -> list[str]:
    """``"experiment run_id tags"`` of every run the study lists at a profile (a name or the
    profile), the control's, ``NEW_DESIGNS``', ``NEW_SEEDS``' and the scaling experiments'
    (added later, ``plan.scaling``) left out (standard's rates, which need lr_tune's results,
    faked at the task's rate)."""
    p = get_profile(profile) if isinstance(profile, str) else profile
    profile = p.name
    if p.lr_grid:
        p = dataclasses.replace(p, rates=Rates(lrs={(t, d, a): rates.lr_of(t, 1.0, p)
                                                    for t, labels in tuned_designs().items()
                                                    for d in ("standard", *labels)
                                                    for a in ("equal", "matched")}))
    return sorted(f"{name} {run_id(s.to_dict() if hasattr(s, 'to_dict') else dict(s))} "
                  f"{canonical(dict(t))}"
                  for name in ORDER if name not in NEW and name not in SCALING
                  for s, t in EXPERIMENTS[name](p)
                  if t.get("design") not in (CONTROL, *NEW_DESIGNS)
                  and t.get("seed") not in NEW_SEEDS.get((profile, name), ()))


# experiments added since, every run of them new (Q1's scale in training)
NEW = ("scale_tune", "scale_tune_edge", "scale_train", "lr_tune_edge", "uptrain_tune",
       "uptrain_tune_edge", "lm_convert", "head_width_tune", "head_width_tune_edge", "head_width")
# designs added since, each a new row of its question: their runs are new, the others' kept
NEW_DESIGNS = ("tied_qkv_selfmask",)
# seeds added since (quick's width price: 2 -> 4 seeds), every run of them new
NEW_SEEDS = {("quick", "bind_vs_dhead"): (2, 3)}


# sha256 of _listed(profile) and its length: first pinned before the control was added
# (commit 1852a1f: smoke 89, quick 175, standard 770 runs). Re-pinned on purpose when every run
# gained TrainConfig.test_batches (scored on the held-out test split; a run id hashes the whole
# train config, so every id changed), when the headline lm moved to byte-level BPE (its task
# options name the tokenizer) and the character-level lm_char row was added (new runs: its
# comparisons, its tuning, and symmetry_emergence's decoder moved from lm to lm_char).
BEFORE = {"smoke": (97, "09c191e8000b7316"), "quick": (199, "1ed532edfb44b69d"),
          "standard": (804, "863d54e489a56e53")}


# quick before it was cut to 15 minutes (issue 39): 3 seeds everywhere, lm and lm_char at the
# profile's 200 steps, translate and mlm run, the scale probe at five widths; the pin above is
# of that profile
QUICK_BEFORE = dict(seeds=(0, 1, 2), task_seeds={"mqar": ()}, scale_train_seeds=(0, 1, 2),
                    task_train={k: v for k, v in TASK_TRAIN["quick"].items()
                                if k not in ("lm", "lm_char")},
                    probe_d_heads=(16, 32, 64, 128, 256))
# the rows quick runs as a smoke test since (standard does not beat the control there)
QUICK_SMOKE = ("lm", "lm_char", "translate", "mlm")


# standard before it was resized to its 3 hours (2026-11-29): translate ran, lm_char on all 8
# seeds, the rate grid reached 9 x each task's rate; the pin above is of that profile
STANDARD_BEFORE = dict(task_seeds={"mqar": (), "relation": (0, 1, 2),
                                   "successor": tuple(range(4)),
                                   "successor_causal": tuple(range(4))},
                       lr_grid=(1 / 3, 1.0, 3.0, 9.0))


def _digest(lines: list[str]) -> tuple[int, str]:
    return len(lines), hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


@pytest.mark.parametrize("profile", list(BEFORE))
def test_adding_the_control_changed_no_existing_run_id(profile):
    p = get_profile(profile)
    if profile == "quick":
        p = dataclasses.replace(p, **QUICK_BEFORE)
    if profile == "standard":
        p = dataclasses.replace(p, **STANDARD_BEFORE)
    assert _digest(_listed(p)) == BEFORE[profile]


def test_resizing_standard_kept_every_run_it_still_lists():
    """standard lost translate, two of lm_char's seeds and the rate grid's 9 x point
    (2026-11-29): every run it still lists is one it listed before, and what it dropped is
    only those (a tuning run at 9 x is the point past the edge now, listed where a choice sits
    at 3 x)."""
    p = get_profile("standard")
    now = set(_listed(p))
    before = set(_listed(dataclasses.replace(p, **STANDARD_BEFORE)))
    assert now < before
    dropped = [json.loads(line.split(" ", 2)[2]) for line in before - now]
    nine = {rates.lr_of(t, 9.0, p) for t in ("lm", "lm_char", "mlm")}
    assert all(t["task"] == "translate" or (t["task"] == "lm_char" and t["seed"] in (6, 7))
               or (t["seed"] in p.lr_seeds and t["lr"] in nine) for t in dropped)
    assert any(t["seed"] in p.lr_seeds for t in dropped)


def test_cutting_quick_to_15_minutes_kept_every_run_of_the_tasks_it_decides():
    """quick's lm and lm_char rows went to 2 seeds and 100 steps, translate and mlm left it,
    the scale probe kept three of its five widths; every run of its other tasks keeps its id,
    bit for bit."""
    now, before = _listed("quick"), _listed(dataclasses.replace(get_profile("quick"),
                                                                  **QUICK_BEFORE))

    def tags(line: str) -> dict:
        return json.loads(line.split(" ", 2)[2])

    def kept(lines: list[str]) -> list[str]:
        return [x for x in lines if tags(x)["task"] not in QUICK_SMOKE
                and not x.startswith("scale_probe ")]
    assert kept(before) and kept(now) == kept(before)
    probe = {x for x in now if x.startswith("scale_probe ")}
    assert probe and probe <= set(before)  # the probe's remaining widths: the same runs
    smoke = [tags(x) for x in now if tags(x)["task"] in QUICK_SMOKE]
    # translate left; mlm stays only as symmetry_emergence's encoder, not a comparison
    assert {t["task"] for t in smoke} == {"lm", "lm_char", "mlm"}
    assert {x.split(" ", 1)[0] for x in now if tags(x)["task"] == "mlm"} == {
        "symmetry_emergence"}
    assert {t["seed"] for t in smoke} == {0, 1}


def test_every_comparison_experiment_trains_the_control_on_its_seeds():
    p = get_profile("quick")
    for name in ("alt_vs_standard", "alt_init", "lm_tied_kv", "lm_gqa", "tied_qk_qkv",
                 "directed_relation", "kv_translate", "bind_vs_dhead"):
        runs = EXPERIMENTS[name](p)
        std = {(t["task"], t["seed"], t.get("m"), t.get("d_head")) for _, t in runs
               if t["design"] == "standard" and t["arm"] == "equal"
               and t.get("d_head") == t.get("m")}
        ctl = {(t["task"], t["seed"], t.get("m"), t.get("d_head")) for _, t in runs
               if t["design"] == CONTROL}
        assert ctl == std, name
        assert all(t["arm"] == "equal" for _, t in runs if t["design"] == CONTROL)


def test_an_unused_attention_reads_so_from_the_store(tmp_path):
    """End to end through the real store: the control as good as standard on lm."""
    std, tied, ctl = [2.00, 2.10, 2.20], [2.20, 2.30, 2.45], [2.01, 2.10, 2.22]
    with Store(tmp_path / "r.db") as store:
        for design, vals in (("standard", std), ("tied_kv", tied), (CONTROL, ctl)):
            for seed, v in enumerate(vals):
                spec = {"task": "lm", "model": {"design": design}, "seed": seed}
                tags = {"task": "lm", "design": design, "arm": "equal", "seed": seed}
                (rid,) = store.add("lm_tied_kv", "smoke", [(spec, tags)])
                store.claim(rid)
                store.finish(rid, "done", 10, scored({"val_loss": v}), {"n_params": 1000})
        data = results.load(store, "smoke")
    row = data.compared("lm_tied_kv", design="tied_kv", metric="val_loss").iloc[0].to_dict()
    e = effect(row, chance=results.row_chance(row, data.profile))
    assert (e.status, e.raw_status) == (Status.ATTENTION_UNUSED, Status.WORSE)
