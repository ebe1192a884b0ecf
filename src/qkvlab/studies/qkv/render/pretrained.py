"""The pretrained zoo in words: Q2's sentences on the heads of the largest model and on the
zoo's causal decoders beside the published values. Reads ``compute.zoo.zoo_table``.
"""

from __future__ import annotations

import pandas as pd

from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.compute.zoo import zoo_table

LARGE_D_HEAD = 100  # "100×100 heads of a large model": d_head at least this
CAUSAL_FAMILIES = ("llama", "qwen2", "gemma3")  # the zoo's causal LMs (gemma3 also has an encoder)


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

    parts = [vs(m, n) for m, n in (("symmetry_layer", "whole layer"), ("overlap_qk", "Q–K"),
                                   ("overlap_kv", "K–V"), ("overlap_qv", "Q–V"))
             if m in by.index]
    above = f"{100 * h['share_above_null']:.0f}% of them above the null's 95% range"
    pub = by.loc["symmetry_layer", "published"] if "symmetry_layer" in by.index else None
    pub_model = by.loc["symmetry_layer", "published_model"] if pub is not None else None
    ref = (f"; {pub_model}, measured by {data.published_source}, {pub:.2f}"
           if pub is not None and pd.notna(pub) else "")
    return (f"Do the {h['n_heads']:.0f} d_head×d_head = {by.d_head.iloc[0]}×{by.d_head.iloc[0]} "
            f"heads of a large model ({big.title.iloc[0]}, {big.params.iloc[0] / 1e9:.1f} B "
            f"parameters, {role}) learn W_Q ≈ W_K? Not in the sense tying would impose: "
            f"per-head symmetry s = {h['mean']:.3f} against a random null of "
            f"{h['null_mean']:+.3f} ± {h['null_std']:.3f} sd "
            f"({above}), far from tied Q=K's s = 1; " + ", ".join(parts) + ref + ".")


def decoders_vs_published(data: StudyData) -> str:
    """Q2's sentence on the zoo's causal decoders against the published decoder values: where
    they sit beside their null, GPT-2's value and the ≈0 of the 7-8 B decoders, with the
    encoders' range for scale, and what the zoo's size range can and cannot say."""
    df = zoo_table(data)
    lay = df[df.measure == "symmetry_layer"]
    dec = lay[(lay.role == "decoder") & lay.family.isin(CAUSAL_FAMILIES)]
    if dec.empty:
        return ""
    pub = data.published
    vals = ", ".join(f"{r.title} {r.mean:.3f}" for r in dec.itertuples())
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
    big = ", ".join(f"{m} {pub[m]:.2f}" for m in ("Llama-3-8B", "Mistral-7B") if m in pub)
    gpt2 = f"GPT-2's published {pub['GPT-2']:.2f}" if "GPT-2" in pub else ""
    return (f"Causal decoders of the zoo, whole-layer symmetry: {vals} (random nulls ≤ "
            f"{dec.null_hi.max():.3f}; {'every one above' if above else 'not all above'} its "
            f"null's 95% range){enc_text}. They sit with {gpt2} (124 M parameters), not at the ≈0 "
            f"published for the 7–8 B decoders ({big}; {data.published_source}). The zoo stops "
            f"at {dec.params.max() / 1e9:.1f} B parameters, so it cannot say whether a decoder's "
            f"symmetric part vanishes with scale" + (f" ({'; '.join(trend)})" if trend else "")
            + "; what it shows is that decoders up to that size keep a small symmetric part of "
            "W_QK, far from tied Q=K's 1" + (", below every encoder's" if not enc.empty and
                                             dec["mean"].max() < enc["mean"].min() else "")
            + ".")
