"""K = V's head-width axis in the report: the table, the figure ``q3_head_width``, Q3's sentence
and, where the trend is decided, its answer. Reads ``compute.headwidth``; decides nothing."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from qkvlab.report.blocks import Block, Figure, Para, Table
from qkvlab.studies.qkv.compute.effects import Effect, Status, effect
from qkvlab.studies.qkv.compute.frames import edge_choices
from qkvlab.studies.qkv.compute.headwidth import comparisons, trend
from qkvlab.studies.qkv.plan.headwidth import FLAT_PER_DOUBLING, TREND
from qkvlab.studies.qkv.plan.vocab import CONTROL, DESIGNS
from qkvlab.studies.qkv.render.figures_q import ci_bars, effect_points, save
from qkvlab.studies.qkv.render.text import cell, control_text, edge_note, said

COLUMNS = ("tied_kv", "gqa_half", CONTROL)
DODGE = {"tied_kv": 0.95, "gqa_half": 1.0, CONTROL: 1.05}  # apart on the log axis
READ = {"falls": "falls as d_head grows", "grows": "grows with d_head",
        "flat": f"is flat in d_head (within ±{FLAT_PER_DOUBLING:g}% per doubling)",
        "undecided": "has no decided trend in d_head",
        "attention_unused": "is not read: standard does not beat the control in every cell"}


def _effects(data) -> dict[tuple, Effect]:
    return {(int(r["d_model"]), int(r["n_heads"]), r["design"]): effect(r)
            for r in comparisons(data).to_dict("records")}


def head_width_rows(data) -> pd.DataFrame:
    """The rows of ``head_width.csv``: each (cell, design) with its verdict as the table words
    it, the effect in % per token and the share of attention's benefit it gives up."""
    df = comparisons(data)
    cols = ["d_model", "n_heads", "d_head", "design", "status", "raw_status", "value", "lo",
            "hi", "share", "share_lo", "share_hi", "n"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    es = [effect(r) for r in df.to_dict("records")]
    return df.assign(status=[e.status.value for e in es],
                     raw_status=[(e.raw_status or e.status).value for e in es],
                     value=[e.value for e in es], lo=[e.lo for e in es],
                     hi=[e.hi for e in es])[cols]


def _rates(data) -> dict[tuple, float]:
    """(d_model, n_heads, design) -> the rate its runs trained at (one per cell and design)."""
    runs, col = data.runs, "spec.train.lr"
    if "experiment" not in runs or col not in runs or "n_heads" not in runs:
        return {}
    sub = runs[runs.experiment == "head_width"]
    return {(int(r.d_model), int(r.n_heads), r.design): float(r[col])
            for _, r in sub.drop_duplicates(["d_model", "n_heads", "design"]).iterrows()}


def _share(r: dict) -> str:
    if not math.isfinite(r.get("share", float("nan"))) or r.get("attention_used") != 1:
        return "—"
    lo, hi = r["share_lo"], r["share_hi"]
    ci = f" ({100 * lo:.0f} to {100 * hi:.0f}%)" if math.isfinite(lo) else ""
    return f"{100 * r['share']:.0f}%{ci}"


def head_width_blocks(data) -> list[Block]:
    """The table (one row per cell) and the trend's paragraph."""
    df = comparisons(data)
    if df.empty:
        return []
    eff, lrs = _effects(data), _rates(data)
    rows = []
    for (m, h), g in df.groupby(["d_model", "n_heads"], sort=False):
        kv = g[g.design == TREND]
        rows.append((f"{int(m)}", f"{int(h)} × {int(m) // int(h)}",
                     *(cell(eff[(int(m), int(h), d)]) if (int(m), int(h), d) in eff else "—"
                       for d in COLUMNS),
                     _share(kv.iloc[0].to_dict()) if not kv.empty else "—",
                     " / ".join(f"{lrs[k]:g}" if (k := (int(m), int(h), d)) in lrs else "—"
                                for d in ("standard", *COLUMNS))))
    out: list[Block] = [Table(
        "K=V's head-width axis: lm at fixed depth, each width split into heads of another "
        "width (heads × d_head = d_model), every design at its own rate; test loss per token "
        "against standard in the same cell, paired by seed, as % perplexity per token (95% "
        "CI), the designs' rows one Holm family; the control is each cell's gate. The share: "
        "what K=V gives up of what attention buys in that cell (1 = all of it).",
        ("d_model", "heads × d_head", *(f"{DESIGNS[d].label} vs standard" for d in COLUMNS),
         "K=V's share of attention's benefit", "rate: standard / K=V / GQA / control"),
        tuple(rows))]
    t = trend(data)
    if t:
        out.append(Para(_trend_text(t) + "."))
    edges = edge_choices(data, ("head_width_tune", "head_width_tune_edge"),
                         ["design", "d_model", "n_heads"])
    return out + edge_note(edges, lambda r: f"{DESIGNS[r.design].label} at {int(r.d_model)} "
                                            f"with {int(r.n_heads)} heads")


def _trend_text(t: dict) -> str:
    ci = (f"{t['slope']:+.2f}% per doubling of d_head (95% CI {t['lo']:+.2f} to "
          f"{t['hi']:+.2f}, {t['n']} seeds)" if math.isfinite(t["lo"]) else
          f"{t['slope']:+.2f}% per doubling ({t['n']} seed, no interval)")
    heads = ", ".join(str(d) for d in t["d_heads"])
    return (f"At width {t['d_model']} (d_head {heads}), K=V's cost {READ[t['reading']]}: "
            f"{ci}, the per-seed slope of its log-perplexity gap on log2 d_head")


def fig_q3_head_width(data, out: Path) -> Figure | None:
    """Each design's gap to standard against d_head, per width; 95% CIs."""
    df = comparisons(data)
    if df.empty:
        return None
    tidy = effect_points(df, lambda r: {"d_model": int(r["d_model"]),
                                        "d_head": int(r["d_head"]), "design": r["design"]})
    if tidy.empty:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4), layout="constrained")
    widths = sorted(tidy.d_model.unique())
    for design in COLUMNS:
        for i, width in enumerate(widths):
            g = tidy[(tidy.design == design) & (tidy.d_model == width)].sort_values("d_head")
            if g.empty:
                continue
            ax.errorbar(g.d_head * DODGE[design], g.value, yerr=ci_bars(g), capsize=3,
                        marker="o" if i == 0 else "D",
                        ls="none" if i else "--" if design == CONTROL else "-",
                        mfc=None if i == 0 else "white", color=DESIGNS[design].color,
                        label=f"{DESIGNS[design].label}, d_model {width}")
    ax.axhline(0, color="#999999", lw=0.8)
    ax.set_xscale("log", base=2)
    ticks = sorted(tidy.d_head.unique())
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("d_head (heads × d_head = d_model)")
    ax.set_ylabel("% perplexity per token vs standard (test)")
    ax.legend(frameon=False, fontsize=8)
    return save(fig, tidy, out, "q3_head_width", "K=V's cost against head width",
                "lm at fixed depth and width, the width split into heads of another width: "
                "each design's gap in test perplexity per token to standard in the same cell, "
                "mean over seeds with 95% CIs"
                + ("; diamonds: the wider model" if len(widths) > 1 else "")
                + ". The control's gap (dashed) is what attention buys in that cell.")


def head_width_sentence(data) -> str:
    """Q3's words on the head-width axis: K=V at each d_head, and the trend."""
    eff, t = _effects(data), trend(data)
    kv = sorted(((k, e) for k, e in eff.items() if k[2] == TREND),
                key=lambda ke: (ke[0][0], -ke[0][1]))  # by width, then d_head
    if not kv:
        return ""
    gated = all(e.status is Status.ATTENTION_UNUSED for _, e in kv)
    parts = [f"d_head {m // h} at width {m}: {_brief(e) if gated else said(e)}"
             for (m, h, _), e in kv]
    text = "K=V against standard as the heads widen at fixed width: " + "; ".join(parts)
    if t and not gated:
        text += f". {_trend_text(t)}"
    if gated:
        text += (f". Standard does not beat the control in these cells (e.g. "
                 f"{control_text(kv[0][1])}), so none of these is a verdict")
    return text + " (table: K=V's head-width axis)."


def _brief(e: Effect) -> str:
    """A gated effect's number alone (the gate is said once, after the list)."""
    if e.value is None:
        return "—"
    half = "" if e.half is None else f" ± {e.half:.{e.digits}f}"
    return f"{e.value:+.{e.digits}f}{half}%"


def head_width_answer(data) -> str:
    """One sentence for Q3's answer where the trend is decided."""
    t = trend(data)
    if not t or t["reading"] in ("undecided", "attention_unused"):
        return ""
    return f"{_trend_text(t)}."
