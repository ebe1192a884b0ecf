"""The gap against training budget and size (``plan.scaling``'s runs): frames, the decision
rule, the fit and the prediction at the published sizes.

Written down before the runs:

- **The reported loss** of a run is its final loss on the test split (``run_loss``, the one
  place that reads it); rates were chosen on the validation split. A diverged or failed run
  enters by the study's rule (``plan.families``): at the worse of lm's context-free loss
  (``chance``) and the worst loss any finished run of its cell reached (any design, any
  seed); it is counted and shown, never dropped.
- **The gap** of a design in a cell and seed: ``100·(exp(loss − standard's loss) − 1)``, %
  perplexity per token, paired by seed (same seed, same initial weights where shapes agree).
- **The budget rule**: per design, the per-seed difference ``gap at the smallest budget − gap
  at the largest``; its two-sided one-sample t-test p over seeds, Holm-corrected over the
  designs (``ALPHA``). ``shrinks`` when the corrected test rejects 0 and the mean is above 0,
  ``grows`` when below, else ``flat/undecided``.
- **The budget rule on the share** (``share_gaps``, added 2026-11-26 before any scaling store
  was re-run, the raw rule kept beside it): the same rule on each seed's share of attention's
  benefit, ``100·(loss − standard's)/(control's − standard's)`` (``plan.share``: 0% is
  standard, 100% no attention), since a raw gap also moves with what attention is worth at the
  budget. ``shrinks`` then means the tie gives up a smaller share of what attention buys.
- **The size fit**: per design, ordinary least squares of the cell mean gap on
  ``log10(N)`` (N: the standard model's non-embedding parameters), ``gap% = a + b·log10 N``;
  the prediction's interval at N is the fit's 95% t confidence interval for the line there
  (df = cells − 2), which holds the seeds' scatter and the cells' lack of fit. It says how well
  the line is pinned down, not whether the line holds three orders of magnitude away.
- **The prediction** at ``TARGETS`` (300M and 1.2B parameters) is stored as measure
  ``PREDICTION`` by the study before the report is drawn; the comparison with the published
  numbers (``compare_published``) reads only the stored records.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd
from scipy import stats as _st

from qkvlab.stats import holm, mean_ci, t_p
from qkvlab.studies.qkv.compute.results import scored_on_test
from qkvlab.studies.qkv.plan.families import ALPHA
from qkvlab.studies.qkv.plan.references import KAYYAM_1B2_KV_PCT, KAYYAM_300M_PCT
from qkvlab.studies.qkv.plan.scaling import BASELINE, DESIGNS, TASK
from qkvlab.studies.qkv.plan.vocab import CONTROL, METRICS, ppl_pct, reported

__all__ = ["TASK", "run_loss", "losses", "gaps", "share_gaps", "cell_summary", "budget_trend",
           "used_budgets",
           "used_sizes", "fit", "line", "prediction_records", "compare_published"]
RUN_EXPERIMENTS = {"budget": "scaling_budget", "size": "scaling_size"}
PREDICTION = "scaling_prediction"  # the measure the prediction is stored as
TARGETS = (3e8, 1.2e9)
SHRINKS, GROWS, FLAT = "shrinks", "grows", "flat/undecided"
# fewer than two budgets where standard uses attention: the rule has nothing to compare
NOT_USED = "undecided: attention used at fewer than 2 budgets"
LOST = ("diverged", "failed")
# Each design's name in Kayyam et al.'s table, and their published gaps per size
PUBLISHED_NAME = {"gqa_half": "GQA-4", "mqa": "MQA", "tied_kv": "Q–K=V", "tied_qk": "Q=K–V",
                  "tied_qkv": "Q=K=V"}
PUBLISHED = {(d, 3e8): KAYYAM_300M_PCT[n] for d, n in PUBLISHED_NAME.items()}
PUBLISHED[("tied_kv", 1.2e9)] = KAYYAM_1B2_KV_PCT
CELL_COLS = ["cell", "d_model", "n_layers", "steps", "cell_params"]


def run_loss(final: Mapping) -> float | None:
    """A run's reported loss: its final loss on the test split, ``test_val_loss`` (None where
    it has none)."""
    v = final.get(reported("val_loss"))
    return float(v) if v is not None and math.isfinite(float(v)) else None


def losses(runs: pd.DataFrame, chance: float | None = None) -> pd.DataFrame:
    """One row per finished or lost run of the scaling experiments: the ``CELL_COLS``,
    ``design``, ``seed``, ``status``, ``lost`` (bool) and ``loss`` (a lost run at the rule's
    value). A finished run without a test loss is lost too, as in the other comparisons
    (``results.unscored``); a run of an earlier definition, whose spec scores no test batches,
    is not read (``results.scored_on_test``)."""
    cols = [*CELL_COLS, "design", "seed", "status", "lost", "loss"]
    if runs.empty or "experiment" not in runs:
        return pd.DataFrame(columns=cols)
    sel = scored_on_test(runs[runs.experiment.isin(RUN_EXPERIMENTS.values())
                              & runs.status.isin(("done", *LOST))]).drop_duplicates(
        ["experiment", "run_id", "design"])
    rows = []
    for r in sel.to_dict("records"):
        loss = None if r["status"] in LOST else run_loss(r)
        lost = loss is None
        rows.append({**{k: r[k] for k in CELL_COLS}, "design": r["design"],
                     "seed": int(r["seed"]), "status": r["status"], "lost": lost, "loss": loss})
    df = pd.DataFrame(rows, columns=cols)
    for _, g in df.groupby(CELL_COLS[:4]):
        done = g.loss[~g.lost].dropna()
        floor = [v for v in (chance, done.max() if len(done) else None)
                 if v is not None and math.isfinite(v)]
        df.loc[g.index[g.lost], "loss"] = max(floor) if floor else float("nan")
    return df


def gaps(loss: pd.DataFrame) -> pd.DataFrame:
    """Per cell, design (not standard) and seed where both ran: ``gap`` (% perplexity),
    ``lost`` and ``baseline_lost``."""
    cols = [*CELL_COLS, "design", "seed", "gap", "lost", "baseline_lost"]
    if loss.empty:
        return pd.DataFrame(columns=cols)
    keys = [*CELL_COLS[:4], "seed"]
    base = loss[loss.design == BASELINE].set_index(keys)
    out = []
    for r in loss[loss.design != BASELINE].to_dict("records"):
        k = tuple(r[c] for c in keys)
        if k not in base.index or not math.isfinite(r["loss"]):
            continue
        b = base.loc[k]
        out.append({**{c: r[c] for c in CELL_COLS}, "design": r["design"], "seed": r["seed"],
                    "gap": ppl_pct(r["loss"] - float(b["loss"])),
                    "lost": bool(r["lost"]), "baseline_lost": bool(b["lost"])})
    return pd.DataFrame(out, columns=cols)


def share_gaps(loss: pd.DataFrame) -> pd.DataFrame:
    """As :func:`gaps`, with ``gap`` each seed's share of the control's gap in % (``plan.share``:
    (loss − standard's) / (control's − standard's)): per cell, design (neither standard nor the
    control) and seed where all three ran; a seed whose control and standard tie is left out."""
    cols = [*CELL_COLS, "design", "seed", "gap", "lost", "baseline_lost"]
    if loss.empty:
        return pd.DataFrame(columns=cols)
    keys = [*CELL_COLS[:4], "seed"]
    base = loss[loss.design == BASELINE].set_index(keys)
    ctrl = loss[loss.design == CONTROL].set_index(keys)
    out = []
    for r in loss[~loss.design.isin([BASELINE, CONTROL])].to_dict("records"):
        k = tuple(r[c] for c in keys)
        if k not in base.index or k not in ctrl.index or not math.isfinite(r["loss"]):
            continue
        b, c = float(base.loc[k]["loss"]), float(ctrl.loc[k]["loss"])
        if not (math.isfinite(b) and math.isfinite(c)) or c == b:
            continue
        out.append({**{c_: r[c_] for c_ in CELL_COLS}, "design": r["design"], "seed": r["seed"],
                    "gap": 100.0 * (r["loss"] - b) / (c - b), "lost": bool(r["lost"]),
                    "baseline_lost": bool(base.loc[k]["lost"])})
    return pd.DataFrame(out, columns=cols)


def cell_summary(g: pd.DataFrame) -> pd.DataFrame:
    """Per cell and design: seeds ``n``, ``mean`` gap ± ``half`` (95% t CI), ``lost`` and
    ``baseline_lost`` (runs entered by the rule)."""
    cols = [*CELL_COLS, "design", "n", "mean", "half", "lost", "baseline_lost"]
    out = []
    for key, sub in g.groupby([*CELL_COLS, "design"], sort=True):
        ci = mean_ci(sub.gap.tolist())
        out.append({**dict(zip([*CELL_COLS, "design"], key)), "n": ci["n"], "mean": ci["mean"],
                    "half": ci["half"], "lost": int(sub.lost.sum()),
                    "baseline_lost": int(sub.baseline_lost.sum())})
    return pd.DataFrame(out, columns=cols)


def budget_trend(g: pd.DataFrame, used: set[int] | None = None) -> pd.DataFrame:
    """The budget rule per design: ``small``/``large`` (steps), ``diff`` (mean of gap at the
    smallest − gap at the largest, per seed) ± ``half`` (95% CI), ``n``, ``p``, ``p_adj``
    (Holm over the designs) and ``verdict``.

    ``used``: the budgets where standard uses attention (``used_budgets``); the rule then reads
    the smallest and largest of those, since at a budget where the attention-free control is as
    good as standard every design's gap is near zero for want of attention, not because a tie
    costs nothing. With fewer than two such budgets a design gets no test (``NOT_USED``).
    """
    cols = ["design", "small", "large", "n", "diff", "half", "p", "p_adj", "verdict"]
    b = g[g.cell == "budget"] if not g.empty else g
    if used is not None and not b.empty:
        b = b[b.steps.isin(used)]
    rows, unused = [], []
    for design in [d for d in DESIGNS if not g.empty and d in set(g[g.cell == "budget"].design)]:
        sub = b[b.design == design]
        if sub.empty or sub.steps.nunique() < 2:
            if used is not None:
                unused.append(design)
            continue
        small, large = int(sub.steps.min()), int(sub.steps.max())
        s = sub[sub.steps == small].set_index("seed").gap
        lg = sub[sub.steps == large].set_index("seed").gap
        d = [s[k] - lg[k] for k in sorted(set(s.index) & set(lg.index))]
        ci = mean_ci(d)
        rows.append({"design": design, "small": small, "large": large, "n": ci["n"],
                     "diff": ci["mean"], "half": ci["half"], "p": t_p(ci["mean"], ci["sd"],
                                                                        ci["n"])})
    df = pd.DataFrame(rows, columns=cols[:7])
    df["p_adj"] = holm(df.p.tolist()) if len(df) else []
    df["verdict"] = [verdict(r.diff, r.p_adj) for r in df.itertuples()]
    nan = float("nan")
    extra = pd.DataFrame([{"design": d, "small": nan, "large": nan, "n": 0, "diff": nan,
                           "half": nan, "p": nan, "p_adj": nan, "verdict": NOT_USED}
                          for d in unused], columns=cols)
    out = pd.concat([df[cols], extra], ignore_index=True) if len(extra) else df[cols]
    order = {d: i for i, d in enumerate(DESIGNS)}
    return out.sort_values("design", key=lambda c: c.map(order)).reset_index(drop=True)


def used_budgets(summary: pd.DataFrame) -> set[int] | None:
    """The budgets where standard beats the attention-free control by more than the margin
    (``attention_by_budget``); None where no control ran (every budget is read)."""
    a = attention_by_budget(summary)
    return None if a.empty else {int(s) for s, u in zip(a.steps, a.used) if u}


def attention_by_size(summary: pd.DataFrame) -> pd.DataFrame:
    """Per size cell (``d_model``, ``n_layers``, ``cell_params``): the control's gap to
    standard and ``used``, as ``attention_by_budget``."""
    cols = ["d_model", "n_layers", "cell_params", "n", "mean", "half", "used"]
    b = summary[(summary.cell == "size") & (summary.design == CONTROL)] \
        if not summary.empty else summary
    margin = METRICS["val_loss"].margin
    rows = [{"d_model": int(r.d_model), "n_layers": int(r.n_layers),
             "cell_params": int(r.cell_params), "n": int(r.n), "mean": r.mean, "half": r.half,
             "used": bool(math.isfinite(r.half) and r.mean - r.half > margin)}
            for r in b.sort_values("cell_params").itertuples()]
    return pd.DataFrame(rows, columns=cols)


def used_sizes(summary: pd.DataFrame) -> set[tuple[int, int]] | None:
    """The (d_model, n_layers) size cells where standard uses attention; None where no
    control ran there (every size is read)."""
    a = attention_by_size(summary)
    return None if a.empty else {(int(w), int(d)) for w, d, u in
                                 zip(a.d_model, a.n_layers, a.used) if u}


def attention_by_budget(summary: pd.DataFrame) -> pd.DataFrame:
    """Per budget: the control's gap to standard (``mean`` ± ``half``, % perplexity) and
    ``used``: its 95% CI lies wholly above the val-loss margin (``vocab.METRICS``), the gate
    the study's comparisons use (``effects.attention_used``); False with fewer than 2 seeds."""
    cols = ["steps", "n", "mean", "half", "used"]
    b = summary[(summary.cell == "budget") & (summary.design == CONTROL)] \
        if not summary.empty else summary
    margin = METRICS["val_loss"].margin
    rows = [{"steps": int(r.steps), "n": int(r.n), "mean": r.mean, "half": r.half,
             "used": bool(math.isfinite(r.half) and r.mean - r.half > margin)}
            for r in b.sort_values("steps").itertuples()]
    return pd.DataFrame(rows, columns=cols)


def verdict(diff: float, p_adj: float) -> str:
    if not (math.isfinite(p_adj) and p_adj <= ALPHA):
        return FLAT
    return SHRINKS if diff > 0 else GROWS if diff < 0 else FLAT


def fit(summary: pd.DataFrame, used: set[tuple[int, int]] | None = None) -> pd.DataFrame:
    """Per design, ``gap% = a + b·log10 N`` by least squares over the size cells' mean gaps:
    ``a``, ``b``, ``s`` (residual sd), ``k`` (cells), ``xbar``, ``sxx`` and ``n_min``/``n_max``
    (the parameters spanned). ``used``: the (d_model, n_layers) cells where standard uses
    attention (``used_sizes``), the only ones read when given. A design with fewer than 2
    sizes has no fit."""
    cols = ["design", "a", "b", "s", "k", "xbar", "sxx", "n_min", "n_max"]
    s = summary[summary.cell == "size"] if not summary.empty else summary
    if used is not None and not s.empty:
        s = s[[(int(w), int(d)) in used for w, d in zip(s.d_model, s.n_layers)]]
    rows = []
    for design in [d for d in DESIGNS if not s.empty and d in set(s.design)]:
        sub = s[(s.design == design) & s["mean"].map(math.isfinite)]
        x = [math.log10(float(n)) for n in sub.cell_params]
        y = [float(v) for v in sub["mean"]]
        k = len(x)
        if k < 2 or len(set(x)) < 2:
            continue
        xbar, ybar = sum(x) / k, sum(y) / k
        sxx = sum((xi - xbar) ** 2 for xi in x)
        b = sum((xi - xbar) * (yi - ybar) for xi, yi in zip(x, y)) / sxx
        a = ybar - b * xbar
        sse = sum((yi - a - b * xi) ** 2 for xi, yi in zip(x, y))
        rows.append({"design": design, "a": a, "b": b,
                     "s": math.sqrt(sse / (k - 2)) if k > 2 else float("nan"), "k": k,
                     "xbar": xbar, "sxx": sxx, "n_min": float(min(sub.cell_params)),
                     "n_max": float(max(sub.cell_params))})
    return pd.DataFrame(rows, columns=cols)


def line(f: Mapping, n_params: float, level: float = 0.95) -> tuple[float, float]:
    """The fitted gap at ``n_params`` and half its ``level`` confidence interval (NaN with 2
    cells: no residual to estimate it from)."""
    x = math.log10(n_params)
    value = _f(f["a"]) + _f(f["b"]) * x
    s, k = _f(f.get("s")), _f(f["k"])
    if not math.isfinite(s):
        return value, float("nan")
    t = float(_st.t.ppf(0.5 + level / 2, k - 2))
    return value, t * s * math.sqrt(1 / k + (x - _f(f["xbar"])) ** 2 / _f(f["sxx"]))


def _f(x) -> float:
    """A stored number as a float (None, as JSON stores NaN: NaN)."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def _json(x):
    return x if not isinstance(x, float) or math.isfinite(x) else None


def prediction_records(runs: pd.DataFrame, chance: float | None = None) -> list[dict]:
    """What the study stores as measure ``PREDICTION``: per design and target size, the fit
    and its prediction (``gap_pct``, ``lo``, ``hi``)."""
    summ = cell_summary(gaps(losses(runs, chance)))
    fits = fit(summ, used_sizes(summ))
    out = []
    for f in fits.to_dict("records"):
        for n in TARGETS:
            v, h = line(f, n)
            rec = {**f, "target": n, "gap_pct": v, "lo": v - h, "hi": v + h}
            out.append({k: _json(x) for k, x in rec.items()})
    return out


def compare_published(pred: pd.DataFrame) -> pd.DataFrame:
    """Stored predictions (``PREDICTION``'s records, or ``backtest``'s of the forms that passed,
    with their ``form``; the line where none is named) beside each published gap of the same
    design and size: ``published`` (% per-token perplexity), ``inside`` (the published value
    lies in the interval; None without one) and ``miss`` (predicted − published)."""
    cols = ["design", "form", "target", "gap_pct", "lo", "hi", "published", "inside", "miss"]
    if pred.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for r in pred.to_dict("records"):
        pub = PUBLISHED.get((r["design"], float(r["target"])))
        if pub is None:
            continue
        lo, hi = _f(r["lo"]), _f(r["hi"])
        ok = None if not (math.isfinite(lo) and math.isfinite(hi)) else bool(lo <= pub <= hi)
        rows.append({"design": r["design"], "form": r.get("form", "line"),
                     "target": float(r["target"]),
                     "gap_pct": _f(r["gap_pct"]), "lo": lo, "hi": hi, "published": pub,
                     "inside": ok, "miss": _f(r["gap_pct"]) - pub})
    return pd.DataFrame(rows, columns=cols)
