"""The pretrained zoo as the study reads it: one row per model × role × measure, from the stored
``pretrained`` measures (mean over heads beside the random null), with the manifest's
architecture facts (family, parameter count, d_head) and, on the row of the statistic they
publish (symmetry_layer_median), the value Saponati et al. published for the same checkpoint or,
labelled so, for the same family (``plan.references.published_match``; reference only, never
measured here).
"""

from __future__ import annotations

from functools import cache

import pandas as pd

from qkvlab.analysis.zoo import ZooModel, load_manifest
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.plan.references import SAPONATI_MEASURE, published_match

# Drawn in this order; symmetry_layer scores the whole layer's W_QK (heads summed), its mean
# over layers; symmetry_layer_median its median over layers, the statistic Saponati et al.
# publish (its `mean` column holds the median, `n_heads` the layers).
MEASURES = (SAPONATI_MEASURE, "symmetry_layer", "symmetry", "overlap_qk", "overlap_kv",
            "overlap_qv")
COLUMNS = ["model", "title", "family", "role", "params", "d_head", "measure", "mean", "null_mean",
           "null_std", "null_lo", "null_hi", "share_above_null", "n_heads", "published_model",
           "published", "published_match", "published_checkpoint"]


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
    match = [published_match(n, f, r) if m == SAPONATI_MEASURE else None
             for n, f, r, m in zip(df.model, df.family, df.role, df.measure)]
    df["published_model"] = [x[0].name if x else None for x in match]
    df["published"] = [x[0].value if x else None for x in match]
    df["published_match"] = [x[1] if x else None for x in match]
    df["published_checkpoint"] = [x[0].checkpoint if x else None for x in match]
    order = {m: i for i, m in enumerate(MEASURES)}
    df = df.assign(_o=df.measure.map(order)).sort_values(["params", "model", "role", "_o"])
    return df[COLUMNS].reset_index(drop=True)
