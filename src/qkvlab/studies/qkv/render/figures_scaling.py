"""The gap against training budget and size (``compute.scaling``): two figures, the budget
verdicts, the predicted-vs-published table and the sentence the plain answers quote.

The size figure draws the descriptive fit from the stored ``scaling_prediction`` records, and
the predictions at the published sizes only from the stored back-test (``scaling_backtest``,
``compute.backtest``): only a form that passed it is extrapolated (the study stores both before
the report is drawn); the measured points come from the runs. Published numbers are drawn as
labelled references, in their unit (% perplexity per subword token), never as measurements.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from qkvlab.report.blocks import Block, Figure, Para, Table
from qkvlab.studies.qkv.compute import backtest as BT
from qkvlab.studies.qkv.compute import scaling as S
from qkvlab.studies.qkv.compute.results import StudyData, chance
from qkvlab.studies.qkv.compute.frames import edge_choices
from qkvlab.studies.qkv.plan.references import REF_KV_CITE
from qkvlab.studies.qkv.plan.vocab import METRICS, color, label
from qkvlab.studies.qkv.render.figures_q import save
from qkvlab.studies.qkv.render.text import edge_note, num

def differs(data: StudyData, summary: pd.DataFrame) -> str:
    """What differs between their set-up and ours (our sizes read from the profile and runs)."""
    vocab = data.profile.task_options.get(S.TASK, {}).get("vocab_size")
    ours = f"a {vocab:,}-token BPE" if vocab else "lm's own tokens"
    biggest = f"≤ {summary.cell_params.max():,.0f}" if not summary.empty else "far fewer"
    return (f"their models are 300M–1.2B parameters trained on SlimPajama with a tokenizer of "
            f"tens of thousands of subwords, ours {biggest} non-embedding parameters on {ours} "
            f"of a small corpus; their perplexity counts EOS padding, which dilutes gaps; their "
            f"GQA-4 shares each kv head among 4 query heads, ours halves the kv heads (one kv "
            f"head where a model has 2–3 heads, where it is MQA); N here counts non-embedding "
            f"parameters, theirs all")


def frames(data: StudyData) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-seed gaps, per-cell summary) of the store's scaling runs."""
    g = S.gaps(S.losses(data.runs, chance(S.TASK, data.profile)))
    return g, S.cell_summary(g)


def _designs(df: pd.DataFrame) -> list[str]:
    return [d for d in S.DESIGNS if not df.empty and d in set(df.design)]


def _lost(summary: pd.DataFrame) -> str:
    n, b = int(summary.lost.sum()), int(summary.baseline_lost.sum())
    return (f" {n} design run(s) and {b} standard run(s) diverged or failed and enter at the "
            f"worst value by the study's rule." if n or b else " No run diverged or failed.")


def fig_budget(data: StudyData, out: Path) -> Figure | None:
    """One panel per design: its gap to standard against training steps, ± 95% CI."""
    g, summ = frames(data)
    b = summ[summ.cell == "budget"]
    designs = _designs(b)
    if not designs:
        return None
    b = b[b.design.isin(designs)]  # the control is a table of its own (tables)
    trend = S.budget_trend(g, S.used_budgets(summ)).set_index("design")
    fig, axes = plt.subplots(1, len(designs), squeeze=False, sharey=True,
                             figsize=(2.4 * len(designs) + 1.0, 3.3))
    for ax, d in zip(axes[0], designs):
        sub = b[b.design == d].sort_values("steps")
        ax.errorbar(sub.steps, sub["mean"], yerr=sub.half.fillna(0), fmt="o-", color=color(d),
                    capsize=3)
        ax.axhline(0, color=color("standard"), lw=1)
        ax.set_xscale("log")
        ax.set_xticks(list(sub.steps), [f"{int(s):,}" for s in sub.steps])
        ax.minorticks_off()
        v = trend.loc[d, "verdict"] if d in trend.index else "—"
        ax.set_title(f"{label(d)}\n{v}", fontsize=9)
        ax.set_xlabel("training steps (own schedule)")
    axes[0][0].set_ylabel("perplexity vs standard (%)")
    p = data.profile
    return save(fig, b, out, "scaling_budget", "Does the gap shrink with training?",
                f"Each design's paired per-token perplexity gap to standard on lm "
                f"(d_model {p.d_model}, {p.n_layers} layers), each budget a separate run with "
                f"its own full schedule and its own tuned rate, test split, ± 95% CI over "
                f"seeds. Title: the rule fixed before the runs (gap at the smallest budget where "
                f"standard uses attention − gap at the largest, Holm over the {len(designs)} "
                f"designs)." + _lost(b))


def _stored(data: StudyData) -> pd.DataFrame:
    return data.measure(S.PREDICTION)


def _passed(data: StudyData) -> pd.DataFrame:
    """The back-test's predictions: the forms that passed it, per design (none stored: none)."""
    return BT.kind(data.measure(BT.MEASURE), "prediction")


FORM_TEXT = {"line": "gap% = a + b·log10 N",
             "multiplier": "effective-parameter multiplier on standard's L(N) = E + A·N^-α"}


def backtest_text(data: StudyData) -> str:
    """What the back-test found, in words: which forms passed for which designs, that none
    did, or why none could be tested; "" where the store holds no back-test."""
    bt = data.measure(BT.MEASURE)
    why = BT.kind(bt, "untested")
    if not why.empty:
        return f"not back-tested: {why.reason.iloc[0]}, so nothing is extrapolated"
    held = BT.kind(bt, "heldout")
    if held.empty:
        return ""
    ok = {f: [label(d) for d in dict.fromkeys(g.design)]
          for f, g in BT.kind(bt, "prediction").groupby("form", sort=False)}
    n = held.held_params.max()
    head = (f"back-tested on a cell of {n:,.0f} parameters held out, ≥ {BT.HOLDOUT:g}× the "
            f"{int(held.fit_cells.iloc[0])} cells fitted")
    if not ok:
        return f"{head}: no form's {BT.LEVEL:.0%} prediction interval held the measured gap, so " \
               f"nothing is extrapolated"
    return f"{head}: " + "; ".join(f"the {FORM_TEXT[f]} passed for {', '.join(ds)}"
                                   for f, ds in ok.items()) + \
        " (only these are extrapolated)"


def fig_size(data: StudyData, out: Path) -> Figure | None:
    """One panel per design: measured gaps per size, the stored fit with its band over the
    sizes it read, the predictions at 300M and 1.2B of the forms that passed the back-test and
    the published points."""
    _, summ = frames(data)
    sz = summ[summ.cell == "size"]
    pred = _stored(data)
    designs = [d for d in _designs(sz) if not pred.empty and d in set(pred.design)]
    if not designs:
        return None
    fig, axes = plt.subplots(1, len(designs), squeeze=False, sharey=True,
                             figsize=(2.4 * len(designs) + 1.0, 3.6))
    used = S.used_sizes(summ)
    for ax, d in zip(axes[0], designs):
        sub = sz[sz.design == d]
        for depth, m in zip(sorted(set(sub.n_layers)), "os^D"):
            s = sub[sub.n_layers == depth]
            fit_in = [used is None or (int(w), int(depth)) in used for w in s.d_model]
            ax.errorbar(s.cell_params, s["mean"], yerr=s.half.fillna(0), fmt=m, color=color(d),
                        capsize=2, ms=4, label=f"{int(depth)} layer(s)")
            out_ = s[[not k for k in fit_in]]  # attention not used there: outside the fit
            ax.plot(out_.cell_params, out_["mean"], m, color=color(d), mfc="white", ms=4)
        f = pred[pred.design == d].iloc[0].to_dict()
        xs = [10 ** (math.log10(f["n_min"]) + i * (math.log10(f["n_max"] / f["n_min"])) / 40)
              for i in range(41)]
        ys = [S.line(f, x) for x in xs]
        ax.plot(xs, [y for y, _ in ys], "-", color=color(d), lw=1)
        ax.fill_between(xs, [y - h for y, h in ys], [y + h for y, h in ys], color=color(d),
                        alpha=0.15, lw=0)
        ok = _passed(data)
        for form, m in (("line", "s"), ("multiplier", "^")):
            pts = ok[(ok.design == d) & (ok.form == form)] if not ok.empty else ok
            if not pts.empty:
                ax.errorbar(pts.target, pts.gap_pct,
                            yerr=[pts.gap_pct - pts.lo, pts.hi - pts.gap_pct], fmt=m,
                            mfc="white", color=color(d), capsize=3,
                            label=f"predicted ({form})")
        pub = [(n, v) for (dd, n), v in S.PUBLISHED.items() if dd == d]
        ax.plot([n for n, _ in pub], [v for _, v in pub], "D", color="#555555", mfc="#555555",
                ms=4, label="published")
        ax.axhline(0, color=color("standard"), lw=1)
        ax.set_xscale("log")
        ax.set_title(label(d), fontsize=9)
        ax.set_xlabel("non-embedding parameters")
    axes[0][0].set_ylabel("perplexity vs standard (%)")
    axes[0][-1].legend(fontsize=7, frameon=False)
    return save(fig, sz, out, "scaling_size", "The gap against size at matched data",
                f"Each design's paired per-token perplexity gap to standard at each size "
                f"(tokens = {data.profile.tokens_per_param:g} × non-embedding parameters, own "
                f"tuned rate, test split, ± 95% CI over seeds); line and band: the stored fit "
                f"gap% = a + b·log10 N and its 95% CI over the sizes measured; open markers at "
                f"300M and 1.2B: the prediction of each form that passed its back-test, with its "
                f"95% bootstrap interval (the size trend is "
                f"{backtest_text(data) or 'not back-tested'}); "
                f"hollow points: sizes where standard does not beat the attention-free control "
                f"by more than the margin, left out of the fit; grey diamonds: published "
                f"({REF_KV_CITE}), not measured here." + _lost(sz))


def figures(data: StudyData, out: Path) -> list[Figure]:
    return [f for f in (fig_budget(data, out), fig_size(data, out)) if f is not None]


TREND_HEADERS = ("design", "budgets (steps)", "seeds", "difference ± 95% CI", "p", "p (Holm)",
                 "verdict")


def _trend_rows(t: pd.DataFrame) -> tuple[tuple[str, ...], ...]:
    """``S.budget_trend``'s rows as table cells (the raw rule's and the share's alike)."""
    return tuple((label(r.design), f"{r.small:,.0f} → {r.large:,.0f}" if r.n else "—", str(r.n),
                  f"{r.diff:+.1f} ± {r.half:.1f}" if math.isfinite(r.half)
                  else f"{r.diff:+.1f}" if r.n else "—",
                  num(r.p), num(r.p_adj), r.verdict) for r in t.itertuples())


def tables(data: StudyData) -> list[Block]:
    """The budget verdicts and the predicted-vs-published table (when the store has them)."""
    g, summ = frames(data)
    out: list[Block] = []
    t = S.budget_trend(g, S.used_budgets(summ))
    if not t.empty:
        out.append(Table(
            "The gap against training budget: gap at the smallest budget where standard uses "
            "attention (next table) − gap at the largest (points of % perplexity), per-seed "
            "paired, Holm over the designs",
            TREND_HEADERS,
_trend_rows(t)))
    share = S.budget_trend(S.share_gaps(S.losses(data.runs, chance(S.TASK, data.profile))),
                           S.used_budgets(summ))
    if not share.empty:
        out.append(Table(
            "The same rule on the share of attention's benefit each design gives up (its gap "
            "over the attention-free control's, per seed: 0% is standard, 100% no attention): "
            "share at the smallest budget where standard uses attention − share at the "
            "largest, in points, per-seed paired, Holm over the designs. The raw rule above "
            "mixes the tie's cost with what attention is worth at each budget; this one does "
            "not. Both were written down before a scaling store was read this way.",
            TREND_HEADERS,
_trend_rows(share)))
    used = S.attention_by_budget(frames(data)[1])
    if not used.empty:
        out.append(Table(
            "Is attention used at each budget? The attention-free control (uniform scores) vs "
            f"standard, % perplexity; used: its 95% CI lies above the "
            f"{METRICS['val_loss'].margin_text} margin",
            ("steps", "seeds", "control vs standard", "attention used"),
            tuple((f"{r.steps:,}", str(r.n), f"{r.mean:+.1f} ± {r.half:.1f}"
                   if math.isfinite(r.half) else f"{r.mean:+.1f}",
                   "yes" if r.used else "no: a tie's gap here says little")
                  for r in used.itertuples())))
    by_size = S.attention_by_size(frames(data)[1])
    if not by_size.empty:
        out.append(Table(
            "Is attention used at each size? The attention-free control vs standard, % "
            f"perplexity; used: its 95% CI lies above the {METRICS['val_loss'].margin_text} "
            "margin (the fit reads only these sizes)",
            ("d_model", "layers", "parameters", "seeds", "control vs standard",
             "attention used"),
            tuple((str(r.d_model), str(r.n_layers), f"{r.cell_params:,}", str(r.n),
                   f"{r.mean:+.1f} ± {r.half:.1f}" if math.isfinite(r.half)
                   else f"{r.mean:+.1f}",
                   "yes" if r.used else "no: left out of the fit")
                  for r in by_size.itertuples())))
    held = BT.kind(data.measure(BT.MEASURE), "heldout")
    if not held.empty:
        out.append(Table(
            f"The size trend's back-test: each form fitted on the sizes ≤ 1/{BT.HOLDOUT:g} of a "
            f"held-out cell, its {BT.LEVEL:.0%} prediction interval for that cell's mean gap "
            "(seeds resampled within each fitted cell, plus the held-out mean's own scatter) "
            "beside the gap measured there, % perplexity per token; only a form whose "
            "interval holds it is extrapolated (written down before the held-out runs)",
            ("form", "design", "fitted sizes", "held out", "predicted (interval)",
             "measured ± 95% CI", "passes"),
            tuple((r.form, label(r.design), f"{int(r.fit_cells)}: {r.fit_min:,.0f}–"
                   f"{r.fit_max:,.0f}", f"{r.held_params:,.0f} ({int(r.n_held)} seeds)",
                   f"{r.predicted:+.1f} ({r.lo:+.1f} to {r.hi:+.1f})",
                   f"{r.measured:+.1f} ± {r.measured_half:.1f}"
                   if r.measured_half is not None and math.isfinite(r.measured_half)
                   else f"{r.measured:+.1f}", "yes" if r.covered else "no")
                  for r in held.itertuples())))
    cmp = S.compare_published(_passed(data))
    if not cmp.empty:
        out.append(Table(
            "Predicted by the forms that passed their back-test (stored before this table was "
            f"drawn) vs published, % perplexity per subword token; published: {REF_KV_CITE}",
            ("design", "form", "parameters", "predicted (95% CI)", "published",
             "published inside?", "predicted − published"),
            tuple((label(r.design), r.form, f"{r.target / 1e6:,.0f}M",
                   f"{r.gap_pct:+.1f} ({r.lo:+.1f} to {r.hi:+.1f})" if r.inside is not None
                   else f"{r.gap_pct:+.1f} (no interval: too few sizes)",
                   f"+{r.published:g}",
                   {True: "yes", False: "no"}.get(r.inside, "no interval"), f"{r.miss:+.1f}")
                  for r in cmp.itertuples()),
            legend=f"What differs: {differs(data, frames(data)[1])}."))
    return out


def answer_sentence(data: StudyData) -> str | None:
    """The plain answers' sentence on scale, when the store holds these results."""
    g, summ = frames(data)
    t = S.budget_trend(g, S.used_budgets(summ))
    cmp = S.compare_published(_passed(data))
    parts = []
    if not t.empty:
        used = S.attention_by_budget(frames(data)[1])
        unused = [f"{s:,}" for s, u in zip(used.steps, used.used) if not u]
        parts.append("against training budget (" + "; ".join(
            f"{label(r.design)} {r.verdict}" for r in t.itertuples()) + ")" +
            (f", though attention is not yet used at {' and '.join(unused)} steps"
             if unused else ""))
    if not cmp.empty:
        miss = [r for r in cmp.itertuples() if r.inside is False]
        inside = sum(r.inside is True for r in cmp.itertuples())
        sizes = " and ".join(f"{n / 1e6:,.0f}M" for n in sorted(set(cmp.target)))
        where = [f"{label(r.design)} at {r.target / 1e6:,.0f}M" for r in miss]
        # an interval that holds zero cannot say even the sign of the gap at that size
        with_zero = [r for r in cmp.itertuples() if r.lo <= 0 <= r.hi]
        widest = max(cmp.itertuples(), key=lambda r: r.hi - r.lo)
        if inside or miss:
            parts.append(f"extrapolated to {sizes} parameters, {inside} of {len(cmp)} "
                         f"published gaps lie inside our prediction's 95% interval" +
                         (f" ({', '.join(where)} outside)"
                          if miss else "") +
                         f", but {len(with_zero)} of those {len(cmp)} intervals also hold zero "
                         f"(the widest, {label(widest.design)} at "
                         f"{widest.target / 1e6:,.0f}M, {widest.lo:+.0f} to {widest.hi:+.0f}%), "
                         f"so a published value inside one is no test of it")
        else:
            parts.append(f"extrapolated to {sizes} parameters, a prediction without an "
                         f"interval (too few sizes), so not set against the published gaps")
    elif backtest_text(data):
        parts.append(f"against size, {backtest_text(data)} to the published sizes")
    if not parts:
        return None
    return ("At scale: each tie's per-token gap to standard " + "; ".join(parts) +
            ("; the extrapolation spans three orders of magnitude from models trained "
             "here on at most ~3,000 steps, and carries little weight" if not cmp.empty
             else "") + " (figures in Q3).")


def q_blocks(data: StudyData, figs: list[Figure]) -> list[Block]:
    """What Q3's section shows of these experiments (Q2's designs included)."""
    if not figs and not tables(data):
        return []
    out = [Para("The gap against training budget and size, for the tied designs of Q2 and "
                "Q3 and GQA/MQA as the KV-cache references:"), *figs, *tables(data)]
    edges = edge_choices(data, ("scaling_tune", "scaling_tune_edge"),
                         ["design", "d_model", "n_layers", "steps"])
    return out + edge_note(edges, lambda r: f"{label(r.design)} at d_model {int(r.d_model)}, "
                                            f"{int(r.n_layers)} layer(s), {int(r.steps)} steps")
