"""The controlled conversion in the report: the study's own lm converted to K = V and uptrained
(table, figure, Q3's sentence). Reads ``compute.uptrain``; decides nothing."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import NullLocator

from qkvlab.hf.convert import gap_text
from qkvlab.report.blocks import Block, Figure, Para, Table
from qkvlab.studies.qkv.compute.effects import Effect, Status, effect
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.compute.uptrain import (
    VS_SCRATCH,
    VS_UNTIED,
    comparisons,
    start_gaps,
    steps_saved,
)
from qkvlab.studies.qkv.plan.uptrain import (
    KV_SCRATCH,
    STANDARD_SCRATCH,
    UNTIED,
    UPTRAIN_STARTS,
    on_edge,
    steps_of,
    uptrain_steps,
)
from qkvlab.studies.qkv.render.convert import START_COLORS
from qkvlab.studies.qkv.render.figures_q import ci_bars, effect_points, save
from qkvlab.studies.qkv.render.text import cell, control_text, said

NAMES = {"fitted": "fitted (V = K·M, M folded into W_O)", "avg": "avg: (W_K + W_V)/2",
         "keep_k": "keep W_K", UNTIED: "untied, trained on the same way",
         KV_SCRATCH: "K=V from scratch", STANDARD_SCRATCH: "standard from scratch"}
SHORT = {"fitted": "fitted", "avg": "avg", "keep_k": "keep W_K"}
DODGE = {"fitted": 0.96, "avg": 1.0, "keep_k": 1.04, KV_SCRATCH: 1.0}


def _fraction(data: StudyData, f: float) -> str:
    p = data.profile
    return f"+{100 * f:g}% ({uptrain_steps(p, f):,} steps)"


def _effects(data: StudyData) -> dict[tuple, Effect]:
    """(family or (design, baseline), fraction, design) -> its effect."""
    out = {}
    for r in comparisons(data).to_dict("records"):
        fam = r["family"] if isinstance(r.get("family"), str) else (r["design"], r["baseline"])
        out[(fam, r["fraction"], r["design"])] = effect(r)
    return out


def _mults(data: StudyData) -> dict[tuple[str, float], float]:
    runs = data.runs
    if "experiment" not in runs or "mult" not in runs:
        return {}
    sub = runs[(runs.experiment == "lm_convert") & runs.mult.notna()]
    return {(r.design, r.fraction): r.mult for r in sub.itertuples()}


def uptrain_rows(data: StudyData) -> pd.DataFrame:
    """The conversion's comparison rows with each verdict as the table words it (``status``,
    ``raw_status``: before Holm and the control's gate) and the effect in % per token."""
    df = comparisons(data)
    if df.empty:
        return pd.DataFrame(columns=["family", "fraction", "design", "baseline", "status",
                                     "raw_status", "value", "lo", "hi", "unit"])
    es = [effect(r) for r in df.to_dict("records")]
    return df.assign(status=[e.status.value for e in es],
                     raw_status=[(e.raw_status or e.status).value for e in es],
                     value=[e.value for e in es], lo=[e.lo for e in es], hi=[e.hi for e in es],
                     unit=[e.unit for e in es])


def uptrain_blocks(data: StudyData) -> list[Block]:
    """The table: per fraction, each start vs the untied model and vs K=V from scratch."""
    eff = _effects(data)
    if not eff:
        return []
    p, mults = data.profile, _mults(data)
    rows = []
    for f in p.uptrain_fractions:
        for s in UPTRAIN_STARTS:
            a, b = eff.get((VS_UNTIED, f, s)), eff.get((VS_SCRATCH, f, s))
            rows.append((_fraction(data, f), NAMES[s], _rate(p, mults, s, f), _cell(a),
                         _cell(b)))
        for design, base in ((KV_SCRATCH, STANDARD_SCRATCH), (UNTIED, STANDARD_SCRATCH)):
            e = eff.get(((design, base), f, design))
            if e is not None:
                rows.append((_fraction(data, f), f"{NAMES[design]} (reference)",
                             _rate(p, mults, design, f), f"vs {NAMES[base]}: {_cell(e)}", ""))
    gate = _gate_words(eff)
    out: list[Block] = [Table(
        f"The study's own standard lm ({steps_of(p):,} steps, equal width) converted to tied "
        f"K=V from each start and trained on for a fraction of its pretraining steps: test "
        f"loss per token, paired by seed, as % perplexity per token, 95% CI. Against the "
        f"untied model trained on the same steps the same way (what the tie still costs) and "
        f"against K=V trained from scratch for the same total steps (is converting as good as "
        f"training with the tie?); each column one Holm family. The reference rows compare "
        f"with standard trained from scratch for the same total steps: K=V's from-scratch cost, "
        f"and what continuing a trained model with a fresh schedule costs by itself."
        + (f" Here {gate}." if gate else ""),
        ("uptraining", "start", "rate × parent's", "vs untied trained on",
         "vs K=V from scratch"), tuple(rows))]
    starts, saved = _starts_text(data), _saved_text(data)
    if starts:
        out.append(Para(f"Where each start begins, before any uptraining: its loss on the first "
                        f"training batch of each seed (the same batch for every arm) against "
                        f"the untied model's, mean over seeds: {starts}."))
    if saved:
        out.append(Para(f"What the fitted start saves: {saved}."))
    return out


def _starts_text(data: StudyData) -> str:
    """Where each start begins, e.g. "fitted +3.1% (95% CI +2.0 to +4.2)", or ""."""
    g = start_gaps(data)
    return "; ".join(f"{SHORT[r.design]} {pct(r.value)} (95% CI {pct(r.lo)} to {pct(r.hi)})"
                     for r in g.itertuples())


def pct(x: float) -> str:
    """A gap given in %, as every conversion figure is worded (``hf.convert.gap_text``)."""
    return gap_text(x / 100)


def _saved_text(data: StudyData) -> str:
    """What the fitted start saved against each other start, read off measured points."""
    parts = []
    for r in steps_saved(data).itertuples():
        what = (f"the gap {SHORT[r.other]} ends at after {r.steps_other:,} steps "
                f"({pct(r.target)} over the untied model)")
        if r.steps_fitted is None or not math.isfinite(r.steps_fitted):
            parts.append(f"the fitted start did not reach {what} at any measured fraction")
        elif r.at_first:
            parts.append(f"the fitted start was already below {what} at its first measured "
                         f"fraction ({r.steps_fitted:,.0f} steps): ≥ {r.ratio:.1f}× fewer steps")
        else:
            parts.append(f"the fitted start reached {what} in ≈{r.steps_fitted:,.0f} steps "
                         f"(log-linear between measured fractions): ≈{r.ratio:.1f}× fewer")
    return "; ".join(parts)


def _rate(p, mults: dict, design: str, f: float) -> str:
    """The chosen multiplier, flagged where it sits on the extended grid's edge."""
    m = mults.get((design, f))
    if m is None or not math.isfinite(m):
        return "—"
    return f"{m:g}" + (" (on the grid's edge)" if on_edge(p, m) else "")


def fig_q3_uptrain(data: StudyData, out: Path) -> Figure | None:
    """The gap of each start against uptraining (% of pretraining steps), two panels: vs the
    untied model trained on, vs K=V from scratch; 95% CIs; K=V's from-scratch cost dashed."""
    df = comparisons(data)
    if df.empty:
        return None
    tidy = effect_points(df, lambda r: {
        "panel": r["family"] if isinstance(r.get("family"), str) else VS_UNTIED,
        "design": r["design"], "baseline": r["baseline"], "fraction": r["fraction"]})
    if tidy.empty:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    for ax, panel in zip(axes, (VS_UNTIED, VS_SCRATCH)):
        sub = tidy[tidy.panel == panel]
        for design, g in sub.groupby("design"):
            if design == UNTIED:  # the protocol's own cost is the table's, not a curve here
                continue
            g = g.sort_values("fraction")
            # each design a little apart on the log axis, so overlapping bars stay readable
            x = 100 * g.fraction * DODGE.get(design, 1.0)
            ref = design == KV_SCRATCH
            ax.errorbar(x, g.value, yerr=ci_bars(g), marker="s" if ref else "o", capsize=3,
                        ls="--" if ref else "-", color="#444444" if ref else
                        START_COLORS.get(design, "#999999"),
                        label=("K=V from scratch vs standard from scratch" if ref
                               else NAMES[design]))
        ax.axhline(0, color="#999999", lw=0.8)
        ax.set_xscale("log")
        ticks = sorted(100 * tidy.fraction.unique())
        ax.set_xticks(ticks, [f"{t:g}%" for t in ticks])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("uptraining, % of the parent's pretraining steps")
        ax.set_title("converted vs the untied model trained on" if panel == VS_UNTIED else
                     "converted vs K=V trained from scratch", fontsize=10)
    axes[0].set_ylabel("% perplexity per token (test)")
    h, lab = axes[0].get_legend_handles_labels()
    fig.legend(h, lab, loc="outside lower center", ncol=2, frameon=False, fontsize=8)
    return save(fig, tidy, out, "q3_uptrain", "Converting the study's own lm to K=V",
                "The study's standard lm converted to tied K=V from each start and trained on "
                "for a fraction of its pretraining steps: the gap in test perplexity per token "
                "to the untied model trained on the same way (left) and to K=V trained from "
                "scratch for the same total steps (right), mean over seeds with 95% CIs; "
                "dashed: K=V from scratch against standard from scratch, the tie's cost when it "
                "is trained in from the start.")


def _cell(e: Effect | None) -> str:
    """A table cell; where the control gate holds the verdict back, the number and what its
    own test would read (the gate is said once, in the caption and the sentence)."""
    if e is None:
        return "—"
    if e.status is not Status.ATTENTION_UNUSED or e.value is None:
        return cell(e)
    half = "" if e.half is None else f" ± {e.half:.{e.digits}f}"
    own = "" if e.raw_status is None else f" (own test: {e.raw_status.value})"
    return f"no verdict {e.value:+.{e.digits}f}{half}%{own}"


def _gate_words(eff: dict[tuple, Effect]) -> str:
    """Said once where the gate holds every verdict back."""
    e = next(iter(eff.values()))
    if e.status is not Status.ATTENTION_UNUSED:
        return ""
    return (f"standard does not beat lm's attention-free control at this profile (the control "
            f"vs standard: {control_text(e)}), so none of these is a verdict")


def _headline(data: StudyData) -> tuple[dict, float, Effect, Effect] | None:
    """(all effects, the largest fraction, the fitted start there vs the untied model and vs
    K=V from scratch), or None where the profile or the store has no such pair."""
    eff, p = _effects(data), data.profile
    if not eff or not p.uptrain_fractions:
        return None
    f = max(p.uptrain_fractions)
    a, b = eff.get((VS_UNTIED, f, "fitted")), eff.get((VS_SCRATCH, f, "fitted"))
    return None if a is None or b is None else (eff, f, a, b)


def uptrain_sentence(data: StudyData) -> str:
    """Q3's words on the controlled conversion, at the largest fraction it measured."""
    found = _headline(data)
    if found is None:
        return ""
    eff, f, a, b = found
    p = data.profile
    gate = _gate_words(eff)
    say = _cell if gate else said
    text = (f"Converting the study's own standard lm ({steps_of(p):,} steps) to K=V from the "
            f"fitted start and training it {_fraction(data, f)} more: {say(a)} against the "
            f"untied model trained on the same way, {say(b)} against K=V trained from "
            f"scratch for the same total steps")
    others = [s for s in UPTRAIN_STARTS if s != "fitted" and (VS_UNTIED, f, s) in eff]
    if others:
        text += " (vs untied, " + "; ".join(f"{SHORT[s]}: {_cell(eff[(VS_UNTIED, f, s)])}"
                                            for s in others) + ")"
    ref = eff.get(((KV_SCRATCH, STANDARD_SCRATCH), f, KV_SCRATCH))
    if ref is not None and ref.value is not None:
        text += f"; K=V from scratch against standard from scratch: {say(ref)}"
    starts, saved = _starts_text(data), _saved_text(data)
    if starts:
        text += f"; before uptraining the starts begin at {starts} over the untied model"
    if saved and not gate:
        text += f"; {saved}"
    text += f"; {gate}" if gate else ""
    return text + " (table: the controlled conversion)."


DECIDED = (Status.WORSE, Status.BETTER, Status.EQUIVALENT)


def uptrain_answer(data: StudyData) -> str:
    """One sentence for Q3's answer, only where the controlled conversion decided something:
    the fitted start at the largest fraction, against both baselines."""
    found = _headline(data)
    if found is None or not {found[2].status, found[3].status} & set(DECIDED):
        return ""
    _, f, a, b = found
    p = data.profile

    def short(e: Effect) -> str:
        return (f"{e.value:+.{e.digits}f}% (95% CI {e.lo:+.{e.digits}f} to "
                f"{e.hi:+.{e.digits}f}; {e.status.value.replace('_', ' ')})")
    return (f"Where the pretraining is ours (the study's lm, {steps_of(p):,} steps), converting "
            f"it to K=V from the fitted start and training {_fraction(data, f)} more ends "
            f"{short(a)} against the untied model trained on the same way and {short(b)} "
            f"against K=V trained from scratch for the same total steps.")
