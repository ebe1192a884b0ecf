"""The page's tables, one function each, from ``compute``'s records: comparison tables, the
summary of every design against standard, the learning rates chosen, the width scaling, the
training budget, the margins, the weight similarity of qkvlab's own models and the tie costs.
"""

from __future__ import annotations

import math

import pandas as pd

from qkvlab.report.blocks import Block, Figure, Para, Table
from qkvlab.studies.qkv.compute import frames
from qkvlab.studies.qkv.compute.effects import effect
from qkvlab.studies.qkv.compute.results import StudyData, row_chance
from qkvlab.studies.qkv.compute.ties import tie_costs
from qkvlab.studies.qkv.plan.questions import tuned_designs
from qkvlab.studies.qkv.plan.rates import lr_of, task_lr
from qkvlab.studies.qkv.plan.vocab import METRICS, TASK_METRIC, label
from qkvlab.studies.qkv.render.text import LEGEND, cell, ci_text, num, pm, said, splits_text
from qkvlab.studies.qkv.render.ties import TIE_LABELS, ppl_change, ppl_text, why_refused


def compare_table(df: pd.DataFrame, caption: str, metrics: tuple[str, ...] = ()) -> Table:
    """A table of comparison rows: group, design, params, mean ± CI, paired Δ vs standard."""
    if metrics and not df.empty:
        df = df[df.metric.isin(metrics)]
    rows = [] if df.empty else df.to_dict("records")
    def has(col: str) -> bool:
        return any(isinstance(r.get(col), (int, float)) and math.isfinite(r[col]) for r in rows)
    extra = tuple(c for c in ("m", "d_head") if has(c))
    headers = ("task", "arm", *extra, "design", "seeds", "params", "metric", "mean ± 95% CI",
               "vs standard", "p")
    body = []
    for r in rows:
        eff = said(effect(r)) if r["design"] != "standard" else ""
        body.append((str(r.get("task", "")), str(r.get("arm", "")),
                     *(num(r.get(c)) for c in extra),
                     label(r["design"]), str(r["n"]), num(r.get("n_params")),
                     r["metric"], pm(r["mean"], r["half"], 4), eff, _p(r)))
    return Table(caption, headers, tuple(body))


def _p(r: dict) -> str:
    """The paired t-test's p, and Holm's adjusted p where the row is a headline comparison."""
    adj = r.get("p_adj")
    return num(r.get("p"), 2) + (f" (Holm {num(adj, 2)})" if isinstance(adj, float)
                                 and math.isfinite(adj) else "")


def summary_table(data: StudyData) -> Table:
    quality, cost = frames.quality(data), frames.cost_ratios(data)
    tasks = sorted({t for q in quality.values() for t in q})
    headers = ("design", "attention params ×", "attention layer time ×", "KV cache ×",
               "decode tokens/s ×",
               *(f"{t} ({TASK_METRIC[t.split(' ')[0]]})" for t in tasks))
    body = []
    for design in sorted(set(quality) | (set(cost) & set(quality))):
        cells = []
        for t in tasks:
            r = quality[design].get(t)
            if r is None:
                cells.append("—")
                continue
            e = effect(r, chance=row_chance(r, data.profile))
            cells.append(cell(e))
        c = cost.get(design, {})
        body.append((label(design), num(c.get("params")), num(c.get("time")),
                     num(c.get("cache")), num(c.get("decode")), *cells))
    caption = ("Each design relative to standard (× = ratio to standard; quality: paired "
               "difference at equal width, mean ± 95% CI over seeds: % perplexity for losses "
               "(per subword token on lm, per target token of its own BPE on translate, per "
               "masked character on mlm), bits per "
               "character on lm_char (the character-level lm), percentage points of accuracy) "
               "and its verdict against the stated margin, "
               "corrected by Holm over each question's headline comparisons (raw p beside it). "
               + splits_text(data.profile))
    return Table(caption, headers, tuple(body), legend=LEGEND)


def lr_blocks(data: StudyData, figs: dict[str, list[Figure]]) -> list[Block]:
    """How each design's learning rate was chosen: the grid's figure and the chosen rates."""
    p = data.profile
    if not p.lr_grid:
        return [Para(f"Learning rates: every design trains at its task's rate (profile "
                     f"{p.name} has no per-design grid): "
                     + ", ".join(f"{t} {task_lr(t, p):g}" for t in TASK_METRIC) + ".")]
    df = frames.lr_frame(data)
    chosen = df[df.chosen]
    body = tuple((r.task, label(r.design), r.arm, f"{r.lr:g}",
                  num(r.val_loss, 4), "yes: widen the grid" if r.edge else "no")
                 for r in chosen.itertuples())
    grids = "; ".join(f"{t}: {', '.join(f'{lr_of(t, m, p):g}' for m in p.lr_grid)}"
                      for t in tuned_designs())
    return [Para(f"Learning rates: each design of {', '.join(tuned_designs())} trains, in each arm "
                 f"(equal width, and parameter-matched: another width, so its own rate), at "
                 f"the rate of its task's grid ({grids}) with the lowest mean val-split loss "
                 f"over tuning seeds {', '.join(map(str, p.lr_seeds))} (not the reported "
                 f"seeds)."),
            *figs.get("setup", []),
            Table("Chosen learning rate per design", ("task", "design", "arm", "rate",
                                                      "val loss (tuning seeds)",
                                                      "at the grid's edge"),
                  body)]


def scaling_blocks(data: StudyData) -> list[Block]:
    """The scaling comparison as a table: each design's effect and verdict per width."""
    df = frames.scaling_frame(data)
    if df.empty:
        return []
    rows = data.compared("lm_scaling", metric="val_loss")
    body = tuple((label(r["design"]), str(int(r["d_model"])),
                  num(r.get("baseline_params")), str(int(r["n_pairs"])), cell(effect(r)))
                 for r in frames.diffs(rows).to_dict("records"))
    return [Table("lm at three widths (same depth and d_head): each design vs standard",
                  ("design", "d_model", "params (standard)", "seeds", "perplexity vs standard"),
                  body, legend=LEGEND)]


def budget_table(data: StudyData) -> list[Block]:
    """Val loss at half and full budget: how far from flat the compared models are."""
    df = data.budget
    if df.empty:
        return []
    body = tuple((r.task, label(r.design), str(r.seeds),
                  f"{num(r.half, 4)} (step {r.half_step})", f"{num(r.full, 4)} (step {r.steps})",
                  f"{r.change_pct:+.1f}%") for r in df.itertuples())
    return [Table("Trained how far? Mean loss on the val split (the per-step evaluations) "
                  "over seeds at half and at the full budget "
                  "(equal width). A change much larger than the differences between designs "
                  "means the comparison is of models still learning.",
                  ("task", "design", "seeds", "half budget", "full budget", "change"), body)]


def margins_table(profile=None) -> Table:
    """The practical margins of the verdicts, with their reasons (fixed before the runs), and
    the split the differences are read on (with ``profile``)."""
    split = "" if profile is None else " " + splits_text(profile)
    return Table("Practical margins, written down before the runs: a 90% CI of the paired "
                 "difference inside ±margin reads 'equivalent'." + split,
                 ("metric", "margin", "why"),
                 tuple((k, f"±{m.margin:g} {m.margin_unit}", m.reason)
                       for k, m in METRICS.items()))


SIMILARITY = ("symmetry", "overlap_qk", "overlap_kv", "overlap_qv")


def weight_similarity_table(data: StudyData) -> list[Block]:
    """W_Q, W_K, W_V similarity in qkvlab's own trained standard models, mean ± 95% CI over
    seeds, beside the random null (the ``weight_similarity`` measure)."""
    ws = data.measure("weight_similarity")
    if ws.empty:
        return []
    rows = []
    for (task, role), g in ws.groupby(["task", "role"]):
        cells = []
        for m in SIMILARITY:
            sub = g[g.measure == m]
            cells.append("—" if sub.empty else f"{ci_text(sub['mean'].tolist())} (null "
                         f"{num(sub.null_mean.mean())})")
        rows.append((task, role, str(g.seed.nunique()), *cells))
    return [Table("qkvlab's own standard models after training (tied_qk_qkv, equal width): mean "
                  "over heads, then mean ± 95% CI over seeds; null: random heads of the same "
                  "shapes", ("task", "role", "seeds", "symmetry s", "overlap Q–K",
                             "overlap K–V", "overlap Q–V"), tuple(rows))]


def tie_cost_blocks(data: StudyData) -> list[Block]:
    """What forcing each tie costs a trained decoder (``compute.ties.tie_costs``)."""
    tc = tie_costs(data)
    if tc.empty:
        models = getattr(data.profile, "tie_cost_models", ())
        return [Para("What a tie would cost a trained model: not measured in this store at this "
                     "profile's sizes" + (f" (it measures {', '.join(models)}; see the notes)"
                                          if models else "; `qkvlab tiecost smollm2` stores it")
                     + ".", note=True)]
    rows = tc[(tc.layers.astype(str) == "all") & (tc.stage == "zero-shot")]
    body = tuple((r["title"], TIE_LABELS.get(r["tie"], r["tie"]), ppl_text(r["ppl"]),
                  ppl_text(r["ppl_base"]), f"{r['delta_nll']:+.3f}", ppl_change(r["pct"]),
                  num(r["kv_cache"]), num(r["attn_params"]))
                 for r in rows.to_dict("records"))
    refused = tc[tc.stage == "refused"].drop_duplicates(["model", "tie"])
    out: list[Block] = [Table(
        "What each tie costs a trained decoder zero-shot: every layer tied at once by its best fit "
        "on real activations (K=V: W_V ← W_K·M, M folded into W_O; Q=K: the nearest tied score "
        "form; GQA: kv heads mean-pooled, a reference), held-out Bible perplexity, nothing "
        "trained after the tie (uptraining a tie is `qkvlab convert`'s). alt folds exactly, so "
        "it costs nothing.",
        ("model", "tie", "perplexity", "untied", "Δ nll", "perplexity change", "KV cache ×",
         "attention params ×"), body)]
    if not refused.empty:
        out.append(Para("Ties a model's architecture cannot take: " + "; ".join(
            f"{r['title']} {TIE_LABELS.get(r['tie'], r['tie'])}: {why_refused(r['reason'])}"
            for r in refused.to_dict("records")) + "."))
    return out
