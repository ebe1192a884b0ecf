"""The study's figures: one forest plot per question, then the per-question figures.

``all_figures(data, out)`` draws every figure of ``FIGURES`` from a ``results.StudyData`` into
``out`` (PNG + SVG + the CSV of exactly the numbers drawn) and returns per question the
``blocks.Figure`` records of those that had data. The per-question figures are in
``figures_q.py`` and ``figures_zoo.py``; the frames they draw are ``compute.frames``'.

A forest plot shows each design's paired difference to ``standard`` (same seeds) per task:
loss tasks in % perplexity, accuracy tasks in percentage points, with the 95% CI as a
horizontal bar (none with one seed), equal width filled, parameter-matched open, and the
practical margin as a grey band (a 90% CI inside it reads "equivalent").
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter

from qkvlab.report.blocks import Figure
from qkvlab.studies.qkv.compute import frames
from qkvlab.studies.qkv.compute.effects import Status
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.plan.questions import QUESTIONS
from qkvlab.studies.qkv.plan.references import (
    KAYYAM_1B2_KV_PCT,
    REF_KV_CHARS_PER_TOKEN,
    REF_KV_CITE,
    REF_KV_PPL_PCT,
    per_char,
)
from qkvlab.studies.qkv.plan.vocab import (
    ARMS,
    LM_CHARS_PER_TOKEN,
    METRICS,
    SCALED,
    TASK_METRIC,
    color,
    label,
)
from qkvlab.studies.qkv.render.figures_q import (
    STYLE,
    fig_q1_convex,
    fig_q1_loss,
    fig_q1_scale,
    fig_q2_emergence,
    fig_q2_own,
    fig_q2_pretrained,
    fig_q3_bind,
    fig_q3_kv,
    save,
)
from qkvlab.studies.qkv.render import figures_scaling
from qkvlab.studies.qkv.render.convert import fig_q3_convert
from qkvlab.studies.qkv.render.headwidth import fig_q3_head_width
from qkvlab.studies.qkv.render.payoff import fig_q3_kv_payoff
from qkvlab.studies.qkv.render.uptrain import fig_q3_uptrain
from qkvlab.studies.qkv.render.figures_zoo import fig_q2_zoo, fig_q3_tie_layers
from qkvlab.studies.qkv.render.scale import fig_q1_scale_train



PANELS = {"loss": "perplexity vs standard (%)\n< 0 better · > 0 worse",
          "accuracy": "accuracy − standard (points)\n< 0 worse · > 0 better"}


def _row_label(design: str, task: str, d_head) -> str:
    t = f"{task} (d_head {int(d_head)})" if d_head is not None and not pd.isna(d_head) else task
    return f"{label(design)} · {t}"


# Rows with no verdict: attention not used at this budget (standard does not beat the
# attention-free control) or not learned; drawn, but in grey
NO_VERDICT = (Status.ATTENTION_UNUSED.value, Status.NOT_LEARNED.value)
NO_VERDICT_COLOR = "#b0b0b0"


def _forest_panel(ax, df: pd.DataFrame, panel: str, n_rows: int) -> None:
    """One panel: a row per (design, task), a marker ± CI bar per arm, a line at 0; ``n_rows``
    rows of space (the most of any panel, so that rows are spaced alike side by side)."""
    keys = list(dict.fromkeys(zip(df.design, df.task)))
    labels = []
    for y, (d, t) in enumerate(keys):
        sub = df[(df.design == d) & (df.task == t)]
        labels.append(_row_label(d, t, sub.d_head.iloc[0]))
        for r in sub.itertuples():
            dy = 0.0 if len(sub) == 1 else (-0.16 if r.arm == "equal" else 0.16)
            xerr = None if r.lo is None or pd.isna(r.lo) else [[r.value - r.lo], [r.hi - r.value]]
            c = NO_VERDICT_COLOR if r.status in NO_VERDICT else color(d)
            ax.errorbar(r.value, y + dy, xerr=xerr, fmt="o" if r.arm == "equal" else "s",
                        color=c, mfc=c if r.arm == "equal" else "white",
                        mew=1.5, ms=7, capsize=4, elinewidth=1.6)
    for y, (_, t) in enumerate(keys):  # each row's own margin (its task's metric and unit)
        sc = METRICS[TASK_METRIC[t]]
        ax.fill_betweenx([y - 0.45, y + 0.45], sc.show(-sc.raw_margin), sc.show(sc.raw_margin),
                         color="#dddddd", lw=0, zorder=0)
    ax.axvline(0, color=color("standard"), lw=1)
    ax.set_yticks(range(len(keys)), labels)
    ax.set_ylim(n_rows - 0.5, -0.5)  # first row on top
    ax.grid(False, axis="y")
    ax.set_xlabel(PANELS[panel])


def fig_forest(data: StudyData, out: Path, question: str) -> Figure | None:
    """Forest plot of one question: each design vs standard per task, both arms."""
    df = frames.forest_frame(data, question)
    if df.empty:
        return None
    panels = [p for p in PANELS if p in set(df.panel)]
    n_rows = [df[df.panel == p][["design", "task"]].drop_duplicates().shape[0] for p in panels]
    fig, axes = plt.subplots(1, len(panels), squeeze=False,
                             # one width for every forest plot: the page shows each at full
                             # width, so a narrower one would be scaled up, fonts and all
                             figsize=(10.5, 1.6 + 0.5 * max(n_rows)))
    for ax, p in zip(axes[0], panels):
        _forest_panel(ax, df[df.panel == p], p, max(n_rows))
    arms = [a for a in ARMS if a in set(df.arm)]
    handles = [Line2D([], [], ls="none", marker="o" if a == "equal" else "s", ms=7, mew=1.5,
                      color="#555555", mfc="#555555" if a == "equal" else "white")
               for a in arms]
    fig.legend(handles, [ARMS[a] for a in arms], frameon=False, ncol=len(arms),
               loc="outside lower center",
               title="marker: arm · bar: 95% CI over seeds · grey band: practical margin · "
                     "grey marker: no verdict (attention not used, or not learned)",
               title_fontsize=9)
    name = f"forest_{question}"
    return save(fig, df, out, name, QUESTIONS[question].forest_title,
                 "Paired difference to standard over seeds (same seeds) with its 95% CI; loss "
                 "tasks in % perplexity (lm per subword token, mlm per masked character, "
                 "translate per target token), accuracy tasks in percentage points; the grey "
                 "band is each row's practical margin in its unit (a 90% CI inside it reads "
                 "'equivalent'). Filled: equal "
                 "width; open: parameter-matched; no bar: one seed. Grey: no verdict, because "
                 "standard does not beat the attention-free control by more than the margin "
                 "(attention not used at this budget) or neither design learned the task.")


def fig_forest_q1(data: StudyData, out: Path) -> Figure | None:
    return fig_forest(data, out, "q1")


def fig_forest_q2(data: StudyData, out: Path) -> Figure | None:
    return fig_forest(data, out, "q2")


def fig_forest_q3(data: StudyData, out: Path) -> Figure | None:
    return fig_forest(data, out, "q3")


def fig_scaling(data: StudyData, out: Path) -> Figure | None:
    """One panel per design: its perplexity gap to standard vs parameters, log axis."""
    df = frames.scaling_frame(data)
    if df.empty:
        return None
    designs = [d for d in SCALED if d in set(df.design)]
    fig, axes = plt.subplots(1, len(designs), squeeze=False, sharey=True,
                             figsize=(2.6 * len(designs) + 1.0, 3.4))
    sc = METRICS["val_loss"]
    for ax, d in zip(axes[0], designs):
        g = df[df.design == d]
        lo, hi = (g.value - g.lo).fillna(0), (g.hi - g.value).fillna(0)
        ax.errorbar(g.params, g.value, yerr=[lo, hi], fmt="o-", color=color(d), capsize=3)
        ax.axhspan(sc.show(-sc.raw_margin), sc.show(sc.raw_margin), color="#dddddd", lw=0,
                   zorder=0)
        ax.axhline(0, color=color("standard"), lw=1)
        if d == "tied_kv":  # published points, not measured here
            ax.plot([3e8, 1.2e9], [REF_KV_PPL_PCT, KAYYAM_1B2_KV_PCT], "D", color="#555555",
                    mfc="white",
                    label=f"published ({REF_KV_CITE})")
            ax.legend(fontsize=7, loc="upper left", frameon=False)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide on short spans
        if d != "tied_kv":  # the measured widths, labelled (tied K=V spans to 1.2B)
            ax.set_xticks(list(g.params), [f"{p / 1e3:.0f}k" for p in g.params])
        ax.set_title(label(d), fontsize=10)
        ax.set_xlabel("parameters (standard)")
    axes[0][0].set_ylabel("perplexity vs standard (%)")
    return save(fig, df, out, "scaling", "Does the gap grow with size?",
                 "Each design's paired perplexity difference to standard on lm at three widths "
                 "(same depth and d_head), ± 95% CI over seeds, per subword token (byte-level "
                 f"BPE, ~{LM_CHARS_PER_TOKEN:.1f} characters a token); grey band: the practical "
                 f"margin; diamonds: tied K=V at 300M (+{REF_KV_PPL_PCT}%) and 1.2B parameters "
                 f"(+{KAYYAM_1B2_KV_PCT}%) as published ({REF_KV_CITE}; per-token perplexity with "
                 "EOS padding counted, which dilutes gaps), not measured here. Their tokens "
                 f"span ~{REF_KV_CHARS_PER_TOKEN:g} characters: a per-token ratio r is r^(1/c) "
                 "per character at c characters a token, so their +3.1% is "
                 f"+{per_char(REF_KV_PPL_PCT, REF_KV_CHARS_PER_TOKEN):.2f}% per character, "
                 f"+{per_char(REF_KV_PPL_PCT, REF_KV_CHARS_PER_TOKEN / LM_CHARS_PER_TOKEN):.1f}% "
                 "per token of ours.")


def fig_lr(data: StudyData, out: Path) -> Figure | None:
    """Validation loss vs learning rate per design and task: the grid each rate is chosen on."""
    df = frames.lr_frame(data)
    if df.empty:
        return None
    tasks = list(dict.fromkeys(df.task))
    fig, axes = plt.subplots(1, len(tasks), squeeze=False, figsize=(3.8 * len(tasks) + 1.5, 3.6))
    for ax, task in zip(axes[0], tasks):
        sub = df[df.task == task]
        for (design, arm), g in sub.groupby(["design", "arm"], sort=False):
            g = g.sort_values("lr")
            y = g.val_loss.where(g.val_loss < float("inf"))
            eq = arm == "equal"
            ax.plot(g.lr, y, "o-" if eq else "s--", color=color(design),
                    label=label(design) + ("" if eq else " (matched)"), ms=4, lw=1.3,
                    mfc=None if eq else "white")
            c = g[g.chosen]
            ax.plot(c.lr, c.val_loss, "*", color=color(design), ms=13, mec="black", mew=0.6)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide on short spans
        ax.set_title(task)
        ax.set_xlabel("learning rate")
    axes[0][0].set_ylabel("val loss (val split, mean over tuning seeds)")
    h, lab = axes[0][0].get_legend_handles_labels()
    fig.legend(h, lab, loc="outside right center", frameon=False, fontsize=8)
    return save(fig, df, out, "lr_grid", "Learning rate per design",
                 "Validation loss after training at each rate of the grid, mean over the tuning "
                 "seeds (disjoint from the seeds the comparisons report); solid: equal width, "
                 "dashed: the parameter-matched width (its own rate); star: the rate each "
                 "design's comparisons train at. A missing point: a run diverged.")


FIGURES = {"q1": [fig_forest_q1, fig_q1_loss, fig_q1_scale_train, fig_q1_scale, fig_q1_convex],
           "q2": [fig_forest_q2, fig_q2_own, fig_q2_pretrained, fig_q2_zoo, fig_q2_emergence],
           "q3": [fig_forest_q3, fig_q3_bind, fig_q3_kv, fig_q3_kv_payoff, fig_q3_tie_layers,
                  fig_q3_convert, fig_q3_uptrain, fig_q3_head_width]}


def all_figures(data: StudyData, out: Path) -> dict[str, list[Figure]]:
    """Draw every figure into ``out``; per question the figures that had data."""
    with plt.rc_context(STYLE):
        figs = {q: [f for f in (fn(data, out) for fn in fns) if f is not None]
                for q, fns in FIGURES.items()}
        lr, scaling = fig_lr(data, out), fig_scaling(data, out)
        gap = figures_scaling.figures(data, out)
    return {**figs, "scaling": [scaling] if scaling else [], "setup": [lr] if lr else [],
            "scaling_gap": gap}
