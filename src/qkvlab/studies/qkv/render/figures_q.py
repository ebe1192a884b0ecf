"""The study's per-question figures, one function each, and the style every figure is drawn in.

Every ``fig_*(data, out)`` reads a ``results.StudyData`` (tidy DataFrames; no key is parsed),
draws one figure into ``out`` as PNG + SVG + the CSV of exactly the numbers drawn, and returns
a ``blocks.Figure`` record, or None when its data is absent. One color per design everywhere
(``plan.vocab``), mean ± 95% CI (Student t over seeds) as error bars or bands, axes labelled with
units, sized for a laptop screen. The forest plots, ``FIGURES`` and ``all_figures`` are in
``figures.py``.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display (CI, headless machines)
import matplotlib.pyplot as plt
import pandas as pd

from qkvlab.report.blocks import Figure
from qkvlab.studies.qkv.compute.frames import ci_rows, concat, decode_ratios, diffs, q3_lm
from qkvlab.studies.qkv.compute.effects import effect
from qkvlab.studies.qkv.compute.results import StudyData, select
from qkvlab.studies.qkv.plan.experiments import WIDTH_ACCURACY
from qkvlab.studies.qkv.plan.questions import QUESTIONS
from qkvlab.studies.qkv.plan.references import (
    KAYYAM_RERUN_KV_PCT,
    REF_KV_CITE,
    REF_KV_PPL_PCT,
)
from qkvlab.studies.qkv.plan.vocab import (
    ARMS,
    CONTROL,
    TASK_METRIC,
    color,
    label,
    ppl_pct,
)

# The report's style, applied while its figures are drawn (not to matplotlib's global state,
# which other modules, e.g. the analysis figures with their fixed margins, also use).
STYLE = {"font.size": 10, "figure.constrained_layout.use": True, "axes.spines.top": False,
         "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
         "svg.fonttype": "none", "svg.hashsalt": "qkvlab"}  # deterministic SVG ids


def save(fig, df: pd.DataFrame, out: Path, name: str, title: str, caption: str) -> Figure:
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / f"{name}.png", dpi=110)
    fig.savefig(out / f"{name}.svg", metadata={"Date": None})
    plt.close(fig)
    df.to_csv(out / f"{name}.csv", index=False)
    return Figure(name, title, caption, f"{name}.png", f"{name}.svg", f"{name}.csv")


def effect_points(df: pd.DataFrame, cols) -> pd.DataFrame:
    """A gap figure's points: per comparison row with a value, ``cols(row)`` (a dict) then its
    effect's value, lo, hi and status; empty where none has a value."""
    return pd.DataFrame([{**cols(r), "value": e.value, "lo": e.lo, "hi": e.hi,
                          "status": e.status.value}
                         for r in df.to_dict("records") if (e := effect(r)).value is not None])


def ci_bars(g: pd.DataFrame) -> list[pd.Series]:
    """``errorbar``'s yerr for points with value, lo and hi: no bar where there is no CI."""
    return [(g.value - g.lo).fillna(0).clip(lower=0), (g.hi - g.value).fillna(0).clip(lower=0)]


def _half(x) -> float:
    """A CI half-width to draw: 0 (no bar) where there is none (one seed)."""
    return 0.0 if x is None or not math.isfinite(x) else float(x)


def _bars(ax, df: pd.DataFrame, groups: list[str], designs: list[str], ylabel: str) -> None:
    """Grouped bars: mean ± CI per (group, design) from columns group/design/mean/half."""
    w = 0.8 / max(1, len(designs))
    for j, d in enumerate(designs):
        sub = df[df.design == d].set_index("group")
        xs = [i + (j - (len(designs) - 1) / 2) * w for i, g in enumerate(groups) if g in sub.index]
        ys = [sub.loc[g, "mean"] for g in groups if g in sub.index]
        es = [_half(sub.loc[g, "half"]) for g in groups if g in sub.index]
        if xs:
            ax.bar(xs, ys, w, yerr=es, capsize=3, color=color(d), label=label(d), alpha=0.85)
    ax.set_xticks(range(len(groups)), [g.replace(" · ", "\n") for g in groups])
    ax.set_ylabel(ylabel)


def _band(ax, x, mean, half, key: str, lbl: str, fmt: str = "o-", clip=None) -> None:
    """A line of means with a shaded 95% CI band (no band where the CI is NaN)."""
    h = half.fillna(0)
    lo, hi = mean - h, mean + h
    if clip is not None:
        lo, hi = lo.clip(*clip), hi.clip(*clip)
    ax.plot(x, mean, fmt, color=color(key), label=lbl, ms=4)
    ax.fill_between(x, lo, hi, color=color(key), alpha=0.18, lw=0)


# ---- Q1 --------------------------------------------------------------------------------------
def fig_q1_loss(data: StudyData, out: Path) -> Figure | None:
    """alt vs standard: test loss on lm and translate and chrF on translate, mean ± CI over
    seeds, equal width and parameter-matched."""
    cols = ["metric", "task", "arm", "design", "group", "n", "mean", "half"]
    cmp = data.compared("alt_vs_standard")
    # lm's and translate's own losses (nats per token of each one's BPE), then chrF
    parts = [cmp[cmp.metric.isin([TASK_METRIC["lm"], TASK_METRIC["translate"]])]
             if not cmp.empty else cmp, select(cmp, metric="chrf")]
    parts = [p.dropna(subset=["mean"]) if not p.empty else p for p in parts]
    if parts[0].empty and parts[1].empty:
        return None
    loss, chrf = (p.assign(group=p.task + " · " + p.arm) if not p.empty else p for p in parts)
    panels = [(p, y) for p, y in ((loss, "test loss (nats/token)"),
                                  (chrf, "translate chrF (0–100)")) if not p.empty]
    fig, axes = plt.subplots(1, len(panels), figsize=(9, 3.6), squeeze=False,
                             width_ratios=[max(1, p.group.nunique()) for p, _ in panels])
    for ax, (p, ylabel) in zip(axes[0], panels):
        _bars(ax, p, sorted(p.group.unique()), ["standard", "alt"], ylabel)
        if p is loss:
            lo = (p["mean"] - p["half"].fillna(0)).min()
            ax.set_ylim(max(0, lo * 0.9), None)
    axes[0][0].legend(frameon=False, fontsize=8)
    df = concat([p[cols] for p, _ in panels])
    return save(fig, df, out, "q1_alt_loss", "alt vs standard: test loss and chrF",
                 "Mean ± 95% CI over seeds. 'matched': alt narrowed to standard's parameter "
                 "count; test split. chrF: greedy translations of test pairs.")


def fig_q1_scale(data: StudyData, out: Path) -> Figure | None:
    """Scale probe: saturation, entropy and ‖∇W_Q‖ at init and the final test loss vs d_k, per
    placement of 1/√d_k."""
    pr = data.probe
    if pr.empty:
        return None
    init = pr[(pr.step == 0) & (pr.stat != "val_loss")].assign(when="init")
    end = pr[pr.stat == "val_loss"].assign(when="end")
    df = ci_rows(concat([init, end]), ["when", "stat", "scale", "d_head"], "value")
    panels = [("saturated", "saturated rows at init (share)"),
              ("norm_entropy", "softmax entropy / log(#keys) at init"),
              ("grad_WQ", "‖∇W_Q‖ at init (Frobenius)"), ("val_loss", "final test loss (nats)")]
    fig, axes = plt.subplots(1, 4, figsize=(12, 3.4))
    for ax, (stat, ylabel) in zip(axes, panels):
        for scale in ("inside", "outside", "both", "none"):
            g = df[(df.stat == stat) & (df.scale == scale)].sort_values("d_head")
            if not g.empty:
                _band(ax, g.d_head, g["mean"], g["half"], scale, scale)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("d_k (head width)")
        ax.set_ylabel(ylabel)
        if stat == "grad_WQ" and (df[df.stat == stat]["mean"] > 0).all():
            ax.set_yscale("log")
    axes[0].legend(title="1/√d_k placed", frameon=False, fontsize=8)
    return save(fig, df, out, "q1_scale_probe", "Mechanism: 1/√d_k at a unit-variance init",
                 "Unit-variance q, k at init (the regime of the 1/√d_k argument), not the "
                 "initialization trained from: the mechanism beside the trained verdicts "
                 "(figure: where 1/√d_k sits, trained on lm). Bands: 95% CI over probe seeds "
                 "(none with one seed).")


def fig_q1_convex(data: StudyData, out: Path) -> Figure | None:
    """Head outputs outside the range of the values: standard (convex) vs alt."""
    cv = data.measure("convex_range")
    if cv.empty:
        return None
    share = ci_rows(cv, ["design"], "outside_share", 100.0)
    share["group"] = "outside the values' range (%)"
    ratio = ci_rows(cv, ["design"], "range_ratio")
    ratio["group"] = "output range / value range"
    df = concat([share, ratio])[["group", "design", "n", "mean", "half"]]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, grp in zip(axes, df.group.unique()):
        _bars(ax, df[df.group == grp], [grp], ["standard", "alt"], grp)
        ax.set_xticks([])
    axes[0].legend(frameon=False)
    return save(fig, df, out, "q1_convex", "Convex combination of the values",
                 "Trained lm models, one validation batch; mean ± 95% CI over seeds.")


# ---- Q2 --------------------------------------------------------------------------------------


def fig_q2_own(data: StudyData, out: Path) -> Figure | None:
    """Attention weight on a token's own position, per design and task."""
    ow = data.measure("own_position")
    if ow.empty:
        return None
    df = ci_rows(ow, ["design", "task"], "own_weight").rename(columns={"task": "group"})
    df = df.merge(ow.groupby("task", as_index=False).uniform.mean()
                  .rename(columns={"task": "group"}), on="group")
    fig, ax = plt.subplots(figsize=(8, 3.4))
    designs = [d for d in ("standard", *QUESTIONS["q2"].designs("tied_qk_qkv"))
               if d in set(df.design)]
    groups = sorted(df.group.unique())
    _bars(ax, df, groups, designs, "weight on own position")
    for i, g in enumerate(groups):
        ax.hlines(df[df.group == g].uniform.iloc[0], i - 0.45, i + 0.45, colors="#777777",
                  linestyles="dashed", label="uniform over visible keys" if i == 0 else None)
    ax.legend(frameon=False, fontsize=8)
    return save(fig, df, out, "q2_own_position", "How much a head attends to itself",
                 "Mean attention weight on the query's own position (causal rows 1…T−1), "
                 "trained models, mean ± 95% CI over seeds.")


def fig_q2_pretrained(data: StudyData, out: Path) -> Figure | None:
    """Symmetry of W_QK per layer in pretrained models, against the random null and the
    published values."""
    pt = data.measure("pretrained")
    if pt.empty or "level" not in pt:
        return None
    pt = pt.rename(columns={"spec.source": "model"})
    lay = select(pt, level="layer", measure="symmetry")
    if lay.empty:
        return None
    null = select(pt, level="summary", measure="symmetry")[["model", "role", "null_lo", "null_hi"]]
    df = lay[["model", "role", "layer", "value"]].rename(columns={"value": "symmetry"})
    df = df.astype({"layer": int}).merge(null, on=["model", "role"], how="left")
    last = df.groupby(["model", "role"]).layer.transform("max").clip(lower=1)
    df = df.assign(rel_depth=df.layer / last).sort_values(["model", "role", "layer"])
    fig, ax = plt.subplots(figsize=(9, 3.8))
    styles = {"minilm": "o-", "whisper-tiny": "s--", "smollm2": "^:"}
    for (m, role), g in df.groupby(["model", "role"]):
        ax.plot(g.rel_depth, g.symmetry, styles.get(m, "o-"), color=color(role),
                label=f"{m} · {role}", ms=4)
    if df.null_lo.notna().any():
        ax.axhspan(df.null_lo.min(), df.null_hi.max(), color="#999999", alpha=0.25,
                   label="random null (95% of heads)")
    for name in ("BERT-base", "GPT-2"):
        if name in data.published:
            v = data.published[name]
            ax.axhline(v, color="#555555", lw=0.8, ls="-.")
            ax.text(1.01, v, f"{name} {v:.2f} (published)", fontsize=8, va="center",
                    transform=ax.get_yaxis_transform())
    ax.set_xlabel("relative depth (layer / last layer)")
    ax.set_ylabel("symmetry s of W_QK (mean over heads)")
    fig.legend(frameon=False, fontsize=8, ncol=4, loc="outside lower center")
    return save(fig, df.reset_index(drop=True), out, "q2_pretrained_symmetry",
                 "Symmetry of W_QK in pretrained models",
                 f"s = 1 for tied Q=K, ≈0 for independent random W_Q, W_K. Published values: "
                 f"{data.published_source} (reference, not measured here).")


def fig_q2_emergence(data: StudyData, out: Path) -> Figure | None:
    """Symmetry of W_QK during training: encoder (mlm) vs decoder (lm) from the same init."""
    se = data.measure("symmetry_steps")
    if se.empty or "kind" not in se:
        return None
    # self-attention of each kind: the encoder's in an encoder, the decoder's in a decoder
    se = se[se.role == se.kind]
    if se.empty:
        return None
    df = ci_rows(se, ["kind", "step"], "symmetry")
    tasks = se.groupby("kind").task.first() if "task" in se else pd.Series(dtype=object)
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for kind, g in df.groupby("kind"):
        g = g.sort_values("step")
        _band(ax, g.step, g["mean"], g["half"], kind,
              f"{kind} ({tasks[kind]})" if kind in tasks else kind)
    ax.set_xlabel("training step")
    ax.set_ylabel("symmetry s of W_QK")
    ax.legend(frameon=False)
    return save(fig, df, out, "q2_symmetry_emergence", "Does symmetry emerge in encoders?",
                 "qkvlab models trained as encoder and decoder from identical initial weights; "
                 "mean ± 95% CI over seeds.")


# ---- Q3 --------------------------------------------------------------------------------------


def fig_q3_bind(data: StudyData, out: Path) -> Figure | None:
    """bind_codes accuracy vs d_head, one panel per m: standard, tied K=V and the
    parameter-matched tied K=V, with the accuracy the width price is read at."""
    df = select(data.compared("bind_vs_dhead"), metric="accuracy")
    if df.empty or "m" not in df:
        return None
    df = df[["m", "design", "arm", "d_head", "n", "mean", "half"]].astype({"m": int, "d_head": int})
    df = df.sort_values(["m", "design", "arm", "d_head"]).reset_index(drop=True)
    ms = sorted(df.m.unique())
    fig, axes = plt.subplots(1, len(ms), figsize=(3.3 * len(ms) + 1.6, 3.5), squeeze=False,
                             sharey=True)
    for ax, m in zip(axes[0], ms):
        sub = df[df.m == m]
        for (d, arm), g in sub.groupby(["design", "arm"]):
            if d == "standard" and arm == "matched":
                continue  # standard's matched arm is its equal-width run
            # a t-interval over a few seeds can pass 100%; accuracy cannot (the CSV keeps it raw)
            _band(ax, g.d_head, 100 * g["mean"], 100 * g["half"], d,
                  f"{label(d)} · {ARMS[arm]}", "o-" if arm == "equal" else "s--", clip=(0, 100))
        ax.axhline(100 * WIDTH_ACCURACY, color="0.4", lw=0.8, ls="--")
        ax.axhline(100 / 2 ** m, color="0.6", lw=0.8, ls=":")
        for x in (m, 2 * m):
            ax.axvline(x, color="0.85", lw=3, zorder=0)
        ax.set_xticks(sorted(sub.d_head.unique()))
        ax.set_title(f"m = {m} bits of key and of value")
        ax.set_xlabel("d_head (one head)")
    axes[0][0].set_ylabel("accuracy (%)")
    h, lab = axes[0][0].get_legend_handles_labels()
    fig.legend(h, lab, loc="outside right center", frameon=False, fontsize=8)
    return save(fig, df, out, "q3_bind", "The width price of K = V",
                 "bind_codes: each item carries an m-bit key and an m-bit value code; mean ± 95% "
                 f"CI over seeds (the CSV holds fractions). Dashed: {WIDTH_ACCURACY:.0%}, the "
                 "accuracy the needed width is read at; dotted: chance (1/2^m); grey bars: "
                 "d_head = m and 2m, the widths standard and tied K=V are predicted to need. A "
                 "parameter-matched point sits at the width of the standard head it matches.")


def fig_q3_kv(data: StudyData, out: Path) -> Figure | None:
    """K=V quality (perplexity change vs standard) and its payoff (cache bytes, decode speed)."""
    q = concat([diffs(select(q3_lm(data), metric="val_loss")),
                diffs(select(data.compared("kv_translate"), metric=TASK_METRIC["translate"]))])
    if not q.empty:  # the control's gap (tens of %) would set the axis; its table row has it
        q = q[q.design != CONTROL]
    perf = decode_ratios(data)
    if q.empty and perf.empty:
        return None
    rows = pd.DataFrame()
    if not q.empty:
        h = q["diff_half"].fillna(0)
        rows = pd.DataFrame({"design": q.design, "arm": q.arm, "task": q.task,
                             "ppl_pct": ppl_pct(q["diff"]),
                             "lo": ppl_pct(q["diff"] - h),
                             "hi": ppl_pct(q["diff"] + h)}).reset_index(drop=True)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, r in rows.iterrows():
        axes[0].errorbar(i, r.ppl_pct, yerr=[[r.ppl_pct - r.lo], [r.hi - r.ppl_pct]],
                         fmt="o" if r.arm == "equal" else "s", color=color(r.design),
                         mfc=color(r.design) if r.arm == "equal" else "white", capsize=3)
    axes[0].set_xticks(range(len(rows)), [f"{label(r.design)}\n{r.task} · {r.arm}"
                                          for r in rows.itertuples()], fontsize=7)
    axes[0].axhline(0, color=color("standard"), lw=1)
    axes[0].axhline(REF_KV_PPL_PCT, color="#555555", ls="-.", lw=0.8)
    axes[0].text(0.99, REF_KV_PPL_PCT, f"+{REF_KV_PPL_PCT}% published (300M)", fontsize=7,
                 ha="right", va="bottom", transform=axes[0].get_yaxis_transform())
    axes[0].axhline(KAYYAM_RERUN_KV_PCT, color="#555555", ls=":", lw=0.8)
    axes[0].text(0.99, KAYYAM_RERUN_KV_PCT, f"+{KAYYAM_RERUN_KV_PCT}% their corrected rerun",
                 fontsize=7, ha="right", va="top", transform=axes[0].get_yaxis_transform())
    axes[0].set_ylabel("perplexity vs standard (%)")
    for j, r in perf.iterrows():
        axes[1].bar([j - 0.2], [r.cache_vs_standard], 0.4, color=color(r.design), alpha=0.85)
        axes[1].bar([j + 0.2], [r.decode_vs_standard], 0.4, color=color(r.design), alpha=0.45,
                    hatch="//")
    axes[1].set_xticks(range(len(perf)), [label(d) for d in perf.get("design", [])], fontsize=8)
    axes[1].set_ylabel("relative to standard (×)")
    axes[1].set_title("solid: KV-cache bytes/token · hatched: decode tokens/s", fontsize=9)
    df = concat([rows.assign(panel="quality"), perf.assign(panel="cost")])
    return save(fig, df, out, "q3_kv", "K = V: what it costs and what it saves",
                 f"Left: exp(Δ test loss) − 1, ± 95% CI over seeds (filled: equal width, open: "
                 f"parameter-matched), per subword token (lm: byte-level BPE; translate: its "
                 f"own target BPE); dash-dot: published reference ({REF_KV_CITE}), per token of "
                 f"a decoder LM, so it stands beside the lm points only. Right: one "
                 f"interleaved measurement, batch-1 greedy decoding.")

