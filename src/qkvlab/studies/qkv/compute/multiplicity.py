"""Each question's family of headline comparisons (``plan.questions``), corrected together.

``correct(comparisons)`` adds four columns to the comparison rows: ``family`` (the
question, None outside the families), ``family_m`` (how many comparisons the family holds at
this profile), ``p_decided`` (the p of the test that decided the raw verdict: the TOST's for
equivalent, the two-sided paired t-test's for worse/better, the smaller for undecided) and
``p_adj`` (Holm's adjusted p over the family). ``effects.effect`` reads them: a raw verdict
whose adjusted p exceeds ``ALPHA`` reads undecided ("not significant after Holm"), with the raw
verdict and p beside it.
"""

from __future__ import annotations

import pandas as pd

from qkvlab.stats import holm
from qkvlab.studies.qkv.compute.effects import effect, finite
from qkvlab.studies.qkv.plan.families import Headline
from qkvlab.studies.qkv.plan.questions import families

CORRECTIONS = {"holm": holm}
COLUMNS = ("family", "family_m", "p_decided", "p_adj")


def members(df: pd.DataFrame, h: Headline) -> pd.DataFrame:
    """The comparison rows of one headline comparison (none if the profile does not run it)."""
    want = {"experiment": h.experiment, "design": h.design, "task": h.task, "arm": h.arm,
            "metric": h.metric}
    if df.empty or any(k not in df for k in want):
        return df.iloc[0:0]
    for k, v in want.items():
        df = df[df[k] == v]
    if h.d_head is not None:
        df = df[df.d_head == h.d_head] if "d_head" in df else df.iloc[0:0]
    if h.init is not None:
        df = df[df.init == h.init] if "init" in df else df.iloc[0:0]
    if h.widest_m and "m" in df and "d_head" in df and not df.empty:
        df = df[(df.m == df.m.max()) & (df.d_head == df.m)]
    return df


def correct(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (``results.comparisons``) with the ``COLUMNS`` of each family's correction.
    A member that reads "not learned" is tested all the same (``effect`` without a chance
    level) and counts in m: leaving it out would pick the family after seeing the runs.

    Raises:
        ValueError: a family names a correction other than ``CORRECTIONS``.
    """
    df = df.copy()
    if df.empty:
        return df
    df["family"], df["family_m"] = None, float("nan")
    df["p_decided"], df["p_adj"] = float("nan"), float("nan")
    for fam in families().values():
        if fam.method not in CORRECTIONS:
            raise ValueError(f"method: {fam.method!r} of {fam.question} is not one of "
                             f"{sorted(CORRECTIONS)}")
        idx, ps = [], []
        for h in fam.members:
            for i, row in members(df, h).iterrows():
                p = effect(row.to_dict()).p
                if finite(p):
                    idx.append(i)
                    ps.append(p)
        if not idx:
            continue
        df.loc[idx, "family"] = fam.question
        df.loc[idx, "family_m"] = len(idx)
        df.loc[idx, "p_decided"] = ps
        df.loc[idx, "p_adj"] = CORRECTIONS[fam.method](ps)
    return df
