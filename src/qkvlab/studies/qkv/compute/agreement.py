"""Two profiles' verdicts, cell by cell: does a cheaper profile ever decide a cell the other way?

A report writes its comparison rows with each row's final verdict (``with_verdicts``: after
Holm over the question's family and the attention-free control's gate, as every table of the
report reads it) to ``comparisons.csv``. ``agreement`` pairs two such files on the cell's
tags (experiment, task, metric, arm, m, d_head, d_model, design) and says for each cell how
the two verdicts relate (``Relation``). Decided means worse, better or equivalent; a cell two
profiles both decide, differently, *contradicts*: the quick profile must never print a verdict
the standard one decides otherwise (#28). Cells only one profile runs are left out.
"""

from __future__ import annotations

import math
from enum import Enum
from pathlib import Path

import pandas as pd

from qkvlab.studies.qkv.compute.effects import Status, effect
from qkvlab.studies.qkv.compute.results import GROUP_BY, StudyData, row_chance
from qkvlab.studies.qkv.plan.vocab import TASK_METRIC, metric_of

DECIDED = frozenset({Status.WORSE.value, Status.BETTER.value, Status.EQUIVALENT.value})
KEYS = ("experiment", "task", "metric", *(k for k in GROUP_BY if k != "task"), "design")
VERDICT_COLUMNS = ("verdict", "raw_verdict", "effect", "effect_half", "effect_unit")
CSV = "comparisons.csv"


class Relation(str, Enum):
    """How two verdicts on one cell relate, in the order ``agreement`` lists them."""

    CONTRADICT = "contradicts"  # both decide, differently
    ONLY_A = "only A decides"
    ONLY_B = "only B decides"
    AGREE = "agree"  # both decide, the same way
    NEITHER = "neither decides"


def with_verdicts(data: StudyData) -> pd.DataFrame:
    """``data.comparisons`` with ``VERDICT_COLUMNS``: each row's verdict as the report words it
    (``effect``, on the task's own metric with its chance level at this profile: a throughput
    or chrF row has no "not learned"), the verdict before Holm and the control's gate, and the
    effect (value, half 95% CI, unit) people quote."""
    df = data.comparisons
    cols: dict[str, list] = {c: [] for c in VERDICT_COLUMNS}
    if df.empty:  # a profile without comparison rows (scaling's): the columns, no rows
        return df.iloc[0:0].assign(**cols)
    for r in df.to_dict("records"):
        own = r.get("metric") == TASK_METRIC.get(r.get("task"), "val_loss")
        e = effect(r, chance=row_chance(r, data.profile) if own else None)
        for c, v in zip(VERDICT_COLUMNS, (e.status.value, (e.raw_status or e.status).value,
                                          e.value, e.half, e.unit)):
            cols[c].append(v)
    return df.assign(**cols)


def read_verdicts(report_dir: str | Path) -> pd.DataFrame:
    """The verdict rows a report wrote (``report_dir/comparisons.csv``).

    Raises:
        ValueError: no such file, or one without the verdict columns (a report written before
            they were stored: re-run ``qkvlab study`` for its profile, which re-reads the store
            and trains nothing it holds).
    """
    path = Path(report_dir) / CSV
    if not path.is_file():
        raise ValueError(f"{path}: no such file (a report directory such as reports/quick "
                         f"holds {CSV})")
    df = pd.read_csv(path)
    missing = [c for c in ("verdict", *KEYS[:3]) if c not in df]
    if missing:
        raise ValueError(f"{path}: no column {', '.join(missing)}; write the report again with "
                         f"this version (`qkvlab study --profile P` re-reads the store)")
    return df


def _key(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Key columns made comparable across files: a missing tag is "", numbers as integers
    where whole (d_head 16 and 16.0 are one cell)."""
    out = df.copy()
    for k in keys:
        col = out[k] if k in out else pd.Series([""] * len(out), index=out.index)
        out[k] = col.map(lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v))
                         else str(int(v)) if isinstance(v, float) and v.is_integer() else str(v))
    return out


def learned(metric: str) -> bool:
    """Whether a metric is a quality the model learns (``Metric.gated``), not a throughput."""
    row = metric_of(metric)
    return row is not None and row.gated


def relation(a: str, b: str) -> Relation:
    da, db = a in DECIDED, b in DECIDED
    if da and db:
        return Relation.AGREE if a == b else Relation.CONTRADICT
    return Relation.ONLY_A if da else Relation.ONLY_B if db else Relation.NEITHER


def agreement(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """One row per cell both verdict frames hold on a learned metric (standard's rows against
    itself, "missing" in both, and throughput, measured on whatever machine ran it, left
    out): its tags, ``verdict_a``/``verdict_b``, ``effect_a``/``effect_b``
    (with ``effect_half_*``, ``effect_unit_*``) and ``relation`` (a ``Relation`` value), in
    ``Relation``'s order."""
    keys = [k for k in KEYS if k in a or k in b]
    cols = [c for c in VERDICT_COLUMNS if c in a and c in b]
    m = _key(a, keys)[keys + cols].merge(_key(b, keys)[keys + cols], on=keys,
                                         suffixes=("_a", "_b"))
    m = m[(m.verdict_a != Status.MISSING.value) | (m.verdict_b != Status.MISSING.value)]
    m = m[m.metric.map(learned)]  # a throughput verdict is the machine's, not the design's
    if m.empty:
        return m.assign(relation=pd.Series(dtype=str))
    m["relation"] = [relation(x, y).value for x, y in zip(m.verdict_a, m.verdict_b)]
    order = {r.value: i for i, r in enumerate(Relation)}
    m = m.assign(_o=m.relation.map(order)).sort_values(["_o", *keys], kind="stable")
    return m.drop(columns="_o").reset_index(drop=True)
