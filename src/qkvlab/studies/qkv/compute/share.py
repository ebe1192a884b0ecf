"""What share of attention's benefit each design gives up (``plan.share``: the measure and the
rule that reads it, fixed before the runs), per comparison at equal width on the task's own
metric, from the same per-seed values its comparison row rests on."""

from __future__ import annotations

import math

import pandas as pd

from qkvlab.stats import LOST, mean_ci
from qkvlab.studies.qkv.compute.effects import effect
from qkvlab.studies.qkv.compute.results import StudyData, scored_on_test
from qkvlab.studies.qkv.plan.share import LEVEL, reading
from qkvlab.studies.qkv.plan.vocab import CONTROL, TASK_METRIC, reported

COLUMNS = ["experiment", "design", "task", "m", "d_head", "d_model", "n", "share", "lo", "hi",
           "reading", "attention_used", "value", "half", "control_value", "control_half", "unit",
           "digits"]
GROUP = ("m", "d_head", "d_model")  # the tags that tell one comparison's runs apart


def seed_values(runs: pd.DataFrame, col: str, lost_value: float | None) -> dict:
    """``{seed: value}``: finished runs' finite ``col``, lost runs (and finished ones without a
    finite score, as ``results.unscored`` marks them) at ``lost_value``, as ``stats.compare``
    enters them; a lost run without a ``lost_value`` is left out, as there."""
    out = {}
    for r in runs.itertuples():
        v = pd.to_numeric(getattr(r, col, float("nan")), errors="coerce")
        ok = r.status == "done" and math.isfinite(v)
        if ok:
            out[r.seed] = float(v)
        elif (r.status in LOST or r.status == "done") and lost_value is not None \
                and math.isfinite(lost_value):
            out[r.seed] = float(lost_value)
    return out


def shares(data: StudyData) -> pd.DataFrame:
    """One row per design and comparison that has a control (``COLUMNS``): ``share`` (mean over
    seeds of (design − standard)/(control − standard), 1 = the control's gap), its interval
    ``lo``–``hi``, ``n`` seeds with all three runs, ``reading`` (``plan.share.reading``; NaN
    unless standard beats the control, ``attention_used`` = 1); beside it the raw gaps it
    reads, as the tables show them: the design's (``value`` ± ``half``) and the control's
    (``control_value`` ± ``control_half``) in ``unit``, shown with ``digits`` decimals.
    Computed once per ``data`` (``StudyData.derived``): the table, each question's sentence
    and each card read it."""
    if "shares" not in data.derived:
        data.derived["shares"] = _shares(data)
    return data.derived["shares"]


def _shares(data: StudyData) -> pd.DataFrame:
    cmp, runs = data.comparisons, data.runs
    if cmp.empty or runs.empty or "attention_used" not in cmp:
        return pd.DataFrame(columns=COLUMNS)
    own = cmp[(cmp.metric == cmp.task.map(TASK_METRIC)) & (cmp.arm == "equal")
              & ~cmp.design.isin(["standard", CONTROL]) & cmp.attention_used.notna()]
    runs = scored_on_test(runs[runs.arm == "equal"])
    out = []
    for r in own.to_dict("records"):
        col = reported(r["metric"])
        if col not in runs:
            continue
        g = runs[(runs.experiment == r["experiment"]) & (runs.task == r["task"])]
        for k in GROUP:
            if k in g and k in r:
                g = g[g[k].isna()] if pd.isna(r[k]) else g[g[k] == r[k]]
        lost = r.get("lost_value")
        v = {d: seed_values(g[g.design == d].drop_duplicates("run_id"), col, lost)
             for d in (r["design"], "standard", CONTROL)}
        seeds = sorted(set(v[r["design"]]) & set(v["standard"]) & set(v[CONTROL]))
        ratios = [(v[r["design"]][s] - v["standard"][s]) / (v[CONTROL][s] - v["standard"][s])
                  for s in seeds if v[CONTROL][s] != v["standard"][s]]
        ci = mean_ci(ratios, LEVEL)
        used, e = bool(r["attention_used"]), effect(r)
        out.append({**{k: r.get(k) for k in ("experiment", "design", "task", *GROUP)},
                    "n": ci["n"], "share": ci["mean"], "lo": ci["lo"], "hi": ci["hi"],
                    "reading": reading(ci["lo"], ci["hi"]) if used else float("nan"),
                    "attention_used": float(used), "value": e.value, "half": e.half,
                    "control_value": r.get("control_value"),
                    "control_half": r.get("control_half"), "unit": e.unit,
                    "digits": e.digits})
    return pd.DataFrame(out, columns=COLUMNS)
