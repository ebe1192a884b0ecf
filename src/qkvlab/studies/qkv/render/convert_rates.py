"""The conversion's rate table: the rates ``qkvlab convert --lr-grid`` tried on the stdlib's val
files and the one (and the W_O basis) chosen. Reads the store's ``convert_lr`` measures;
decides nothing.
"""

from __future__ import annotations

import math

import numpy as np

from qkvlab.report.blocks import Block, Table
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.render.convert import SHORT, _title, tie_label
from qkvlab.studies.qkv.render.ties import ppl_text

# which val rows each version of ``hf.rate``'s choice scored (1 did not extend its grid: left out)
VAL_TEXT = {2: "first files", 3: "spread over the split"}


def _val_ppl(nll: float) -> str:
    """A perplexity, or e^nll where it overflows a float (a rate that blew up but stayed finite)."""
    return ppl_text(math.exp(nll)) if nll < 700 else f"e^{nll:,.0f}"


def rate_blocks(data: StudyData) -> list[Block]:
    """The rates ``qkvlab convert --lr-grid`` tried, each uptraining a fresh student for the
    first budget (or ``--lr-tokens``) and scored on the stdlib's val files, and the one chosen,
    by the versions of ``hf.rate`` since the grid extends past its edge (``VAL_TEXT``: which
    val rows each read); nothing where no grid ran."""
    df = data.measure("convert_lr")
    if df.empty or "spec.version" not in df:
        return []
    df = df[df["spec.version"].isin(VAL_TEXT)].copy()
    if "spec.uptrain.o_basis" in df:  # a grid in W_O's untied basis: its own start, as curves
        df.loc[df["spec.uptrain.o_basis"] == "untied", "spec.start"] = "fitted_wo"
    df = df.sort_values(
        ["spec.model", "spec.tie", "spec.start", "spec.version", "spec.tokens", "lr"],
        ascending=[True, True, True, True, True, False], kind="stable").reset_index(drop=True)
    df["mark"] = np.where(df["chosen"].astype(bool), "chosen", "")
    # where both W_O bases chose a rate on the same val text (hf.rate.choose), the one that
    # read val better is the basis chosen too
    both = df[df["chosen"].astype(bool) & df["spec.start"].isin(["fitted", "fitted_wo"])]
    for _, g in both.groupby(["spec.model", "spec.tie", "spec.version", "spec.tokens"]):
        if g["spec.start"].nunique() == 2:
            df.loc[g.index, "mark"] = "chosen in its basis"
            df.loc[g["val_nll"].astype(float).idxmin(), "mark"] = "chosen, basis too"
    rows = tuple((_title(r["spec.model"]), tie_label(r["spec.tie"]),
                  SHORT.get(r["spec.start"], r["spec.start"]), f"{r['spec.tokens']:,}",
                  VAL_TEXT[r["spec.version"]], f"{r['lr']:.2g}",
                  "diverged" if r["diverged"] else _val_ppl(r["val_nll"]),
                  r["mark"]) for r in df.to_dict("records"))
    return [Table("The uptraining rate, chosen on validation text: each rate of the grid (and "
                  "past a chosen edge) uptrains a fresh student from the start for the tokens "
                  "shown; per-token perplexity on the stdlib's val files (the test files are "
                  "never read for it); where the fitted start ran a grid in each W_O basis, the "
                  "basis whose chosen rate read val better is chosen too",
                  ("model", "tie", "start", "tokens", "val rows", "rate", "val perplexity", ""),
                  rows)] if rows else []
