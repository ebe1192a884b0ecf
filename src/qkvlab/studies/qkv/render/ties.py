"""What a tie costs a trained decoder, in words: the tie-cost sentences of Q2 (Q=K, Q=K=V)
and Q3 (K=V, GQA), and the short forms of perplexities and refusals the table and the figure
share. Reads ``compute.ties.tie_costs``.
"""

from __future__ import annotations

import re

from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.compute.ties import tie_costs

TIE_LABELS = {"none": "untied", "kv": "K=V", "qk": "Q=K", "qkv": "Q=K=V",
              "gqa": "GQA (kv heads mean-pooled to 1)"}


def why_refused(reason: str) -> str:
    """The architectural reason inside a ``TieRefused`` message, without the option lists:
    "its q/k RMSNorms make Q=K a nonlinear fit", "the model already has a single kv head (MQA)"."""
    m = re.search(r"\((its [^)]*)\)", reason)
    if m:
        return m.group(1)
    return reason.split(": ", 1)[-1].split(";")[0].rstrip(".")


def ppl_text(ppl: float) -> str:
    """A perplexity to 4 significant digits, thousands as whole numbers (12,289, not 1.229e+04)."""
    return f"{ppl:,.0f}" if ppl >= 1000 else f"{ppl:.4g}"


def ppl_change(pct: float) -> str:
    """+38% below 100%, ×6.2 above (perplexity ratios of thousands read better as factors)."""
    if pct < 100:
        return f"{pct:+.0f}%"
    factor = 1 + pct / 100
    return f"×{factor:,.0f}" if factor >= 100 else f"×{factor:.3g}"


def tie_cost_sentence(data: StudyData, kinds: tuple[str, ...]) -> str:
    """Per model, what imposing each tie of ``kinds`` on every layer of a trained decoder does to
    its held-out perplexity zero-shot (uptraining a tie is ``qkvlab convert``'s, in its own
    section), the one-layer-at-a-time spread where measured, and the ties its architecture
    refuses."""
    tc = tie_costs(data)
    if tc.empty:
        return ""
    allx = tc[(tc.layers.astype(str) == "all")]
    parts = []
    for model, g in allx.groupby("model", sort=False):
        base = g[(g.tie == "none") & (g.stage == "zero-shot")]
        if base.empty:
            continue
        b = base.iloc[0]
        bits = []
        for kind in kinds:
            k = g[g.tie == kind]
            if k.empty:
                continue
            if (k.stage == "refused").any():
                bits.append(f"{TIE_LABELS[kind]} not possible ({why_refused(k.reason.iloc[0])})")
                continue
            z = k[k.stage == "zero-shot"].iloc[0]
            text = f"{TIE_LABELS[kind]} {ppl_text(z.ppl)} ({ppl_change(z.pct)})"
            one = tc[(tc.model == model) & (tc.tie == kind) & (tc.layers.astype(str) != "all")
                     & (tc.stage == "zero-shot")]
            if not one.empty:
                text += (f"; one layer at a time: median {ppl_change(one.pct.median())}, "
                         f"{(one.pct < 1).sum()} of {len(one)} layers under +1%, worst "
                         f"{ppl_change(one.pct.max())} "
                         f"(layer {one.loc[one.pct.idxmax(), 'layers']})")
            bits.append(text)
        if bits:
            parts.append(f"{b.title} (perplexity {ppl_text(b.ppl)}): " + "; ".join(bits))
    if not parts:
        return ""
    first = allx.iloc[0]
    return ("Imposed zero-shot on a trained decoder (nothing trained after the tie), every "
            "layer at once by its best fit on real activations "
            f"({int(first.calib_tokens):,} calibration tokens), held-out Bible "
            f"perplexity on {int(first.eval_tokens):,} tokens of chapters no fit has read: "
            + " | ".join(parts) + "."
            + " A retrofit measures how much the trained weights rely on what the tie removes; "
            "it is not the price of a model trained tied from the start (the comparisons above).")
