"""What a tie costs the zoo's trained decoders, as the study reads it: the stored ``tie_cost``
records (``qkvlab.hf.cost``) of the profile's sizes, with each model's title and the change in
perplexity.

Used by the tie-cost table (``page``), the per-layer figure (``figures_zoo``) and the verdicts.
"""

from __future__ import annotations

import math
from dataclasses import asdict

import pandas as pd

from qkvlab.studies.qkv.plan.vocab import ppl_pct
from qkvlab.hf.cost import VERSION
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.compute.zoo import manifest

def tie_costs(data: StudyData) -> pd.DataFrame:
    """Records of the current ``tie_cost`` version measured at the profile's sizes (every stored
    size when the profile measures none, e.g. rows a user stored with ``qkvlab tiecost``), with
    ``title`` (the zoo's name of the model) and ``pct`` (Δ perplexity in %). Zero-shot and
    refused records only: a "healed" record (tiecost healed before version 5; uptraining is
    ``qkvlab convert``'s now) is never shown, whatever version it carries."""
    tc = data.measure("tie_cost")
    if tc.empty or "spec.version" not in tc or "stage" not in tc:
        return pd.DataFrame()
    tc = tc[(tc["spec.version"] == VERSION) & tc.stage.isin(("zero-shot", "refused"))]
    cfg = getattr(data.profile, "tie_cost", None)
    if cfg is not None:
        for k, v in asdict(cfg).items():
            col = f"spec.{k}"
            if col not in tc:
                return pd.DataFrame()
            stored = tc[col].map(lambda x: tuple(x) if isinstance(x, list) else x)  # JSON lists
            tc = tc[stored.map(lambda x: x == v)]
    if tc.empty:
        return pd.DataFrame()
    models = manifest()
    tc = tc.assign(title=[models[m].title if m in models else m for m in tc.model],
                   params=[models[m].params if m in models else math.nan for m in tc.model])
    if "delta_nll" in tc:
        tc = tc.assign(pct=tc.delta_nll.map(ppl_pct))
    return tc.sort_values(["params", "model"], kind="stable").reset_index(drop=True)
