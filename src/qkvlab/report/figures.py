"""The report's figures, one function each: PNG + SVG + the CSV of the numbers drawn.

Every ``fig_*(data, out_dir)`` takes the dict of ``collect.collect`` and returns a ``Figure``
record (or None when its data is absent). One colour per design everywhere (``PALETTE``),
mean ± 95% CI as error bars or bands, axes labelled with units, sized for a laptop screen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display (CI, headless machines)
import matplotlib.pyplot as plt
import pandas as pd

from qkvlab.report import sources as S
from qkvlab.report.verdicts import REF_KV_PPL_PCT, emergence_series

# Okabe-Ito colours (readable by colour-blind readers); one per design, scale placement, role.
PALETTE = {
    "standard": "#000000", "alt": "#D55E00", "tied_qk": "#0072B2",
    "tied_qk_selfmask": "#56B4E9", "tied_qkv": "#CC79A7", "tied_kv": "#009E73",
    "tied_kv_cross": "#009E73", "gqa_half": "#E69F00",
    "inside": "#0072B2", "outside": "#D55E00", "both": "#009E73", "none": "#CC79A7",
    "encoder": "#0072B2", "decoder": "#D55E00", "cross": "#009E73",
}
LABELS = {"standard": "standard", "alt": "alt (4th matrix)", "tied_qk": "tied Q=K",
          "tied_qk_selfmask": "tied Q=K + self-mask", "tied_qkv": "Q=K=V",
          "tied_kv": "tied K=V", "tied_kv_cross": "tied K=V (cross)",
          "gqa_half": "GQA (n_kv = n_heads/2)"}
# The report's style, applied while its figures are drawn (not to matplotlib's global state,
# which other modules, e.g. the analysis figures with their fixed margins, also use).
STYLE = {"font.size": 10, "figure.constrained_layout.use": True, "axes.spines.top": False,
         "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
         "svg.fonttype": "none", "svg.hashsalt": "qkvlab"}  # deterministic SVG ids


@dataclass
class Figure:
    name: str
    title: str
    caption: str
    png: str
    svg: str
    csv: str


def color(key: str) -> str:
    return PALETTE.get(key, "#777777")


def _save(fig, df: pd.DataFrame, out: Path, name: str, title: str, caption: str) -> Figure:
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / f"{name}.png", dpi=110)
    fig.savefig(out / f"{name}.svg", metadata={"Date": None})
    plt.close(fig)
    df.to_csv(out / f"{name}.csv", index=False)
    return Figure(name, title, caption, f"{name}.png", f"{name}.svg", f"{name}.csv")


def _half(x) -> float:
    return 0.0 if x is None or not math.isfinite(x) else x


def _bars(ax, df: pd.DataFrame, groups: list[str], designs: list[str], ylabel: str) -> None:
    """Grouped bars: mean ± CI per (group, design) from columns group/design/mean/half."""
    w = 0.8 / max(1, len(designs))
    for j, d in enumerate(designs):
        sub = df[df.design == d].set_index("group")
        xs = [i + (j - (len(designs) - 1) / 2) * w for i, g in enumerate(groups) if g in sub.index]
        ys = [sub.loc[g, "mean"] for g in groups if g in sub.index]
        es = [_half(sub.loc[g, "half"]) for g in groups if g in sub.index]
        ax.bar(xs, ys, w, yerr=es, capsize=3, color=color(d), label=LABELS.get(d, d), alpha=0.85)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)


def _compare_frame(rows: list[dict], metric: str) -> pd.DataFrame:
    keep = [{"task": r["task"], "arm": r.get("arm"), "design": r["design"], "n": r["n"],
             "mean": r["mean"], "half": r["half"], "rel_pct": r.get("rel_pct"),
             "rel_half": r.get("rel_half"), "diff": r.get("diff"), "diff_half": r.get("diff_half"),
             "p": r.get("p"), "n_params": r.get("n_params"), "d_head": r.get("d_head")}
            for r in rows if r.get("metric") == metric]
    return pd.DataFrame(keep)


# ---- Q1 --------------------------------------------------------------------------------------
def fig_q1_loss(data: dict, out: Path) -> Figure | None:
    """alt vs standard: val loss ± CI on lm and translate, equal width and parameter-matched."""
    df = _compare_frame(data["q1"]["loss"], "val_loss")
    if df.empty:
        return None
    df["group"] = df.task + " · " + df.arm
    groups = sorted(df.group.unique())
    fig, ax = plt.subplots(figsize=(8, 3.6))
    _bars(ax, df, groups, ["standard", "alt"], "validation loss (nats/token)")
    lo = (df["mean"] - df["half"].fillna(0)).min()
    ax.set_ylim(max(0, lo * 0.9), None)
    ax.legend(frameon=False)
    return _save(fig, df, out, "q1_alt_loss", "alt vs standard: validation loss",
                 "Mean ± 95% CI over seeds. 'matched': alt narrowed to standard's parameter count.")


def fig_q1_scale(data: dict, out: Path) -> Figure | None:
    """Scale probe: saturation, entropy and ‖∇W_Q‖ at init vs d_k, per scale placement."""
    pr = pd.DataFrame(data["q1"]["probe"])
    if pr.empty:
        return None
    init = pr[(pr.step == 0) & (pr.stat != "val_loss")]
    end = pr[pr.stat == "val_loss"]
    agg = pd.concat([init.assign(when="init"), end.assign(when="end")])
    rows = []
    for (when, stat, scale, dh), g in agg.groupby(["when", "stat", "scale", "d_head"]):
        m = S.mean_ci(g.value.tolist())
        rows.append({"when": when, "stat": stat, "scale": scale, "d_head": dh,
                     "mean": m["mean"], "half": m["half"], "n": m["n"]})
    df = pd.DataFrame(rows)
    panels = [("saturated", "saturated rows at init (share)"),
              ("norm_entropy", "softmax entropy / log(#keys) at init"),
              ("grad_WQ", "‖∇W_Q‖ at init (Frobenius)"), ("val_loss", "final val loss (nats)")]
    fig, axes = plt.subplots(1, 4, figsize=(12, 3.4))
    for ax, (stat, ylabel) in zip(axes, panels):
        for scale in ("inside", "outside", "both", "none"):
            g = df[(df.stat == stat) & (df.scale == scale)].sort_values("d_head")
            if g.empty:
                continue
            ax.plot(g.d_head, g["mean"], "o-", color=color(scale), label=scale)
            h = g["half"].fillna(0)
            ax.fill_between(g.d_head, g["mean"] - h, g["mean"] + h, color=color(scale), alpha=0.2)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("d_k (head width)")
        ax.set_ylabel(ylabel)
        if stat == "grad_WQ":
            ax.set_yscale("log")
    axes[0].legend(title="1/√d_k placed", frameon=False, fontsize=8)
    return _save(fig, df, out, "q1_scale_probe", "Where must 1/√d_k sit?",
                 "Unit-variance q, k at init (the regime of the 1/√d_k argument). Bands: 95% CI "
                 "over probe seeds (none with one seed).")


def fig_q1_convex(data: dict, out: Path) -> Figure | None:
    """Head outputs outside the range of the values: standard (convex) vs alt."""
    cv = pd.DataFrame(data["q1"]["convex"])
    if cv.empty:
        return None
    rows = []
    for d, g in cv.groupby("design"):
        for col, grp in (("outside_share", "outside the values' range (%)"),
                         ("range_ratio", "output range / value range")):
            vals = g[col].tolist() if col == "range_ratio" else (100 * g[col]).tolist()
            m = S.mean_ci(vals)
            rows.append({"design": d, "group": grp, "mean": m["mean"], "half": m["half"]})
    df = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, grp in zip(axes, df.group.unique()):
        _bars(ax, df[df.group == grp], [grp], ["standard", "alt"], grp)
        ax.set_xticks([])
    axes[0].legend(frameon=False)
    return _save(fig, df, out, "q1_convex", "Convex combination of the values",
                 "Trained lm models, one validation batch; mean ± 95% CI over seeds.")


# ---- Q2 --------------------------------------------------------------------------------------
def _rel_panel(ax, rows: list[dict], designs: list[str], tasks: list[str], acc: bool) -> list[dict]:
    """Paired difference to standard (rel % or points) ± CI, one marker per design and arm."""
    drawn = []
    for j, d in enumerate(designs):
        for k, arm in enumerate(("equal", "matched")):
            for i, t in enumerate(tasks):
                r = next((r for r in rows if r["design"] == d and r["task"] == t
                          and r.get("arm") == arm), None)
                if r is None or r.get("diff") is None:
                    continue
                v, h = ((100 * r["diff"], 100 * _half(r["diff_half"])) if acc
                        else (r["rel_pct"], _half(r["rel_half"])))
                x = i + (j - (len(designs) - 1) / 2) * 0.22 + (k - 0.5) * 0.08
                ax.errorbar(x, v, yerr=h, fmt="o" if arm == "equal" else "s", color=color(d),
                            mfc=color(d) if arm == "equal" else "white", capsize=3,
                            label=f"{LABELS.get(d, d)} · {arm}")
                drawn.append({"design": d, "arm": arm, "task": t, "value": v, "half": h})
    ax.axhline(0, color=color("standard"), lw=1)
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel("accuracy − standard (points)" if acc else "val loss vs standard (%)")
    return drawn


def fig_q2_tasks(data: dict, out: Path) -> Figure | None:
    """tied Q=K (± self-mask) and Q=K=V vs standard on lm, mlm (loss) and mqar, relation (accuracy)."""
    rows = [r for r in data["q2"]["tasks"] if r["design"] != "standard"
            and r["metric"] in ("val_loss", "accuracy")]
    if not rows:
        return None
    designs = ["tied_qk", "tied_qk_selfmask", "tied_qkv"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    d1 = _rel_panel(axes[0], [r for r in rows if r["metric"] == "val_loss"], designs,
                    ["lm", "mlm"], acc=False)
    d2 = _rel_panel(axes[1], [r for r in rows if r["metric"] == "accuracy"], designs,
                    ["mqar", "relation"], acc=True)
    h, lab = axes[0].get_legend_handles_labels()
    uniq = dict(zip(lab, h))
    axes[1].legend(uniq.values(), uniq.keys(), frameon=False, fontsize=8, loc="best")
    return _save(fig, pd.DataFrame(d1 + d2), out, "q2_tied_tasks",
                 "One matrix: tied Q=K and Q=K=V vs standard",
                 "Paired difference to standard over seeds ± 95% CI; filled: equal width, "
                 "open: parameter-matched. Above 0 = worse loss / better accuracy.")


def fig_q2_own(data: dict, out: Path) -> Figure | None:
    """Attention weight on a token's own position, per design, lm and relation."""
    ow = pd.DataFrame(data["q2"]["own"])
    if ow.empty:
        return None
    rows = []
    for (d, t), g in ow.groupby(["design", "task"]):
        m = S.mean_ci(g.own_weight.tolist())
        rows.append({"design": d, "group": t, "mean": m["mean"], "half": m["half"],
                     "uniform": g.uniform.mean()})
    df = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(8, 3.4))
    designs = [d for d in ("standard", "tied_qk", "tied_qk_selfmask", "tied_qkv") if d in set(df.design)]
    groups = sorted(df.group.unique())
    _bars(ax, df, groups, designs, "weight on own position")
    for i, g in enumerate(groups):
        u = df[df.group == g].uniform.mean()
        ax.hlines(u, i - 0.45, i + 0.45, colors="#777777", linestyles="dashed",
                  label="uniform over visible keys" if i == 0 else None)
    ax.legend(frameon=False, fontsize=8)
    return _save(fig, df, out, "q2_own_position", "How much a head attends to itself",
                 "Mean attention weight on the query's own position (causal rows 1…T−1), "
                 "trained models, mean ± 95% CI over seeds.")


def fig_q2_pretrained(data: dict, out: Path) -> Figure | None:
    """Symmetry of W_QK per layer in pretrained models, against the random null and published values."""
    rows = []
    for r in data["q2"]["pretrained"]:
        for k, v in r.items():
            if k.startswith("layer/") and k.endswith("/symmetry"):
                role, layer = k.split("/")[1].rsplit(".", 1)
                s = f"summary/{role}/symmetry"
                rows.append({"model": r["source"], "role": role, "layer": int(layer), "symmetry": v,
                             "null_lo": r.get(f"{s}/null_lo"), "null_hi": r.get(f"{s}/null_hi")})
    df = pd.DataFrame(rows)
    if df.empty:
        return None
    fig, ax = plt.subplots(figsize=(9, 3.8))
    styles = {"minilm": "o-", "whisper-tiny": "s--", "smollm2": "^:"}
    for (m, role), g in df.groupby(["model", "role"]):
        g = g.sort_values("layer")
        ax.plot(g.layer / max(1, g.layer.max()), g.symmetry, styles.get(m, "o-"), color=color(role),
                label=f"{m} · {role}", ms=4)
    lo, hi = df.null_lo.min(), df.null_hi.max()
    ax.axhspan(lo, hi, color="#999999", alpha=0.25, label="random null (95% of heads)")
    for name, v in data["q2"]["published"].items():
        if name in ("BERT-base", "GPT-2"):
            ax.axhline(v, color="#555555", lw=0.8, ls="-.")
            ax.text(1.01, v, f"{name} {v:.2f} (published)", fontsize=8, va="center",
                    transform=ax.get_yaxis_transform())
    ax.set_xlabel("relative depth (layer / last layer)")
    ax.set_ylabel("symmetry s of W_QK (mean over heads)")
    ax.legend(frameon=False, fontsize=7, ncol=2, loc="upper right")
    return _save(fig, df, out, "q2_pretrained_symmetry", "Symmetry of W_QK in pretrained models",
                 f"s = 1 for tied Q=K, ≈0 for independent random W_Q, W_K. Published values: "
                 f"{data['q2']['published_source']} (reference, not measured here).")


def fig_q2_emergence(data: dict, out: Path) -> Figure | None:
    """Symmetry of W_QK during training: encoder (mlm) vs decoder (lm) from the same init."""
    ser = emergence_series(data["q2"]["emergence"])
    rows = []
    for kind, steps in ser.items():
        for step, vals in steps.items():
            m = S.mean_ci(vals)
            rows.append({"kind": kind, "step": step, "mean": m["mean"], "half": m["half"], "n": m["n"]})
    df = pd.DataFrame(rows)
    if df.empty:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for kind, g in df.groupby("kind"):
        g = g.sort_values("step")
        h = g["half"].fillna(0)
        ax.plot(g.step, g["mean"], "o-", color=color(kind), label=f"{kind} ({'mlm' if kind == 'encoder' else 'lm'})")
        ax.fill_between(g.step, g["mean"] - h, g["mean"] + h, color=color(kind), alpha=0.2)
    ax.set_xlabel("training step")
    ax.set_ylabel("symmetry s of W_QK")
    ax.legend(frameon=False)
    return _save(fig, df, out, "q2_symmetry_emergence", "Does symmetry emerge in encoders?",
                 "qkvlab models trained as encoder and decoder from identical initial weights; "
                 "mean ± 95% CI over seeds.")


# ---- Q3 --------------------------------------------------------------------------------------
def fig_q3_bind(data: dict, out: Path) -> Figure | None:
    """bind accuracy vs d_head, tied K=V vs standard, equal width and parameter-matched."""
    df = _compare_frame(data["q3"]["bind"], "accuracy")
    if df.empty:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for (d, arm), g in df.groupby(["design", "arm"]):
        g = g.sort_values("d_head")
        h = g["half"].fillna(0)
        ls = "-" if arm == "equal" else "--"
        ax.plot(g.d_head, 100 * g["mean"], "o" + ls, color=color(d), label=f"{LABELS.get(d, d)} · {arm}")
        # a t-interval over a few seeds can pass 100%; accuracy cannot (the CSV keeps it raw)
        lo, hi = (100 * (g["mean"] - h)).clip(0, 100), (100 * (g["mean"] + h)).clip(0, 100)
        ax.fill_between(g.d_head, lo, hi, color=color(d), alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("d_head")
    ax.set_ylabel("bind accuracy (%)")
    ax.legend(frameon=False, fontsize=8)
    return _save(fig, df, out, "q3_bind", "Binding: does K = V lose capacity?",
                 "Mean ± 95% CI over seeds. The standard baseline is the same model in both arms.")


def fig_q3_kv(data: dict, out: Path) -> Figure | None:
    """K=V quality (perplexity change vs standard) and its payoff (cache bytes, decode speed)."""
    q = data["q3"]
    rows = []
    for src, task in ((q["lm"], "lm"), (q["translate"], "translate")):
        for r in src:
            if r["design"] != "standard" and r["metric"] == "val_loss" and r.get("diff") is not None:
                h = _half(r["diff_half"])
                rows.append({"design": r["design"], "arm": r["arm"], "task": task,
                             "ppl_pct": 100 * (math.exp(r["diff"]) - 1),
                             "lo": 100 * (math.exp(r["diff"] - h) - 1),
                             "hi": 100 * (math.exp(r["diff"] + h) - 1)})
    dec = q["decode"]
    if not rows and not dec:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for i, r in enumerate(rows):
        axes[0].errorbar(i, r["ppl_pct"], yerr=[[r["ppl_pct"] - r["lo"]], [r["hi"] - r["ppl_pct"]]],
                         fmt="o" if r["arm"] == "equal" else "s", color=color(r["design"]),
                         mfc=color(r["design"]) if r["arm"] == "equal" else "white", capsize=3)
    axes[0].set_xticks(range(len(rows)), [f"{LABELS.get(r['design'], r['design'])}\n{r['task']} · {r['arm']}"
                                          for r in rows], fontsize=7)
    axes[0].axhline(0, color=color("standard"), lw=1)
    axes[0].axhline(REF_KV_PPL_PCT, color="#555555", ls="-.", lw=0.8)
    axes[0].text(0.99, REF_KV_PPL_PCT, f"+{REF_KV_PPL_PCT}% published (300M–1.2B)", fontsize=7,
                 ha="right", va="bottom", transform=axes[0].get_yaxis_transform())
    axes[0].set_ylabel("perplexity vs standard (%)")
    labels = [d for d in ("standard", "tied_kv", "gqa_half") if f"{d}/cache_bytes_per_token" in dec]
    base_c, base_d = dec.get("standard/cache_bytes_per_token"), dec.get("standard/decode_tokens_per_s")
    perf = []
    for j, d in enumerate(labels):
        c = dec[f"{d}/cache_bytes_per_token"] / base_c
        s = dec[f"{d}/decode_tokens_per_s"] / base_d
        axes[1].bar([j - 0.2], [c], 0.4, color=color(d), alpha=0.85)
        axes[1].bar([j + 0.2], [s], 0.4, color=color(d), alpha=0.45, hatch="//")
        perf.append({"design": d, "cache_vs_standard": c, "decode_vs_standard": s})
    axes[1].set_xticks(range(len(labels)), [LABELS.get(d, d) for d in labels], fontsize=8)
    axes[1].set_ylabel("relative to standard (×)")
    axes[1].set_title("solid: KV-cache bytes/token · hatched: decode tokens/s", fontsize=9)
    df = pd.concat([pd.DataFrame(rows).assign(panel="quality"), pd.DataFrame(perf).assign(panel="cost")])
    return _save(fig, df, out, "q3_kv", "K = V: what it costs and what it saves",
                 "Left: exp(Δ val loss) − 1, ± 95% CI over seeds (filled: equal width, open: "
                 "parameter-matched); dash-dot: published reference. Right: one interleaved "
                 "measurement, batch-1 greedy decoding.")


FIGURES = {"q1": [fig_q1_loss, fig_q1_scale, fig_q1_convex],
           "q2": [fig_q2_tasks, fig_q2_own, fig_q2_pretrained, fig_q2_emergence],
           "q3": [fig_q3_bind, fig_q3_kv]}


def all_figures(data: dict, out: Path) -> dict[str, list[Figure]]:
    """Draw every figure into ``out``; per question the figures that had data."""
    with plt.rc_context(STYLE):
        return {q: [f for f in (fn(data, out) for fn in fns) if f is not None]
                for q, fns in FIGURES.items()}
