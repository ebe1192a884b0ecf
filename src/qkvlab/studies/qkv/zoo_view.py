"""The pretrained zoo as the study reads it: one row per model × role × measure, from the stored
``pretrained`` measures (mean over heads beside the random null), with the manifest's
architecture facts (family, parameter count, d_head) and, where a family matches, the value
Saponati et al. published (reference only, never measured here).

Used by the zoo figure (``figures_zoo``) and by Q2's sentence on large heads (``large_heads``).
"""

from __future__ import annotations

from functools import cache

import pandas as pd

from qkvlab.analysis.zoo import ZooModel, load_manifest
from qkvlab.studies.qkv.results import StudyData

# Drawn in this order; symmetry_layer scores the whole layer's W_QK (heads summed), the
# quantity Saponati et al. publish.
MEASURES = ("symmetry_layer", "symmetry", "overlap_qk", "overlap_kv", "overlap_qv")
MEASURE_LABELS = {"symmetry_layer": "symmetry s of W_QK, whole layer",
                  "symmetry": "symmetry s of W_QK, per head",
                  "overlap_qk": "Q–K subspace overlap", "overlap_kv": "K–V subspace overlap",
                  "overlap_qv": "Q–V subspace overlap"}
# (family, role) -> the published model it is compared with. MPNet is BERT-base's size and
# objective family; every causal decoder against the decoders Saponati et al. measured (≈0).
PUBLISHED_MATCH = {("bert", "encoder"): "BERT-base", ("mpnet", "encoder"): "BERT-base",
                   ("llama", "decoder"): "Llama-3-8B", ("qwen2", "decoder"): "Llama-3-8B",
                   ("gemma3", "decoder"): "Llama-3-8B"}
COLUMNS = ["model", "title", "family", "role", "params", "d_head", "measure", "mean", "null_mean",
           "null_std", "null_lo", "null_hi", "share_above_null", "n_heads", "published_model",
           "published"]
LARGE_D_HEAD = 100  # "100×100 heads of a large model": d_head at least this
CAUSAL_FAMILIES = ("llama", "qwen2", "gemma3")  # the zoo's causal LMs (gemma3 also has an encoder)


@cache
def manifest() -> dict[str, ZooModel]:
    return load_manifest()


def zoo_table(data: StudyData) -> pd.DataFrame:
    """Summary rows of every stored ``pretrained`` measure whose source is a zoo model, in
    ``COLUMNS`` order, sorted by parameter count; empty when none is stored."""
    pt = data.measure("pretrained")
    if pt.empty or "level" not in pt:
        return pd.DataFrame(columns=COLUMNS)
    s = pt[(pt.level == "summary") & pt.measure.isin(MEASURES)]
    s = s.rename(columns={"spec.source": "model"})
    models = manifest()
    s = s[s.model.isin(list(models))]
    if s.empty:
        return pd.DataFrame(columns=COLUMNS)
    facts = pd.DataFrame([{"model": m.name, "title": m.title, "family": m.family,
                           "params": m.params, "d_head": m.d_head} for m in models.values()])
    df = s.merge(facts, on="model", how="left")
    df["published_model"] = [PUBLISHED_MATCH.get((f, r)) if m == "symmetry_layer" else None
                             for f, r, m in zip(df.family, df.role, df.measure)]
    df["published"] = [data.published.get(p) if p else None for p in df.published_model]
    order = {m: i for i, m in enumerate(MEASURES)}
    df = df.assign(_o=df.measure.map(order)).sort_values(["params", "model", "role", "_o"])
    return df[COLUMNS].reset_index(drop=True)


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
            f"{dec.null_hi.max():.3f}; {'every one above' if above else 'not all above'} its null's "
            f"95% range){enc_text}. They sit with {gpt2} (124 M parameters), not at the ≈0 "
            f"published for the 7–8 B decoders ({big}; {data.published_source}). The zoo stops "
            f"at {dec.params.max() / 1e9:.1f} B parameters, so it cannot say whether a decoder's "
            f"symmetric part vanishes with scale" + (f" ({'; '.join(trend)})" if trend else "")
            + "; what it shows is that decoders up to that size keep a small symmetric part of "
            "W_QK, far from tied Q=K's 1" + (", below every encoder's" if not enc.empty and
                                             dec["mean"].max() < enc["mean"].min() else "")
            + ".")
