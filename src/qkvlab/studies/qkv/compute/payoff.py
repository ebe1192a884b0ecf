"""Q3's payoff curve as frames: the study's own decode measurement (measure ``kv_decode``) or,
where one exists for the same CPU, the newest ``qkvlab bench --only kv`` record in its place,
and how far the two agree where both measured."""

from __future__ import annotations

import pandas as pd

from qkvlab.studies.qkv.compute.results import StudyData

KV_COLUMNS = ["context", "batch", "design", "kernel", "tokens_per_s", "tokens_per_s_sdpa",
              "ratio", "cache_bytes", "cache_share", "bound_tokens_per_s"]


def _kv_study(data: StudyData) -> pd.DataFrame:
    """The study's own kv_decode rows: the current method's record (one naming its CPU) first
    at this profile; empty where none was measured."""
    kv = data.measure("kv_decode")
    if kv.empty or "context" not in kv:
        return pd.DataFrame()
    if "spec.cpu_model" in kv and kv["spec.cpu_model"].notna().any():
        kv = kv[kv["spec.cpu_model"].notna()]  # the current method's, not an older record
    return kv[kv.measure_id == kv.measure_id.iloc[0]]


def _kv_bench(data: StudyData, kv: pd.DataFrame) -> pd.DataFrame:
    """The newest ``kv_bench`` record's rows taken on the CPU of the study's rows ``kv``, its
    layouts the study measures only (the bench's rotary pair left out); empty where none."""
    bench = data.measure("kv_bench")
    cpu = kv["spec.cpu_model"].iloc[0] if "spec.cpu_model" in kv else None
    if cpu is None or bench.empty or "spec.cpu_model" not in bench:
        return pd.DataFrame()
    mine = bench[(bench["spec.cpu_model"] == cpu) & (bench["spec.device"] == "cpu")]
    if mine.empty:
        return mine
    newest = mine[mine["spec.taken"] == mine["spec.taken"].max()]
    newest = newest[newest.measure_id == newest.measure_id.iloc[0]]
    return newest[newest.design.isin(set(kv.design))]


def kv_payoff(data: StudyData) -> pd.DataFrame:
    """Q3's payoff curve, one row per context, batch and cache layout: the newest
    ``qkvlab bench --only kv`` record (measure ``kv_bench``) taken on the CPU the study's own
    kv_decode measurement ran on, where one exists (a longer grid, measured on its own, not a
    second noisier measurement; its rows of layouts the study does not measure, such as the
    bench's rotary pair, left out), else the study's kv_decode records (the first at this
    profile). ``source`` says which (``bench``: with ``taken`` and ``threads``)."""
    kv = _kv_study(data)
    if kv.empty:
        return kv
    newest = _kv_bench(data, kv)
    if not newest.empty:
        return newest[KV_COLUMNS].assign(source="bench", taken=newest["spec.taken"],
                                         threads=newest["spec.threads"]).reset_index(drop=True)
    return kv[KV_COLUMNS].assign(source="study").reset_index(drop=True)


KV_AGREE = 0.15  # #40: the study's payoff ratios agree with the bench's within 15%


def kv_agreement(data: StudyData) -> pd.DataFrame:
    """Where the study's own kv_decode record and the bench record :func:`kv_payoff` draws in
    its place both hold a (context, batch, layout) other than standard: each one's ratio to
    standard (``study``, ``bench``) and ``rel`` = bench / study - 1, ``within`` |rel| <=
    ``KV_AGREE``. Empty where the curve is the study's own or the two share no point."""
    kv = _kv_study(data)
    bench = _kv_bench(data, kv) if not kv.empty else pd.DataFrame()
    if bench.empty:
        return pd.DataFrame()
    key = ["context", "batch", "design"]
    both = kv[key + ["ratio"]].merge(bench[key + ["ratio"]], on=key, suffixes=("_study",
                                                                              "_bench"))
    both = both[both.design != "standard"].rename(columns={"ratio_study": "study",
                                                           "ratio_bench": "bench"})
    both["rel"] = both.bench / both.study - 1
    both["within"] = both.rel.abs() <= KV_AGREE
    return both.sort_values(key).reset_index(drop=True)


def kv_pays(data: StudyData) -> pd.DataFrame:
    """Per cache layout, its ratio to standard at the longest context and largest batch of
    :func:`kv_payoff` (where the cache is the largest share of a step's bytes)."""
    kv = kv_payoff(data)
    if kv.empty:
        return kv
    top = kv[(kv.context == kv.context.max())]
    return top[top.batch == top.batch.max()].set_index("design")
