"""The study's figures: one forest plot per question, then the per-question figures.

``all_figures(data, out)`` draws every figure of ``FIGURES`` from a ``results.StudyData`` into
``out`` (PNG + SVG + the CSV of exactly the numbers drawn) and returns per question the
``blocks.Figure`` records of those that had data. The look (``PALETTE``, ``LABELS``,
``STYLE``) and the per-question figures are in ``figures_q.py``; this module re-exports them.

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
from qkvlab.studies.qkv.effects import SCALES, effect
from qkvlab.studies.qkv.experiments import SCALED, choose_lrs
from qkvlab.studies.qkv.figures_q import (  # noqa: F401
    ARMS,
    LABELS,
    PALETTE,
    REF_KV_CITE,
    REF_KV_PPL_PCT,
    STYLE,
    TIED_QK,
    _save,
    color,
    diffs,
    fig_q1_convex,
    fig_q1_loss,
    fig_q1_scale,
    fig_q2_emergence,
    fig_q2_own,
    fig_q2_pretrained,
    fig_q3_bind,
    fig_q3_kv,
    label,
    q3_lm,
)
from qkvlab.studies.qkv.figures_zoo import fig_q2_zoo, fig_q3_tie_layers
from qkvlab.studies.qkv.results import TASK_METRIC, StudyData, row_chance, select

# Per question, the rows of its forest plot: (experiments, design, task), top to bottom.
FOREST = {
    "q1": [*(("alt_vs_standard", "alt", t) for t in ("lm", "translate")),
           ("alt_init", "alt_identity", "translate")],
    "q2": [*(("tied_qk_qkv", d, t) for d in TIED_QK for t in ("lm", "mlm", "mqar", "relation")),
           *(("directed_relation", d, t) for d in TIED_QK[:2]
             for t in ("successor", "successor_causal"))],
    "q3": [(("lm_tied_kv", "lm_gqa"), "tied_kv", "lm"), (("lm_tied_kv", "lm_gqa"), "gqa_half", "lm"),
           ("kv_translate", "tied_kv_cross", "translate"), ("bind_vs_dhead", "tied_kv", "bind_codes")],
}
FOREST_TITLES = {"q1": "Q1: the 4th matrix (alt) vs standard",
                 "q2": "Q2: one matrix (tied Q=K, Q=K=V) vs standard",
                 "q3": "Q3: K = V (and GQA, same KV cache) vs standard"}
PANELS = {"loss": "perplexity vs standard (%)\n< 0 better · > 0 worse",
          "accuracy": "accuracy − standard (points)\n< 0 worse · > 0 better"}


def bind_point(rows: pd.DataFrame) -> pd.DataFrame:
    """bind_codes' comparison rows at the largest m and d_head = m: where standard has just
    the width the task needs, so a design that needs more shows it."""
    if rows.empty or "m" not in rows:
        return rows.iloc[0:0]
    m = rows.m.max()
    return rows[(rows.m == m) & (rows.d_head == m)]


def forest_frame(data: StudyData, question: str) -> pd.DataFrame:
    """The rows of a question's forest plot: panel, design, task, arm, d_head, value, half.

    value (lo … hi: 95% CI) is the paired difference to standard as ``effects.effect`` reads
    it: % perplexity for loss tasks, percentage points for accuracy tasks; ``status`` its
    verdict. bind_codes is shown at its largest m and d_head = m, the width the claim says
    standard needs (``bind_point``).
    """
    rows = []
    for exps, design, task in FOREST[question]:
        metric, _ = TASK_METRIC[task]
        cmp = q3_lm(data) if exps == ("lm_tied_kv", "lm_gqa") else data.compared(exps)
        c = diffs(select(cmp, design=design, task=task, metric=metric))
        if c.empty:
            continue
        if task == "bind_codes":
            c = bind_point(c)
        acc = metric == "accuracy"
        for r in c.to_dict("records"):
            ch = row_chance(r, data.profile)
            e = effect(r, not acc)  # the difference even between two guessers, drawn as such
            if e["value"] is None:
                continue
            status = effect(r, not acc, chance=ch)["status"]
            rows.append({"panel": "accuracy" if acc else "loss", "design": design, "task": task,
                         "arm": r.get("arm", "equal"),
                         "d_head": r.get("d_head") if task == "bind_codes" else None,
                         "value": e["value"], "lo": e["lo"], "hi": e["hi"],
                         "status": status, "unit": "points" if acc else "% perplexity"})
    df = pd.DataFrame(rows, columns=["panel", "design", "task", "arm", "d_head", "value", "lo",
                                     "hi", "status", "unit"]).astype({"d_head": "Int64"})
    order = {(d, t): i for i, (_, d, t) in enumerate(FOREST[question])}
    df["_o"] = [order[(d, t)] for d, t in zip(df.design, df.task)]
    arm_o = {a: i for i, a in enumerate(ARMS)}
    df["_a"] = df.arm.map(arm_o)
    return df.sort_values(["_o", "_a"]).drop(columns=["_o", "_a"]).reset_index(drop=True)


def _row_label(design: str, task: str, d_head) -> str:
    t = f"{task} (d_head {int(d_head)})" if d_head is not None and not pd.isna(d_head) else task
    return f"{label(design)} · {t}"


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
            ax.errorbar(r.value, y + dy, xerr=xerr, fmt="o" if r.arm == "equal" else "s",
                        color=color(d), mfc=color(d) if r.arm == "equal" else "white",
                        mew=1.5, ms=7, capsize=4, elinewidth=1.6)
    sc = SCALES["accuracy" if panel == "accuracy" else "val_loss"]
    ax.axvspan(sc.show(-sc.margin), sc.show(sc.margin), color="#dddddd", lw=0, zorder=0)
    ax.axvline(0, color=color("standard"), lw=1)
    ax.set_yticks(range(len(keys)), labels)
    ax.set_ylim(n_rows - 0.5, -0.5)  # first row on top
    ax.grid(False, axis="y")
    ax.set_xlabel(PANELS[panel])


def fig_forest(data: StudyData, out: Path, question: str) -> Figure | None:
    """Forest plot of one question: each design vs standard per task, both arms."""
    df = forest_frame(data, question)
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
               title="marker: arm · bar: 95% CI over seeds · grey band: practical margin",
               title_fontsize=9)
    name = f"forest_{question}"
    return _save(fig, df, out, name, FOREST_TITLES[question],
                 "Paired difference to standard over seeds (same seeds) with its 95% CI; loss "
                 "tasks in % perplexity, accuracy tasks in percentage points; the grey band is "
                 "the practical margin (a 90% CI inside it reads 'equivalent'). Filled: equal "
                 "width; open: parameter-matched; no bar: one seed.")


def fig_forest_q1(data: StudyData, out: Path) -> Figure | None:
    return fig_forest(data, out, "q1")


def fig_forest_q2(data: StudyData, out: Path) -> Figure | None:
    return fig_forest(data, out, "q2")


def fig_forest_q3(data: StudyData, out: Path) -> Figure | None:
    return fig_forest(data, out, "q3")


def scaling_frame(data: StudyData) -> pd.DataFrame:
    """lm_scaling's rows: design, d_model, standard's parameter count, effect (value, lo, hi:
    % perplexity vs standard at that width) and verdict status."""
    cols = ["design", "d_model", "params", "value", "lo", "hi", "status", "seeds"]
    c = diffs(data.compared("lm_scaling", metric="val_loss"))
    rows = []
    for r in c.to_dict("records"):
        e = effect(r, True)
        rows.append({"design": r["design"], "d_model": int(r["d_model"]),
                     "params": r.get("baseline_params"), "value": e["value"], "lo": e["lo"],
                     "hi": e["hi"], "status": e["status"], "seeds": r.get("n_pairs")})
    return pd.DataFrame(rows, columns=cols).sort_values(["design", "d_model"]).reset_index(
        drop=True)


def fig_scaling(data: StudyData, out: Path) -> Figure | None:
    """One panel per design: its perplexity gap to standard vs parameters, log axis."""
    df = scaling_frame(data)
    if df.empty:
        return None
    designs = [d for d in SCALED if d in set(df.design)]
    fig, axes = plt.subplots(1, len(designs), squeeze=False, sharey=True,
                             figsize=(2.6 * len(designs) + 1.0, 3.4))
    sc = SCALES["val_loss"]
    for ax, d in zip(axes[0], designs):
        g = df[df.design == d]
        lo, hi = (g.value - g.lo).fillna(0), (g.hi - g.value).fillna(0)
        ax.errorbar(g.params, g.value, yerr=[lo, hi], fmt="o-", color=color(d), capsize=3)
        ax.axhspan(sc.show(-sc.margin), sc.show(sc.margin), color="#dddddd", lw=0, zorder=0)
        ax.axhline(0, color=color("standard"), lw=1)
        if d == "tied_kv":  # published points, not measured here
            ax.plot([3e8, 1.2e9], [REF_KV_PPL_PCT] * 2, "D", color="#555555", mfc="white",
                    label=f"published ({REF_KV_CITE})")
            ax.legend(fontsize=7, loc="upper left", frameon=False)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide on short spans
        if d != "tied_kv":  # the measured widths, labelled (tied K=V spans to 1.2B)
            ax.set_xticks(list(g.params), [f"{p / 1e3:.0f}k" for p in g.params])
        ax.set_title(label(d), fontsize=10)
        ax.set_xlabel("parameters (standard)")
    axes[0][0].set_ylabel("perplexity vs standard (%)")
    return _save(fig, df, out, "scaling", "Does the gap grow with size?",
                 "Each design's paired perplexity difference to standard on lm at three widths "
                 "(same depth and d_head), ± 95% CI over seeds; grey band: the practical margin; "
                 f"diamonds: tied K=V at 300M and 1.2B parameters as published ({REF_KV_CITE}), "
                 "not measured here.")


def lr_frame(data: StudyData) -> pd.DataFrame:
    """lr_tune's grid: task, design, arm, lr, mean val loss over the tuning seeds (a diverged
    run makes it infinite, drawn as missing), seeds, and whether the comparisons use that
    rate (``edge``: chosen at the end of the grid, so the best rate may lie beyond it)."""
    cols = ["task", "design", "arm", "lr", "val_loss", "seeds", "chosen", "edge"]
    runs = data.runs
    g = runs[runs.experiment == "lr_tune"] if not runs.empty else runs
    if g.empty:
        return pd.DataFrame(columns=cols)
    loss = g.val_loss if "val_loss" in g else pd.Series(float("nan"), index=g.index)
    rows = list(zip(g.task, g.design, g.arm, g.lr, g.status, loss.where(loss.notna(), None)))
    chosen = choose_lrs(data.profile, rows)
    out = []
    for key, sub in g.assign(val_loss=loss).groupby(["task", "design", "arm", "lr"]):
        task, design, arm, lr = key
        ok = (sub.status == "done") & sub.val_loss.notna()
        grid = sorted(g[(g.task == task) & (g.design == design) & (g.arm == arm)].lr.unique())
        pick = chosen.get((task, design, arm))
        out.append({"task": task, "design": design, "arm": arm, "lr": lr,
                    "val_loss": sub.val_loss.mean() if ok.all() else float("inf"),
                    "seeds": len(sub), "chosen": pick == lr,
                    "edge": pick == lr and lr in (grid[0], grid[-1])})
    return pd.DataFrame(out, columns=cols)


def fig_lr(data: StudyData, out: Path) -> Figure | None:
    """Validation loss vs learning rate per design and task: the grid each rate is chosen on."""
    df = lr_frame(data)
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
    axes[0][0].set_ylabel("val loss (mean over tuning seeds)")
    h, lab = axes[0][0].get_legend_handles_labels()
    fig.legend(h, lab, loc="outside right center", frameon=False, fontsize=8)
    return _save(fig, df, out, "lr_grid", "Learning rate per design",
                 "Validation loss after training at each rate of the grid, mean over the tuning "
                 "seeds (disjoint from the seeds the comparisons report); solid: equal width, "
                 "dashed: the parameter-matched width (its own rate); star: the rate each "
                 "design's comparisons train at. A missing point: a run diverged.")


FIGURES = {"q1": [fig_forest_q1, fig_q1_loss, fig_q1_scale, fig_q1_convex],
           "q2": [fig_forest_q2, fig_q2_own, fig_q2_pretrained, fig_q2_zoo, fig_q2_emergence],
           "q3": [fig_forest_q3, fig_q3_bind, fig_q3_kv, fig_q3_tie_layers]}


def all_figures(data: StudyData, out: Path) -> dict[str, list[Figure]]:
    """Draw every figure into ``out``; per question the figures that had data."""
    with plt.rc_context(STYLE):
        figs = {q: [f for f in (fn(data, out) for fn in fns) if f is not None]
                for q, fns in FIGURES.items()}
        lr, scaling = fig_lr(data, out), fig_scaling(data, out)
    return {**figs, "scaling": [scaling] if scaling else [], "setup": [lr] if lr else []}
