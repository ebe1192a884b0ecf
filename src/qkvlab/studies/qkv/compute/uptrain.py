"""The controlled conversion as the study reads it (``plan.uptrain`` decided how, before the
runs): per fraction of pretraining, each start against the untied model trained on the same way
and against K = V trained from scratch for the same total steps, paired by seed, on the test
split, in % perplexity per token with lm's margin; each family Holm-corrected; gated on lm's
attention-free control (lm_tied_kv's).

``comparisons(data)`` returns one row per (family, fraction, start) with ``stats.compare``'s
fields, ``metric`` "val_loss" and the multiplicity and control columns ``effects.effect``
reads, plus two reference rows per fraction outside any family: K = V from scratch against
standard from scratch (the tie's from-scratch cost at P + u steps) and the untied model trained
on against standard from scratch (what continuing a trained model costs by itself).

``start_gaps(data)``: where each start begins, before any uptraining: its loss on the first
training batch (the same batch for every arm of a seed) against the untied model's, paired
by seed, in % perplexity per token with a 95% t interval. Descriptive, one batch a seed.

``steps_saved(data)``: per other start, the uptraining steps the fitted start needed to reach
the gap to the untied model that the other start ends at (its largest fraction), read in nats
and log-linear in steps between measured fractions, never extrapolated
(``convert.tokens_to_reach``), and the ratio of the two step counts: what a good start
saves, read off measured points only.
"""

from __future__ import annotations

import math

import pandas as pd

from qkvlab.stats import compare_frame, holm, paired
from qkvlab.studies.qkv.compute.convert import tokens_to_reach
from qkvlab.studies.qkv.compute.effects import attention_used, effect
from qkvlab.studies.qkv.compute.results import StudyData, scored_on_test, unscored
from qkvlab.studies.qkv.plan.uptrain import (
    KV_SCRATCH,
    STANDARD_SCRATCH,
    UNTIED,
    UPTRAIN_STARTS,
    uptrain_steps,
)
from qkvlab.studies.qkv.plan.vocab import CONTROL, reported

EXPERIMENT = "lm_convert"
METRIC = "val_loss"
# family -> the baseline every start is compared with
VS_UNTIED, VS_SCRATCH = "Q3 conversion vs untied", "Q3 conversion vs K=V from scratch"
FAMILIES = {VS_UNTIED: UNTIED, VS_SCRATCH: KV_SCRATCH}
REFERENCES = ((KV_SCRATCH, STANDARD_SCRATCH), (UNTIED, STANDARD_SCRATCH))  # (design, baseline)


def _pairs(runs: pd.DataFrame, designs, baseline: str) -> pd.DataFrame:
    col = reported(METRIC)
    sub = runs[runs.design.isin([*designs, baseline])]
    if sub.empty or col not in sub:
        return pd.DataFrame()
    c = compare_frame(unscored(sub, col), col, ["task", "fraction"], baseline=baseline,
                      lower_is_better=True)
    return c[c.design != baseline].assign(baseline=baseline, metric=METRIC,
                                          experiment=EXPERIMENT)


def _gate(data: StudyData) -> dict:
    """lm's control row (equal width, val loss): ``attention_used`` and the control's effect."""
    rows = data.compared("lm_tied_kv", task="lm", design=CONTROL, arm="equal", metric=METRIC)
    if rows.empty:
        return {}
    r = rows.iloc[0].to_dict()
    used, e = attention_used(r), effect(r)
    if used is None:
        return {}
    return {"attention_used": float(used), "control_value": e.value,
            "control_half": e.half if e.half is not None else float("nan")}


def comparisons(data: StudyData) -> pd.DataFrame:
    """The conversion's comparison rows (see the module); computed once per ``data``."""
    if "uptrain" in data.derived:
        return data.derived["uptrain"]
    runs = data.runs
    runs = runs[runs.experiment == EXPERIMENT] if "experiment" in runs else runs.iloc[0:0]
    parts = []
    if not runs.empty:
        runs = scored_on_test(runs)
        for fam, base in FAMILIES.items():
            c = _pairs(runs, UPTRAIN_STARTS, base)
            if not c.empty:
                parts.append(c.assign(family=fam))
        for design, base in REFERENCES:
            c = _pairs(runs, (design,), base)
            if not c.empty:
                parts.append(c.assign(family=None))
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if not df.empty:
        gate = _gate(data)
        for k in ("attention_used", "control_value", "control_half"):
            df[k] = gate.get(k, float("nan"))
        df["family_m"], df["p_decided"], df["p_adj"] = float("nan"), float("nan"), float("nan")
        for fam in FAMILIES:
            idx = df.index[df.family == fam]
            ps = [float("nan") if (q := effect(df.loc[i].to_dict()).p) is None else q
                  for i in idx]  # one seed: no p, so no place in the correction
            df.loc[idx, "p_decided"] = ps
            df.loc[idx, "p_adj"] = holm(ps)
            df.loc[idx, "family_m"] = len(idx)
    data.derived["uptrain"] = df
    return df


def start_gaps(data: StudyData) -> pd.DataFrame:
    """``design, n, value, lo, hi``: each start's loss on the first training batch against the
    untied model's, per seed, as % perplexity per token (see the module)."""
    cols = ["design", "n", "value", "lo", "hi"]
    runs, starts = data.runs, data.starts
    if starts.empty or "experiment" not in runs:
        return pd.DataFrame(columns=cols)
    df = runs[runs.experiment == EXPERIMENT].merge(starts, on="run_id")
    if df.empty:
        return pd.DataFrame(columns=cols)
    df = df[df.fraction == df.fraction.max()]  # the start is the same at every fraction
    base = df[df.design == UNTIED].set_index("seed").start_loss
    out = []
    for design in UPTRAIN_STARTS:
        mine = df[df.design == design].set_index("seed").start_loss
        seeds = sorted(set(mine.index) & set(base.index))
        if not seeds:
            continue
        d = paired([mine[s] for s in seeds], [base[s] for s in seeds])
        out.append({"design": design, "n": d["n_pairs"],
                    "value": 100 * math.expm1(d["diff"]),
                    "lo": 100 * math.expm1(d["diff_lo"]), "hi": 100 * math.expm1(d["diff_hi"])})
    return pd.DataFrame(out, columns=cols)



def steps_saved(data: StudyData) -> pd.DataFrame:
    """``other, target, steps_other, steps_fitted, at_first, ratio`` (see the module); empty
    where a start has no curve. ``at_first``: the fitted start was already at or below the
    target at the first measured fraction, so ``steps_fitted`` is an upper bound."""
    cols = ["other", "target", "steps_other", "steps_fitted", "at_first", "ratio"]
    df = comparisons(data)
    if df.empty:
        return pd.DataFrame(columns=cols)
    vs = df[df.family == VS_UNTIED]
    curve = {d: pd.DataFrame({"tokens": [uptrain_steps(data.profile, f) for f in g.fraction],
                              "gap": [effect(r).value for r in g.to_dict("records")]})
             for d, g in vs.groupby("design")}
    if "fitted" not in curve or curve["fitted"].gap.isna().any() or len(curve["fitted"]) < 2:
        return pd.DataFrame(columns=cols)  # one fraction is no curve to read steps off
    mine = curve["fitted"].sort_values("tokens")
    out = []
    for other in UPTRAIN_STARTS[1:]:
        c = curve.get(other)
        if c is None or c.gap.isna().any():
            continue
        last = c.sort_values("tokens").iloc[-1]
        need = tokens_to_reach(mine, float(last.gap), per=100.0)  # % gaps
        first = need is not None and need == float(mine.tokens.iloc[0]) \
            and mine.gap.iloc[0] <= last.gap
        out.append({"other": other, "target": float(last.gap), "steps_other": int(last.tokens),
                    "steps_fitted": need, "at_first": bool(first),
                    "ratio": last.tokens / need if need else float("nan")})
    return pd.DataFrame(out, columns=cols)
