"""K = V's head-width axis as the study reads it (``plan.headwidth`` decided how, before the
runs): per (d_model, n_heads) cell, each design against standard, paired by seed, on the test
split, in % perplexity per token with lm's margin; the family of every design × cell
Holm-corrected; each cell gated on its own attention-free control.

``comparisons(data)``: one row per (cell, design) with ``stats.compare``'s fields, ``metric``
"val_loss", the control's gate (``attention_used``, ``control_value``, ``control_half``), the
family columns ``effects.effect`` reads, and ``share``/``share_lo``/``share_hi``: the share
of attention's benefit the design gives up there (``plan.share``'s measure).

``trend(data)``: K = V's cost against d_head at the profile's width (``plan.headwidth``'s
rule): the per-seed slope of its log-perplexity gap on log2(d_head), its mean and 95% t
interval in % per doubling, and its reading.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from qkvlab.stats import compare_frame, holm, mean_ci
from qkvlab.studies.qkv.compute.effects import attention_used, effect
from qkvlab.studies.qkv.compute.results import StudyData, chance, scored_on_test, unscored
from qkvlab.studies.qkv.compute.share import seed_values
from qkvlab.studies.qkv.plan.headwidth import FLAT_PER_DOUBLING, TREND
from qkvlab.studies.qkv.plan.vocab import CONTROL, reported

EXPERIMENT = "head_width"
METRIC = "val_loss"
FAMILY = "Q3 head width"
CELL = ["task", "d_model", "n_heads", "d_head"]


def _runs(data: StudyData) -> pd.DataFrame:
    runs = data.runs
    if "experiment" not in runs or "n_heads" not in runs:
        return runs.iloc[0:0]
    runs = runs[runs.experiment == EXPERIMENT]
    return scored_on_test(runs) if not runs.empty else runs


def _cell_runs(runs: pd.DataFrame, r: dict) -> pd.DataFrame:
    return runs[(runs.d_model == r["d_model"]) & (runs.n_heads == r["n_heads"])]


def comparisons(data: StudyData) -> pd.DataFrame:
    """The head-width rows (see the module); computed once per ``data``."""
    if "head_width" in data.derived:
        return data.derived["head_width"]
    runs, col = _runs(data), reported(METRIC)
    df = pd.DataFrame()
    if not runs.empty and col in runs:
        level = chance("lm", data.profile)  # a lost run: as results.comparisons enters it
        df = compare_frame(unscored(runs, col), col, CELL, lower_is_better=True,
                           failed=lambda tags: level)
        df = df[df.design != "standard"].assign(metric=METRIC, experiment=EXPERIMENT)
    if df.empty:
        data.derived["head_width"] = df
        return df
    df = df.reset_index(drop=True)
    for k in ("attention_used", "control_value", "control_half", "share", "share_lo",
              "share_hi"):
        df[k] = float("nan")
    for i, r in df.iterrows():
        ctl = df[(df.design == CONTROL) & (df.d_model == r.d_model) & (df.n_heads == r.n_heads)]
        if r.design == CONTROL or ctl.empty or attention_used(ctl.iloc[0].to_dict()) is None:
            continue
        c = ctl.iloc[0].to_dict()
        e = effect(c)
        df.loc[i, ["attention_used", "control_value", "control_half"]] = [
            float(attention_used(c)), e.value, e.half if e.half is not None else float("nan")]
        s = _share(_cell_runs(runs, r), r.to_dict(), c, col)
        df.loc[i, ["share", "share_lo", "share_hi"]] = [s["mean"], s["lo"], s["hi"]]
    df["family"] = None
    df["family_m"], df["p_decided"], df["p_adj"] = float("nan"), float("nan"), float("nan")
    idx = [i for i in df.index[df.design != CONTROL] if math.isfinite(_p(df.loc[i]))]
    if idx:
        ps = [_p(df.loc[i]) for i in idx]
        df.loc[idx, "family"] = FAMILY
        df.loc[idx, "family_m"] = len(idx)
        df.loc[idx, "p_decided"] = ps
        df.loc[idx, "p_adj"] = holm(ps)
    df = df.sort_values(["d_model", "d_head", "design"], kind="stable").reset_index(drop=True)
    data.derived["head_width"] = df
    return df


def _p(row) -> float:
    p = effect(row.to_dict()).p
    return float("nan") if p is None else float(p)


def _share(runs: pd.DataFrame, r: dict, ctl: dict, col: str) -> dict:
    """The share of attention's benefit the design gives up in its cell (``plan.share``):
    per seed (design − standard)/(control − standard), lost runs as their comparison enters
    them."""
    v = {d: seed_values(runs[runs.design == d], col, lost)
         for d, lost in ((r["design"], r.get("lost_value")), ("standard", r.get("lost_value")),
                         (CONTROL, ctl.get("lost_value")))}
    seeds = sorted(set(v[r["design"]]) & set(v["standard"]) & set(v[CONTROL]))
    ratios = [(v[r["design"]][s] - v["standard"][s]) / (v[CONTROL][s] - v["standard"][s])
              for s in seeds if v[CONTROL][s] != v["standard"][s]]
    return mean_ci(ratios, 0.95)


def trend(data: StudyData) -> dict:
    """K = V's gap against d_head at the profile's width: ``n`` seeds, ``slope`` (% perplexity
    per doubling of d_head: 100·(exp(b) − 1) of the mean per-seed OLS slope b of the log gap on
    log2 d_head), ``lo``/``hi`` (its 95% t interval, likewise), ``d_heads`` (the cells read),
    ``reading`` ("falls", "grows", "flat", "undecided"; "attention_unused" where a cell's
    standard does not beat its control); empty without two cells."""
    runs, col = _runs(data), reported(METRIC)
    cmp = comparisons(data)
    if runs.empty or cmp.empty:
        return {}
    width = data.profile.d_model
    rows = cmp[(cmp.design == TREND) & (cmp.d_model == width)]
    if len(rows) < 2:
        return {}
    gaps: dict[int, dict[int, float]] = {}
    for r in rows.to_dict("records"):
        g = _cell_runs(runs, r)
        mine = seed_values(g[g.design == TREND], col, r.get("lost_value"))
        base = seed_values(g[g.design == "standard"], col, r.get("lost_value"))
        for s in set(mine) & set(base):
            gaps.setdefault(s, {})[int(r["d_head"])] = mine[s] - base[s]
    d_heads = sorted(int(d) for d in rows.d_head)
    x = np.log2(d_heads)
    slopes = [float(np.polyfit(x, [g[d] for d in d_heads], 1)[0])
              for g in gaps.values() if set(g) >= set(d_heads)]
    ci = mean_ci(slopes, 0.95)
    pct = {k: 100 * math.expm1(ci[k]) if math.isfinite(ci[k]) else float("nan")
           for k in ("mean", "lo", "hi")}
    used = bool((rows.attention_used == 1).all())  # read only where every cell uses attention
    return {"n": ci["n"], "slope": pct["mean"], "lo": pct["lo"], "hi": pct["hi"],
            "d_heads": d_heads, "d_model": width, "attention_used": used,
            "reading": reading(pct["lo"], pct["hi"]) if used else "attention_unused"}


def reading(lo: float, hi: float) -> str:
    """``plan.headwidth``'s rule on a slope's interval in % per doubling."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "undecided"
    if hi < 0:
        return "falls"
    if lo > 0:
        return "grows"
    if -FLAT_PER_DOUBLING <= lo and hi <= FLAT_PER_DOUBLING:
        return "flat"
    return "undecided"
