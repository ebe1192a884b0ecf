"""The pretrained zoo's figures. Q2: across every pretrained model analysed, the symmetry of
W_QK and the Q–K / K–V / Q–V subspace overlaps against parameter count, by family (marker) and
attention role (colour), each point beside its random null (grey), with Saponati et al.'s
published median over layers beside ours in the median panel only (filled star: the same
checkpoint, open star: the same family); the numbers are
``compute.zoo.zoo_table``'s. Q3: which layers of a trained decoder tolerate a tie imposed one layer
at a time (``compute.ties.tie_costs``)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from qkvlab.report.blocks import Figure
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.compute.ties import tie_costs
from qkvlab.studies.qkv.compute.zoo import MEASURES, zoo_table
from qkvlab.studies.qkv.plan.references import SAME_CHECKPOINT, SAPONATI_CITE
from qkvlab.studies.qkv.plan.vocab import color
from qkvlab.studies.qkv.render.figures_q import save
from qkvlab.studies.qkv.render.ties import TIE_LABELS

MEASURE_LABELS = {"symmetry_layer_median": "s of W_QK, whole layer, median over layers",
                  "symmetry_layer": "s of W_QK, whole layer, mean over layers",
                  "symmetry": "symmetry s of W_QK, per head",
                  "overlap_qk": "Q–K subspace overlap", "overlap_kv": "K–V subspace overlap",
                  "overlap_qv": "Q–V subspace overlap"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h", "<", ">")


def fig_q2_zoo(data: StudyData, out: Path) -> Figure | None:
    """One panel per measure: mean over heads (coloured, by role) and the random null's 95%
    range (grey bar) per model, x = parameters on a log axis."""
    df = zoo_table(data)
    if df.empty:
        return None
    families = sorted(df.family.unique())
    marker = {f: MARKERS[i % len(MARKERS)] for i, f in enumerate(families)}
    # two rows of three measures, the legend under them (four columns were too wide to read)
    fig, axes = plt.subplots(3, 3, figsize=(11, 8.4), sharex=True,
                             gridspec_kw={"height_ratios": [1, 1, 0.55]})
    flat = axes.ravel()
    for ax, m in zip(flat, MEASURES):
        g = df[df.measure == m]
        for r in g.itertuples():
            ax.vlines(r.params, r.null_lo, r.null_hi, colors="#999999", lw=4, alpha=0.6)
            ax.plot(r.params, r.mean, marker[r.family], color=color(r.role), ms=6,
                    mec="white", mew=0.5)
            if isinstance(r.published_model, str) and r.published == r.published:  # not NaN
                same = r.published_match == SAME_CHECKPOINT
                ax.plot(r.params, r.published, "*", mfc=color(r.role) if same else "none",
                        mec=color(r.role), ms=11)
        ax.set_xscale("log")
        # parameter counts as 30M, 1B: matplotlib's 3×10⁷ minor labels collide on short ranges
        ax.xaxis.set_major_locator(FixedLocator([1e7, 3e7, 1e8, 3e8, 1e9, 3e9]))
        ax.xaxis.set_major_formatter(FuncFormatter(
            lambda x, _: f"{x / 1e6:.0f}M" if x < 1e9 else f"{x / 1e9:g}B"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(MEASURE_LABELS[m], fontsize=9)
        ax.set_ylim(min(-0.05, ax.get_ylim()[0]), max(0.6, ax.get_ylim()[1]))
    for ax in axes[1]:
        ax.set_xlabel("parameters (log)")
        ax.xaxis.set_tick_params(labelbottom=True)
    axes[0, 0].set_ylabel("median over layers")
    axes[1, 0].set_ylabel("mean over heads")
    for ax in axes[2]:
        ax.axis("off")
    roles = [r for r in ("encoder", "decoder", "cross") if r in set(df.role)]
    handles = ([Line2D([], [], ls="", marker="o", color=color(r), label=f"{r} attention")
                for r in roles]
               + [Line2D([], [], ls="", marker=marker[f], color="#444444", label=f)
                  for f in families]
               + [Line2D([], [], color="#999999", lw=4, alpha=0.6,
                         label="random null, 95% of heads"),
                  Line2D([], [], ls="", marker="*", mfc="#444444", mec="#444444", ms=11,
                         label="published median, same checkpoint"),
                  Line2D([], [], ls="", marker="*", mfc="none", mec="#444444", ms=11,
                         label="published median, same family")])
    axes[2, 1].legend(handles=handles, loc="center", frameon=False, fontsize=8, ncol=3)
    models = ", ".join(dict.fromkeys(df.title))
    pub = df[df.published_model.map(lambda p: isinstance(p, str))]
    matched = "; ".join(f"{r.title} {r.role}: {r.published_model} ({r.published_checkpoint}) "
                        f"{r.published:g}, {r.published_match}" for r in pub.itertuples()) \
        or "none in this zoo"
    return save(fig, df, out, "q2_zoo", "What the pretrained zoo shows",
                 f"Per model and attention role, the mean over heads of each measure (colour: "
                 f"role; marker: family) beside the random null of the same shapes (grey: 95% "
                 f"of null heads), against parameter count. Symmetry s = 1 for tied Q=K; an "
                 f"overlap is 1 for identical subspaces and d_head/d_model for random ones. "
                 f"Stars, in the median panel only: the median over layers of the whole-layer "
                 f"symmetry published by {SAPONATI_CITE} (reference, not measured here), filled "
                 f"for the same checkpoint, open for one of the same family ({matched}). "
                 f"Models: {models}.")


def fig_q3_tie_layers(data: StudyData, out: Path) -> Figure | None:
    """Which layers of a trained decoder tolerate a tie: Δ perplexity (%) with the tie imposed
    on one layer at a time, against the layer's relative depth, one line per model, one panel
    per tie measured that way."""
    tc = tie_costs(data)
    if tc.empty:
        return None
    one = tc[(tc.layers.astype(str) != "all") & (tc.stage == "zero-shot")]
    if one.empty:
        return None
    one = one.assign(layer=one.layers.astype(int),
                     depth=one.layers.astype(int) / (one.n_layers - 1).clip(lower=1))
    kinds = list(dict.fromkeys(one.tie))
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 3.6), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for i, (title, g) in enumerate(one[one.tie == kind].groupby("title", sort=False)):
            g = g.sort_values("layer")
            ax.plot(g.depth, g.pct, marker=MARKERS[i % len(MARKERS)], ms=4, lw=1.2,
                    label=f"{title} ({int(g.n_layers.iloc[0])} layers)")
        ax.axhline(0, color="#999999", lw=0.8)
        ax.set_yscale("symlog", linthresh=1)
        ax.set_xlabel("layer tied (relative depth: 0 = first, 1 = last)")
        ax.set_ylabel("Δ held-out perplexity (%)")
        ax.set_title(f"{TIE_LABELS[kind]} in one layer, the others untied", fontsize=9)
        ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    cols = ["model", "title", "tie", "layer", "n_layers", "depth", "ppl", "ppl_base", "pct"]
    return save(fig, one[cols], out, "q3_tie_layers", "Which layers of a trained decoder "
                 "tolerate a tie",
                 "Each point: a zoo decoder with the tie imposed in that one layer (best fit on "
                 "real activations, zero-shot), the change in held-out Bible perplexity against "
                 "the untied model; symmetric log axis (linear within ±1%).")
