"""The pretrained zoo in words: Q2's sentences on the heads of the largest model and on the
zoo's causal decoders beside the published values. Reads ``compute.zoo.zoo_table``; a published
value is set only beside the statistic it was measured as (the median over layers of the
whole-layer symmetry), named with its checkpoint and labelled "same family" unless the zoo holds
that very checkpoint.
"""

from __future__ import annotations

import pandas as pd

from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.compute.zoo import zoo_table
from qkvlab.studies.qkv.plan.references import (
    PUBLISHED_BY_NAME,
    PUBLISHED_DECODERS,
    SAPONATI_CITE,
    SAPONATI_MEASURE,
)

LARGE_D_HEAD = 100  # "100×100 heads of a large model": d_head at least this
CAUSAL_FAMILIES = ("llama", "qwen2", "gemma3")  # the zoo's causal LMs (gemma3 also has an encoder)
# Why the ≈0 Saponati et al. list for Llama-3 and Mistral decoders is no reference (DEVELOPERS.md).
ARTIFACT = ("the ≈0 they list for Llama-3-8B and Mistral-7B is not set beside it: their code "
            "pairs GQA query head h with key head h mod n_kv instead of h // n_rep, and built "
            "Llama-3-8B from its config without loading weights")


def published_text(r) -> str:
    """'Llama-2-7B 0.12, same family' for a zoo_table row, '' without a published value."""
    if not isinstance(r.get("published_model"), str) or pd.isna(r.get("published")):
        return ""
    return f"{r['published_model']} {r['published']:g}, {r['published_match']}"


def large_heads(data: StudyData) -> str:
    """Q2's direct answer on d_head ≥ 100 heads of a large model: the largest such model's
    per-head and whole-layer symmetry and its overlaps, each beside its random null."""
    df = zoo_table(data)
    df = df[(df.d_head >= LARGE_D_HEAD)]
    if df.empty:
        return ""
    big = df[df.params == df.params.max()]
    role = big.role.iloc[0]
    by = big[big.role == role].set_index("measure")
    if "symmetry" not in by.index:
        return ""
    h = by.loc["symmetry"]

    def vs(m: str, name: str) -> str:
        r = by.loc[m]
        return f"{name} {r['mean']:.3f} (null {r['null_mean']:.3f})"

    parts = [vs(m, n) for m, n in ((SAPONATI_MEASURE, "whole layer, median over layers"),
                                   ("symmetry_layer", "whole layer, mean"),
                                   ("overlap_qk", "Q–K"), ("overlap_kv", "K–V"),
                                   ("overlap_qv", "Q–V"))
             if m in by.index]
    above = f"{100 * h['share_above_null']:.0f}% of them above the null's 95% range"
    pub = published_text(by.loc[SAPONATI_MEASURE]) if SAPONATI_MEASURE in by.index else ""
    ref = f" (published median: {pub}; {SAPONATI_CITE})" if pub else ""
    return (f"Do the {h['n_heads']:.0f} d_head×d_head = {by.d_head.iloc[0]}×{by.d_head.iloc[0]} "
            f"heads of a large model ({big.title.iloc[0]}, {big.params.iloc[0] / 1e9:.1f} B "
            f"parameters, {role}) learn W_Q ≈ W_K? Not in the sense tying would impose: "
            f"per-head symmetry s = {h['mean']:.3f} against a random null of "
            f"{h['null_mean']:+.3f} ± {h['null_std']:.3f} sd "
            f"({above}), far from tied Q=K's s = 1; " + ", ".join(parts) + ref + ".")


def decoders_vs_published(data: StudyData) -> str:
    """Q2's sentence on the zoo's causal decoders: the median over layers of their whole-layer
    symmetry (Saponati et al.'s statistic) beside its null and, one to one, the published value
    of the same checkpoint or family; GPT-2's and Llama-2-7B's published medians for scale, the
    encoders' range, and what the zoo's size range can and cannot say."""
    df = zoo_table(data)
    lay = df[df.measure == SAPONATI_MEASURE]
    dec = lay[(lay.role == "decoder") & lay.family.isin(CAUSAL_FAMILIES)]
    if dec.empty:
        return ""

    def one(r) -> str:
        pub = published_text(r)
        return f"{r['title']} {r['mean']:.3f}" + (f" (published {pub})" if pub else "")

    vals = ", ".join(one(r) for r in dec.to_dict("records"))
    above = (dec["mean"] > dec.null_hi).all()
    enc = lay[lay.role == "encoder"]
    enc_text = (f"; the zoo's encoders range {enc['mean'].min():.2f}–{enc['mean'].max():.2f}"
                if not enc.empty else "")
    trend = []
    for fam, g in dec.groupby("family"):
        if len(g) > 1:
            g = g.sort_values("params")
            trend.append(f"within {fam}, " + " → ".join(
                f"{r.mean:.3f} at {r.params / 1e9:.1f} B" for r in g.itertuples()))
    others = ", ".join(f"{p.name} {p.value:g} ({p.note})" for p in
                       (PUBLISHED_BY_NAME[n] for n in PUBLISHED_DECODERS))
    return (f"Causal decoders of the zoo, whole-layer symmetry, median over layers (the statistic "
            f"published by {SAPONATI_CITE}): {vals} (random nulls ≤ {dec.null_hi.max():.3f}; "
            f"{'every one above' if above else 'not all above'} its null's 95% range){enc_text}. "
            f"Published causal decoders, same statistic: {others}; {ARTIFACT} "
            f"(DEVELOPERS.md). The zoo stops at {dec.params.max() / 1e9:.1f} B parameters, so it "
            f"cannot say how a decoder's symmetric part moves with scale"
            + (f" ({'; '.join(trend)})" if trend else "")
            + "; what it shows is that decoders up to that size keep a small symmetric part of "
            "W_QK, far from tied Q=K's 1" + (", below every encoder's" if not enc.empty and
                                             dec["mean"].max() < enc["mean"].min() else "")
            + ".")
